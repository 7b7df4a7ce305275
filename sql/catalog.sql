-- pgtenant catalog: the tenant -> shard directory that every proxy instance reads.
-- Idempotent: run it again to upgrade an existing catalog in place.
--
--   psql "dbname=pgtenant_catalog" -f sql/catalog.sql
--
-- Resolution, first match wins:
--   1. a row of tenant_shard_map (explicit placement; tenant_shard_map_text for
--      text tenant keys),
--   2. the shard_config row whose [min_tenant_id, max_tenant_id] holds the tenant
--      (bigint keys only),
--   3. hash groups: FNV-1a (32 bit) of the tenant key's text, modulo
--      routing_state.hash_group_count, looked up in hash_group,
--   4. otherwise the tenant is not placed.
--
-- Every statement that changes routing bumps routing_state.version in the same
-- transaction and sends NOTIFY pgtenant_routing with a JSON payload
-- {"version": N, "table": ..., "tenants": [...] | "all_tenants": true, "at_ms": unix ms};
-- proxies apply it, report the version they serve (SHOW pgtenant.routing_version) and
-- how long after "at_ms" they applied it (the catalog-change lag metric).

-- Re-runs drop and recreate triggers; their "does not exist, skipping" notices are noise.
SET client_min_messages = warning;
CREATE SCHEMA IF NOT EXISTS pgtenant;
SET search_path = pgtenant, public;

CREATE TABLE IF NOT EXISTS routing_state (
    singleton        boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version          bigint  NOT NULL DEFAULT 1,
    -- Groups for hash placement; 0 disables it. Changing it re-homes every hashed tenant.
    hash_group_count integer NOT NULL DEFAULT 0 CHECK (hash_group_count >= 0)
);
INSERT INTO routing_state (singleton) VALUES (true) ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS shard_config (
    shard_id      smallint    PRIMARY KEY CHECK (shard_id BETWEEN 0 AND 1023),
    region_code   char(3)     NOT NULL DEFAULT 'ZZZ',
    datacenter    varchar(32) NOT NULL DEFAULT 'local',
    is_active     boolean     NOT NULL DEFAULT true,
    -- active: routed; draining: routed, but takes no new tenants; disabled: refused.
    status        text        NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'draining', 'disabled')),
    -- Tenants this shard is meant to hold (placement uses it; routing does not).
    capacity      integer     NOT NULL DEFAULT 100000 CHECK (capacity >= 0),
    -- The tenant range of this shard; both NULL for a shard reached only by map or hash.
    min_tenant_id bigint,
    max_tenant_id bigint,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CHECK ((min_tenant_id IS NULL) = (max_tenant_id IS NULL)),
    CHECK (min_tenant_id IS NULL OR min_tenant_id <= max_tenant_id)
);

-- Ranges must not overlap.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'shard_config_ranges_disjoint') THEN
        ALTER TABLE shard_config ADD CONSTRAINT shard_config_ranges_disjoint
            EXCLUDE USING gist (int8range(min_tenant_id, max_tenant_id, '[]') WITH &&)
            WHERE (min_tenant_id IS NOT NULL);
    END IF;
END $$;

-- Where a shard's servers are. Credentials stay in the proxy's configuration.
CREATE TABLE IF NOT EXISTS shard_node (
    shard_id   smallint NOT NULL REFERENCES shard_config (shard_id) ON DELETE CASCADE,
    name       text     NOT NULL,
    host       text     NOT NULL,
    port       integer  NOT NULL DEFAULT 5432 CHECK (port BETWEEN 1 AND 65535),
    -- NULL: the database name the client asked for.
    dbname     text,
    role       text     NOT NULL CHECK (role IN ('primary', 'replica')),
    -- Lower is tried first when the primary fails.
    failover_priority integer NOT NULL DEFAULT 0,
    PRIMARY KEY (shard_id, name)
);
CREATE UNIQUE INDEX IF NOT EXISTS shard_node_one_primary ON shard_node (shard_id) WHERE role = 'primary';

CREATE TABLE IF NOT EXISTS tenant_shard_map (
    tenant_id   bigint      PRIMARY KEY,
    shard_id    smallint    NOT NULL REFERENCES shard_config (shard_id),
    region_code char(3)     NOT NULL DEFAULT 'ZZZ',
    -- active: read and write; read_only: writes refused; moving: writes refused (a move is in progress).
    state       text        NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'read_only', 'moving')),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Tenants whose key is text (proxy.tenant_key = "text") are placed here; ranges do
