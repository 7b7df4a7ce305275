-- The compose file's layout: shards 1 and 2, each a primary with a replica; tenants
-- 1..=1000 on shard 1, 1001..=2000 on shard 2. Runs after sql/catalog.sql.
INSERT INTO pgtenant.shard_config (shard_id, region_code, datacenter, min_tenant_id, max_tenant_id)
VALUES (1, 'USA', 'compose-1', 1, 1000), (2, 'USA', 'compose-2', 1001, 2000) ON CONFLICT DO NOTHING;
INSERT INTO pgtenant.shard_node (shard_id, name, host, port, role, priority)
VALUES (1, 'shard1-primary', 'shard1', 5432, 'primary', 0),
       (1, 'shard1-replica', 'shard1-replica', 5432, 'replica', 1),
       (2, 'shard2-primary', 'shard2', 5432, 'primary', 0),
       (2, 'shard2-replica', 'shard2-replica', 5432, 'replica', 1)
ON CONFLICT DO NOTHING;