-- not apply to them, hash groups do.
CREATE TABLE IF NOT EXISTS tenant_shard_map_text (
    tenant_key  text        PRIMARY KEY,
    shard_id    smallint    NOT NULL REFERENCES shard_config (shard_id),
    region_code char(3)     NOT NULL DEFAULT 'ZZZ',
    state       text        NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'read_only', 'moving')),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- A tenant's share of each pool's server connections, for the tenants that need
-- other than the default (weight 1, no cap, no minimum). tenant_key is the key's text
-- (decimal for bigint keys). Proxies follow changes through the NOTIFY below.
CREATE TABLE IF NOT EXISTS tenant_limits (
    tenant_key      text    PRIMARY KEY,
    -- Against the other tenants with work for the same pool.
    weight          integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 10000),
    -- At most this many connections of one pool at once; NULL: no cap of its own.
    max_connections integer CHECK (max_connections >= 1),
    -- While it has work, this many connections of a pool are kept for it.
    min_connections integer NOT NULL DEFAULT 0 CHECK (min_connections >= 0)
);

CREATE TABLE IF NOT EXISTS hash_group (
    group_id integer  PRIMARY KEY CHECK (group_id >= 0),
    shard_id smallint NOT NULL REFERENCES shard_config (shard_id)
);

-- The hash group of a tenant key, as the proxy computes it: FNV-1a (32 bit) of the
-- key's text (decimal for bigint keys), modulo the group count.
CREATE OR REPLACE FUNCTION hash_group_of(tenant_key text, group_count integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT AS $$
    WITH RECURSIVE fnv(i, h) AS (
        SELECT 0, 2166136261::bigint
        UNION ALL
        SELECT i + 1, ((h # get_byte(convert_to(tenant_key, 'UTF8'), i)::bigint) * 16777619) % 4294967296
        FROM fnv WHERE i < octet_length(convert_to(tenant_key, 'UTF8'))
    )
    SELECT (h % group_count)::integer FROM fnv ORDER BY i DESC LIMIT 1
$$;

-- Bumps the routing version once per statement that changed rows, and tells the
-- proxies what changed: the tenants (up to 256), or that they should forget all.
CREATE OR REPLACE FUNCTION notify_routing_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v bigint;
    changed bigint := 0;
    keys text[] := '{}';
    payload jsonb;
BEGIN
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        SELECT changed + count(*) INTO changed FROM new_rows;
    END IF;
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        SELECT changed + count(*) INTO changed FROM old_rows;
    END IF;
    IF changed = 0 THEN
        RETURN NULL;
    END IF;
    UPDATE pgtenant.routing_state SET version = version + 1 RETURNING version INTO v;
    payload := jsonb_build_object('version', v, 'table', TG_TABLE_NAME, 'op', TG_OP,
        'at_ms', floor(extract(epoch FROM clock_timestamp()) * 1000));
    IF TG_TABLE_NAME IN ('tenant_shard_map', 'tenant_shard_map_text') THEN
        IF changed > 256 THEN
            payload := payload || jsonb_build_object('all_tenants', true);
        ELSIF TG_TABLE_NAME = 'tenant_shard_map' THEN
            IF TG_OP IN ('INSERT', 'UPDATE') THEN
                SELECT keys || array_agg(tenant_id::text) INTO keys FROM new_rows;
            END IF;
            IF TG_OP IN ('DELETE', 'UPDATE') THEN
                SELECT keys || array_agg(tenant_id::text) INTO keys FROM old_rows;
            END IF;
            payload := payload || jsonb_build_object('tenants', to_jsonb(keys));
        ELSE
            IF TG_OP IN ('INSERT', 'UPDATE') THEN
                SELECT keys || array_agg(tenant_key) INTO keys FROM new_rows;
            END IF;
            IF TG_OP IN ('DELETE', 'UPDATE') THEN
                SELECT keys || array_agg(tenant_key) INTO keys FROM old_rows;
            END IF;
            payload := payload || jsonb_build_object('tenants', to_jsonb(keys));
        END IF;
    END IF;
    PERFORM pg_notify('pgtenant_routing', payload::text);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION notify_routing_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v bigint;
BEGIN
    UPDATE pgtenant.routing_state SET version = version + 1 RETURNING version INTO v;
    PERFORM pg_notify('pgtenant_routing', jsonb_build_object(
        'version', v, 'table', TG_TABLE_NAME, 'op', TG_OP, 'all_tenants', true,
        'at_ms', floor(extract(epoch FROM clock_timestamp()) * 1000))::text);
    RETURN NULL;
END $$;

-- Changes of routing_state itself (hash_group_count) notify without a second bump.
CREATE OR REPLACE FUNCTION notify_routing_state() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.hash_group_count IS DISTINCT FROM OLD.hash_group_count THEN
        NEW.version := OLD.version + 1;
        PERFORM pg_notify('pgtenant_routing',
            jsonb_build_object('version', NEW.version, 'table', 'routing_state', 'op', 'UPDATE',
                'at_ms', floor(extract(epoch FROM clock_timestamp()) * 1000))::text);
    END IF;
    RETURN NEW;
END $$;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['shard_config', 'shard_node', 'tenant_shard_map', 'tenant_shard_map_text', 'hash_group', 'tenant_limits'] LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON pgtenant.%I', t || '_notify', t);
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON pgtenant.%I', t || '_notify_insert', t);
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON pgtenant.%I', t || '_notify_update', t);
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON pgtenant.%I', t || '_notify_delete', t);
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON pgtenant.%I', t || '_notify_truncate', t);
        EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON pgtenant.%I REFERENCING NEW TABLE AS new_rows
                        FOR EACH STATEMENT EXECUTE FUNCTION pgtenant.notify_routing_change()', t || '_notify_insert', t);
        EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON pgtenant.%I
                        REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
                        FOR EACH STATEMENT EXECUTE FUNCTION pgtenant.notify_routing_change()', t || '_notify_update', t);
        EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON pgtenant.%I REFERENCING OLD TABLE AS old_rows
                        FOR EACH STATEMENT EXECUTE FUNCTION pgtenant.notify_routing_change()', t || '_notify_delete', t);
        EXECUTE format('CREATE TRIGGER %I AFTER TRUNCATE ON pgtenant.%I
                        FOR EACH STATEMENT EXECUTE FUNCTION pgtenant.notify_routing_truncate()', t || '_notify_truncate', t);
    END LOOP;
END $$;
DROP TRIGGER IF EXISTS routing_state_notify ON routing_state;
CREATE TRIGGER routing_state_notify BEFORE UPDATE ON routing_state
    FOR EACH ROW EXECUTE FUNCTION notify_routing_state();

-- Snowflake instance numbers: each proxy leases one (1..2^instance_bits-1; 0 is the
-- servers' own SQL function) and renews it; an expired row's number may be taken by
-- another proxy, which then mints only after the old expiry (floor_unix_ms).
CREATE TABLE IF NOT EXISTS snowflake_lease (
    instance    smallint PRIMARY KEY CHECK (instance >= 1),
    holder      text NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);

-- The number `p_holder` holds, or the lowest free one; no row when all are taken.
CREATE OR REPLACE FUNCTION acquire_snowflake_instance(p_holder text, p_max_instance int, p_ttl_ms bigint)
RETURNS TABLE (instance int, floor_unix_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    chosen int;
    previous_expiry timestamptz;
BEGIN
    -- One acquisition at a time: two proxies must not both see the same number free.
    PERFORM pg_advisory_xact_lock(hashtext('pgtenant.snowflake_lease'));
    SELECT l.instance INTO chosen FROM pgtenant.snowflake_lease l
        WHERE l.holder = p_holder AND l.expires_at > now() ORDER BY l.instance LIMIT 1;
    IF chosen IS NULL THEN
        SELECT i INTO chosen FROM generate_series(1, p_max_instance) AS i
            WHERE NOT EXISTS (SELECT 1 FROM pgtenant.snowflake_lease l
                              WHERE l.instance = i AND l.expires_at > now())
            ORDER BY i LIMIT 1;
    END IF;
    IF chosen IS NULL THEN
        RETURN;
    END IF;
    -- Another holder's last expiry; its IDs may reach up to it.
    SELECT l.expires_at INTO previous_expiry FROM pgtenant.snowflake_lease l
        WHERE l.instance = chosen AND l.holder <> p_holder;
    INSERT INTO pgtenant.snowflake_lease AS l (instance, holder, acquired_at, expires_at)
        VALUES (chosen, p_holder, now(), now() + make_interval(secs => p_ttl_ms / 1000.0))
        ON CONFLICT ON CONSTRAINT snowflake_lease_pkey DO UPDATE
        SET holder = EXCLUDED.holder,
            acquired_at = CASE WHEN l.holder = EXCLUDED.holder THEN l.acquired_at ELSE EXCLUDED.acquired_at END,
            expires_at = EXCLUDED.expires_at;
    instance := chosen;
    floor_unix_ms := CASE WHEN previous_expiry IS NULL THEN 0
                          ELSE (extract(epoch FROM previous_expiry) * 1000)::bigint END;
    RETURN NEXT;
END $$;

-- Placement of new tenants (seed 000): a time-bound reservation on the fullest active
-- shard that still has room (fill-first), then confirmed (the tenant is mapped there,
-- and routing follows through the NOTIFY above) or cancelled; a lease that runs out
-- frees its place. Idempotent per tenant. Placements are serialized per catalog (an
-- advisory lock), so that two never both take a shard's last place.
--
--   SELECT * FROM pgtenant.place_tenant(5001);          -- pending, with its lease
--   SELECT * FROM pgtenant.confirm_placement(5001);     -- mapped: routed from now on
--   SELECT * FROM pgtenant.cancel_placement(5001);
CREATE TABLE IF NOT EXISTS tenant_reservation (
    tenant_id        bigint      PRIMARY KEY,
    shard_id         smallint    NOT NULL REFERENCES shard_config (shard_id),
    status           text        NOT NULL CHECK (status IN ('pending', 'confirmed', 'cancelled', 'expired')),
    lease_expires_at timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS tenant_reservation_pending ON tenant_reservation (shard_id) WHERE status = 'pending';

-- The tenants a shard holds or has promised: mapped ones, and pending reservations
-- whose lease still runs.
CREATE OR REPLACE FUNCTION shard_load(p_shard smallint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM pgtenant.tenant_shard_map m WHERE m.shard_id = p_shard)
         + (SELECT count(*) FROM pgtenant.tenant_reservation r
            WHERE r.shard_id = p_shard AND r.status = 'pending' AND r.lease_expires_at > now())
$$;

-- Marks pending reservations whose lease ran out as expired; how many.
CREATE OR REPLACE FUNCTION expire_reservations() RETURNS integer
LANGUAGE sql AS $$
    WITH expired AS (
        UPDATE pgtenant.tenant_reservation SET status = 'expired', updated_at = now()
        WHERE status = 'pending' AND lease_expires_at <= now() RETURNING 1)
    SELECT count(*)::integer FROM expired
$$;

CREATE OR REPLACE FUNCTION place_tenant(p_tenant bigint, p_lease_seconds integer DEFAULT 300)
RETURNS TABLE (tenant_id bigint, shard_id smallint, status text, lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    placed smallint;
    chosen smallint;
    r pgtenant.tenant_reservation;
BEGIN
    IF p_lease_seconds IS NULL OR p_lease_seconds < 1 THEN
        RAISE EXCEPTION 'a lease lasts at least 1 second' USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('pgtenant.placement'));
    PERFORM pgtenant.expire_reservations();
    -- Placed already (mapped, or in a shard's range): that is its place.
    SELECT m.shard_id INTO placed FROM pgtenant.tenant_shard_map m WHERE m.tenant_id = p_tenant;
    IF placed IS NULL THEN
        SELECT s.shard_id INTO placed FROM pgtenant.shard_config s
        WHERE p_tenant BETWEEN s.min_tenant_id AND s.max_tenant_id;
    END IF;
    IF placed IS NOT NULL THEN
        RETURN QUERY SELECT p_tenant, placed, 'confirmed'::text, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT * INTO r FROM pgtenant.tenant_reservation t WHERE t.tenant_id = p_tenant;
    IF FOUND AND r.status = 'pending' THEN
        RETURN QUERY SELECT r.tenant_id, r.shard_id, r.status, r.lease_expires_at;
        RETURN;
    END IF;
    SELECT s.shard_id INTO chosen FROM pgtenant.shard_config s
    WHERE s.status = 'active' AND s.is_active AND pgtenant.shard_load(s.shard_id) < s.capacity
    ORDER BY pgtenant.shard_load(s.shard_id) DESC, s.shard_id
    LIMIT 1;
    IF chosen IS NULL THEN
        RAISE EXCEPTION 'no active shard has room for tenant %', p_tenant USING ERRCODE = '53400';
    END IF;
    -- clock_timestamp(), not now(): taken under the lock, it orders the reservations as
    -- they were made, where transactions may have started in another order.
    INSERT INTO pgtenant.tenant_reservation AS t (tenant_id, shard_id, status, lease_expires_at, created_at)
    VALUES (p_tenant, chosen, 'pending', clock_timestamp() + make_interval(secs => p_lease_seconds),
            clock_timestamp())
    ON CONFLICT ON CONSTRAINT tenant_reservation_pkey DO UPDATE
    SET shard_id = EXCLUDED.shard_id, status = 'pending', lease_expires_at = EXCLUDED.lease_expires_at,
        created_at = EXCLUDED.created_at, updated_at = EXCLUDED.created_at;
    RETURN QUERY SELECT t.tenant_id, t.shard_id, t.status, t.lease_expires_at
                 FROM pgtenant.tenant_reservation t WHERE t.tenant_id = p_tenant;
END $$;

-- Maps a tenant where its pending reservation is; idempotent once confirmed.
CREATE OR REPLACE FUNCTION confirm_placement(p_tenant bigint)
RETURNS TABLE (tenant_id bigint, shard_id smallint, status text, lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    r pgtenant.tenant_reservation;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgtenant.placement'));
    SELECT * INTO r FROM pgtenant.tenant_reservation t WHERE t.tenant_id = p_tenant;
    IF NOT FOUND OR r.status IN ('cancelled', 'expired')
       OR (r.status = 'pending' AND r.lease_expires_at <= now()) THEN
        RAISE EXCEPTION 'tenant % has no pending placement to confirm (%)', p_tenant,
            coalesce(CASE WHEN r.status = 'pending' THEN 'its lease ran out' ELSE r.status END, 'none')
            USING ERRCODE = '55000';
    END IF;
    IF r.status = 'pending' THEN
        INSERT INTO pgtenant.tenant_shard_map (tenant_id, shard_id) VALUES (p_tenant, r.shard_id)
        ON CONFLICT DO NOTHING;
        UPDATE pgtenant.tenant_reservation t SET status = 'confirmed', updated_at = now()
        WHERE t.tenant_id = p_tenant;
    END IF;
    RETURN QUERY SELECT t.tenant_id, t.shard_id, t.status, t.lease_expires_at
                 FROM pgtenant.tenant_reservation t WHERE t.tenant_id = p_tenant;
END $$;

-- Gives a pending reservation's place back.
CREATE OR REPLACE FUNCTION cancel_placement(p_tenant bigint)
RETURNS TABLE (tenant_id bigint, shard_id smallint, status text, lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgtenant.placement'));
    UPDATE pgtenant.tenant_reservation t SET status = 'cancelled', updated_at = now()
    WHERE t.tenant_id = p_tenant AND t.status = 'pending';
    RETURN QUERY SELECT t.tenant_id, t.shard_id, t.status, t.lease_expires_at
                 FROM pgtenant.tenant_reservation t WHERE t.tenant_id = p_tenant;
END $$;

-- Online tenant moves (seeds 001 and 003). A move's state lives here so that every
-- proxy sees it and any proxy can resume it: one row per move, driven by one proxy at
-- a time (`driver`; another takes over when the driver's heartbeat in proxy_instance
-- goes stale). Phases:
--   planned -> copying -> catching_up -> cutover -> switched -> cleaned
--   any phase before cleaned -> rolled_back (routing back on the source, nothing lost)
-- The cutover pauses the tenant at every live proxy: the driver raises pause_epoch and
-- sends NOTIFY pgtenant_move {"move_id", "tenant", "epoch", "action": "pause"}; each
-- proxy holds the tenant's new transactions, waits for its running ones and inserts
-- its move_ack row. Once every live proxy acknowledged and the target has applied
-- everything up to then, switch_move flips tenant_shard_map (one routing version) and
-- sends "resume" in the same transaction; a missing acknowledgement sends "resume"
-- without the flip (the epoch is aborted, the tenant goes on on the source).
CREATE TABLE IF NOT EXISTS proxy_instance (
    proxy_id   text        PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS tenant_move (
    move_id       bigserial   PRIMARY KEY,
    tenant_id     bigint      NOT NULL,
    source_shard  smallint    NOT NULL REFERENCES shard_config (shard_id),
    target_shard  smallint    NOT NULL REFERENCES shard_config (shard_id),
    -- The database (on both shards) whose tables move.
    dbname        text        NOT NULL,
    phase         text        NOT NULL DEFAULT 'planned'
                  CHECK (phase IN ('planned', 'copying', 'catching_up', 'cutover', 'switched', 'cleaned', 'rolled_back')),
    -- What an operator asked of the driver: nothing, cleanup or rollback.
    requested     text        NOT NULL DEFAULT 'none' CHECK (requested IN ('none', 'cleanup', 'rollback')),
    driver        text,
    pause_epoch   integer     NOT NULL DEFAULT 0,
    -- The proxies are asked to hold the tenant (epoch pause_epoch) right now.
    paused        boolean     NOT NULL DEFAULT false,
    tables        text[]      NOT NULL DEFAULT '{}',
    rows_copied   bigint      NOT NULL DEFAULT 0,
    -- Last measured time for a change on the source to be applied on the target.
    lag_ms        bigint,
    -- The tenant's pause of the last cutover attempt, and how many were made.
    pause_ms      bigint,
    attempts      integer     NOT NULL DEFAULT 0,
    -- How the tenant was routed before the move: its map row (shard, state), if any.
    map_shard_before smallint,
    map_state_before text,
    routing_version_cutover bigint,
    error         text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    copied_at     timestamptz,
    switched_at   timestamptz,
    ended_at      timestamptz,
    -- Names its publication, subscription and slot (pgtenant_move_<id>_<token>): slot
    -- names are cluster-wide, and another catalog may number its moves alike.
    token         text        NOT NULL DEFAULT substr(md5(random()::text || clock_timestamp()::text), 1, 10),
    CHECK (source_shard <> target_shard)
);
-- At most one move of a tenant that has not ended.
CREATE UNIQUE INDEX IF NOT EXISTS tenant_move_one_open ON tenant_move (tenant_id)
    WHERE phase NOT IN ('cleaned', 'rolled_back');
-- The size of the tenant's rows on the target as the copy went (sum of pg_column_size
-- of each row): what a fleet batch's copy-bandwidth budget counts. Added after the
-- table, so a catalog made by an earlier version gains it too.
ALTER TABLE tenant_move ADD COLUMN IF NOT EXISTS bytes_copied bigint NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS move_ack (
    move_id  bigint      NOT NULL REFERENCES tenant_move (move_id) ON DELETE CASCADE,
    epoch    integer     NOT NULL,
    proxy_id text        NOT NULL,
    acked_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (move_id, epoch, proxy_id)
);

-- The shard a bigint tenant is routed to now (map, then range); NULL when not placed.
CREATE OR REPLACE FUNCTION shard_of(p_tenant bigint) RETURNS smallint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT m.shard_id FROM pgtenant.tenant_shard_map m WHERE m.tenant_id = p_tenant),
        (SELECT s.shard_id FROM pgtenant.shard_config s WHERE p_tenant BETWEEN s.min_tenant_id AND s.max_tenant_id))
$$;

-- Plans a move (validated: placed on the source, source <> target, the target routed,
-- no other open move of the tenant); returns its id.
CREATE OR REPLACE FUNCTION plan_move(p_tenant bigint, p_target smallint, p_dbname text, p_driver text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    source smallint;
    id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgtenant.move'), hashtext(p_tenant::text));
    source := pgtenant.shard_of(p_tenant);
    IF source IS NULL THEN
        RAISE EXCEPTION 'tenant % is not placed on any shard', p_tenant USING ERRCODE = '55000';
    END IF;
    IF source = p_target THEN
        RAISE EXCEPTION 'tenant % is on shard % already', p_tenant, p_target USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgtenant.shard_config s WHERE s.shard_id = p_target AND s.status = 'active' AND s.is_active) THEN
        RAISE EXCEPTION 'shard % is not an active shard', p_target USING ERRCODE = '55000';
    END IF;
    IF EXISTS (SELECT 1 FROM pgtenant.tenant_move m WHERE m.tenant_id = p_tenant AND m.phase NOT IN ('cleaned', 'rolled_back')) THEN
        RAISE EXCEPTION 'tenant % is being moved already (SHOW MOVES)', p_tenant USING ERRCODE = '55006';
    END IF;
    INSERT INTO pgtenant.tenant_move (tenant_id, source_shard, target_shard, dbname, driver, map_shard_before, map_state_before)
    SELECT p_tenant, source, p_target, p_dbname, p_driver, m.shard_id, m.state
    FROM (SELECT 1) one LEFT JOIN pgtenant.tenant_shard_map m ON m.tenant_id = p_tenant
    RETURNING move_id INTO id;
    RETURN id;
END $$;

-- The cutover's flip, once every live proxy acknowledged epoch p_epoch: routes the
-- tenant to the target (one routing version), marks the move switched and tells the
-- proxies to resume, all in one transaction. Returns the routing version.
CREATE OR REPLACE FUNCTION switch_move(p_move bigint, p_driver text, p_epoch integer, p_pause_ms bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    mv pgtenant.tenant_move;
    v bigint;
BEGIN
    SELECT * INTO mv FROM pgtenant.tenant_move WHERE move_id = p_move FOR UPDATE;
    IF NOT FOUND OR mv.phase <> 'cutover' OR mv.driver IS DISTINCT FROM p_driver OR mv.pause_epoch <> p_epoch THEN
        RAISE EXCEPTION 'move % is not in the cutover of epoch % driven by %', p_move, p_epoch, p_driver
            USING ERRCODE = '55000';
    END IF;
    INSERT INTO pgtenant.tenant_shard_map AS m (tenant_id, shard_id, region_code, state)
    SELECT mv.tenant_id, mv.target_shard, s.region_code, coalesce(mv.map_state_before, 'active')
    FROM pgtenant.shard_config s WHERE s.shard_id = mv.target_shard
    ON CONFLICT (tenant_id) DO UPDATE SET shard_id = EXCLUDED.shard_id, region_code = EXCLUDED.region_code;
    SELECT version INTO v FROM pgtenant.routing_state;
    UPDATE pgtenant.tenant_move SET phase = 'switched', routing_version_cutover = v, pause_ms = p_pause_ms,
        paused = false, error = NULL, switched_at = now(), updated_at = now()
    WHERE move_id = p_move;
    PERFORM pg_notify('pgtenant_move', jsonb_build_object('move_id', p_move, 'tenant', mv.tenant_id,
        'epoch', p_epoch, 'action', 'resume', 'switched', true)::text);
    RETURN v;
END $$;

-- Routes the tenant back as it was before the move (its map row restored or removed).
CREATE OR REPLACE FUNCTION restore_move_routing(p_move bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    mv pgtenant.tenant_move;
BEGIN
    SELECT * INTO mv FROM pgtenant.tenant_move WHERE move_id = p_move FOR UPDATE;
    IF mv.map_shard_before IS NULL THEN
        DELETE FROM pgtenant.tenant_shard_map WHERE tenant_id = mv.tenant_id;
    ELSE
        UPDATE pgtenant.tenant_shard_map SET shard_id = mv.map_shard_before, state = mv.map_state_before
        WHERE tenant_id = mv.tenant_id
          AND (shard_id, state) IS DISTINCT FROM (mv.map_shard_before, mv.map_state_before);
    END IF;
END $$;

-- Rolls a switched move back once every live proxy holds the tenant again (and its rows
-- were copied back to the source): routing as before the move, the move rolled back,
-- the proxies told to resume, in one transaction.
CREATE OR REPLACE FUNCTION unswitch_move(p_move bigint, p_driver text, p_epoch integer, p_pause_ms bigint)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    mv pgtenant.tenant_move;
BEGIN
    SELECT * INTO mv FROM pgtenant.tenant_move WHERE move_id = p_move FOR UPDATE;
    IF NOT FOUND OR mv.phase <> 'switched' OR mv.driver IS DISTINCT FROM p_driver OR mv.pause_epoch <> p_epoch
       OR NOT mv.paused THEN
        RAISE EXCEPTION 'move % is not paused for its rollback at epoch % by %', p_move, p_epoch, p_driver
            USING ERRCODE = '55000';
    END IF;
    PERFORM pgtenant.restore_move_routing(p_move);
    UPDATE pgtenant.tenant_move SET phase = 'rolled_back', requested = 'none', paused = false,
        pause_ms = p_pause_ms, ended_at = now(), updated_at = now()
    WHERE move_id = p_move;
    PERFORM pg_notify('pgtenant_move', jsonb_build_object('move_id', p_move, 'tenant', mv.tenant_id,
        'epoch', p_epoch, 'action', 'resume', 'switched', true)::text);
END $$;

-- Fleet batches (DRAIN SHARD, REBALANCE, ISOLATE TENANT in the admin console): a plan of
-- tenant moves, run at most `parallel` at a time by one proxy (`driver`), taken over by
-- another when that one's heartbeat in proxy_instance goes stale. It stops at the first
-- step whose move fails, with the reason; PAUSE REBALANCE lets the running moves finish
-- and starts no more until RESUME REBALANCE.
CREATE TABLE IF NOT EXISTS fleet_batch (
    batch_id   bigserial   PRIMARY KEY,
    -- The command as the console read it, e.g. 'DRAIN SHARD 3'.
    command    text        NOT NULL,
    dbname     text        NOT NULL,
    state      text        NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'paused', 'done', 'failed')),
    parallel   integer     NOT NULL DEFAULT 2 CHECK (parallel >= 1),
    -- The copy-bandwidth budget (bytes a second over the batch's run; NULL: none): the
    -- next move starts only while the batch has copied at most this times its age.
    bandwidth  bigint      CHECK (bandwidth > 0),
    driver     text,
    error      text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    ended_at   timestamptz
);

CREATE TABLE IF NOT EXISTS fleet_step (
    batch_id     bigint   NOT NULL REFERENCES fleet_batch (batch_id) ON DELETE CASCADE,
    seq          integer  NOT NULL,
    tenant_id    bigint   NOT NULL,
    source_shard smallint NOT NULL,
    target_shard smallint NOT NULL,
    -- The tenant's load as planned with (transactions pgtenant counted, plus one).
    load         bigint   NOT NULL,
    -- With a copy-bandwidth budget: the size of the tenant's rows on the source,
    -- measured before its move starts (what the budget charges it).
    est_bytes    bigint,
    move_id      bigint   REFERENCES tenant_move (move_id),
    state        text     NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'moving', 'done', 'failed')),
    PRIMARY KEY (batch_id, seq)
);

-- A shard's server connections for one server role, shared by every proxy on the
-- catalog (issue 56): each proxy leases a slice (connection_lease), renewed every
-- agent tick (proxy_stale_ms / 5) with what it holds and wants, and expiring after
-- proxy_stale_ms. A grant never makes the fleet's slices, or the connections a proxy
-- still holds above its slice after a shrink, exceed max_connections on any node; a
-- proxy that wants more than it has makes those above an even share shrink to it.
CREATE TABLE IF NOT EXISTS connection_budget (
    shard_id        smallint NOT NULL REFERENCES shard_config (shard_id) ON DELETE CASCADE,
    username        text     NOT NULL,
    max_connections integer  NOT NULL CHECK (max_connections >= 0),
    PRIMARY KEY (shard_id, username)
);
CREATE TABLE IF NOT EXISTS connection_lease (
    shard_id   smallint    NOT NULL,
    username   text        NOT NULL,
    proxy_id   text        NOT NULL,
    granted    integer     NOT NULL,
    holding    integer     NOT NULL,
    wanted     integer     NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (shard_id, username, proxy_id)
);

-- Proxy p_proxy's slice of (p_shard, p_user)'s budget, for p_ttl_ms: it holds
-- p_holding connections, of which p_busy are in use or asked for by waiting requests,
-- and would keep p_wanted (its idle ones too). NULL: no budget.
CREATE OR REPLACE FUNCTION lease_connections(p_proxy text, p_shard smallint, p_user text,
    p_wanted integer, p_busy integer, p_holding integer, p_ttl_ms bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    budget   integer;
    others   integer;
    starving boolean;
    proxies  integer;
    slice    integer;
BEGIN
    -- One lease at a time per budget: the row lock orders them.
    SELECT max_connections INTO budget FROM pgtenant.connection_budget
    WHERE shard_id = p_shard AND username = p_user FOR UPDATE;
    IF budget IS NULL THEN
        DELETE FROM pgtenant.connection_lease WHERE shard_id = p_shard AND username = p_user AND proxy_id = p_proxy;
        RETURN NULL;
    END IF;
    DELETE FROM pgtenant.connection_lease
    WHERE shard_id = p_shard AND username = p_user AND expires_at < clock_timestamp();
    SELECT coalesce(sum(greatest(granted, holding)), 0), coalesce(bool_or(wanted > granted), false), count(*)
    INTO others, starving, proxies
    FROM pgtenant.connection_lease WHERE shard_id = p_shard AND username = p_user AND proxy_id <> p_proxy;
    slice := least(p_wanted, budget - others);
    IF starving THEN
        -- Another wants more than it has: keep no idle connection, and no more than
        -- an even share.
        slice := least(slice, p_busy, greatest(budget / (proxies + 1), 1));
    END IF;
    slice := greatest(slice, 0);
    INSERT INTO pgtenant.connection_lease AS l (shard_id, username, proxy_id, granted, holding, wanted, expires_at)
    VALUES (p_shard, p_user, p_proxy, slice, p_holding, p_wanted, clock_timestamp() + make_interval(secs => p_ttl_ms / 1000.0))
    ON CONFLICT (shard_id, username, proxy_id) DO UPDATE
    SET granted = EXCLUDED.granted, holding = EXCLUDED.holding, wanted = EXCLUDED.wanted, expires_at = EXCLUDED.expires_at;
    RETURN slice;
END $$;

-- What every proxy counted for each tenant, gathered when a fleet command plans: the
-- planning proxy takes a request id and sends {"action": "report_loads"} on
-- pgtenant_move; each proxy's move agent answers with one row (its per-tenant
-- transaction counts as two arrays), and the plan weighs tenants by the sum. Nothing
-- is written between plans; a request's rows are deleted once it is read.
CREATE SEQUENCE IF NOT EXISTS load_request;
CREATE TABLE IF NOT EXISTS tenant_load_report (
    request_id   bigint      NOT NULL,
    proxy_id     text        NOT NULL,
    tenants      bigint[]    NOT NULL,
    transactions bigint[]    NOT NULL,
    reported_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, proxy_id)
);

-- Fleet batches not ended whose driver's heartbeat is older than p_stale_ms (or that
-- have none), now driven by p_me; their ids. Each proxy's move agent calls it on its
-- own catalog connection.
CREATE OR REPLACE FUNCTION take_over_fleet_batches(p_me text, p_stale_ms bigint) RETURNS SETOF bigint
LANGUAGE sql AS $$
    UPDATE pgtenant.fleet_batch b SET driver = p_me, updated_at = now()
    WHERE b.state IN ('running', 'paused') AND (b.driver IS NULL OR b.driver <> p_me)
      AND NOT EXISTS (SELECT 1 FROM pgtenant.proxy_instance p WHERE p.proxy_id = b.driver
                      AND p.seen_at > clock_timestamp() - make_interval(secs => p_stale_ms / 1000.0))
    RETURNING b.batch_id
$$;
