-- Row-level security keyed on the tenant GUC that pgtenant sets on every server
-- connection it hands to a tenant (proxy.set_tenant_guc, on by default). It is the
-- second wall behind pgtenant's own checks: even a statement without any WHERE sees
-- only the session tenant's rows.
--
--   psql -d app -f sql/rls.sql
--   CALL pgtenant.enable_tenant_isolation('accounts');            -- column tenant_id
--   CALL pgtenant.enable_tenant_isolation('orders', 'customer_tenant');
--
-- Run it on every shard. FORCE makes the policy bind the table owner too; superusers
-- and roles with BYPASSRLS are still exempt, so applications must not use them.

CREATE SCHEMA IF NOT EXISTS pgtenant;

-- The tenant of the current server connection; NULL when none is set.
CREATE OR REPLACE FUNCTION pgtenant.current_tenant() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT nullif(current_setting('pgtenant.tenant_id', true), '')::bigint
$$;

-- The same for text tenant keys (proxy.tenant_key = "text").
CREATE OR REPLACE FUNCTION pgtenant.current_tenant_text() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT nullif(current_setting('pgtenant.tenant_id', true), '')
$$;

-- Bigint tenant columns compare with current_tenant(), text ones with current_tenant_text().
CREATE OR REPLACE PROCEDURE pgtenant.enable_tenant_isolation(tbl regclass, tenant_column name DEFAULT 'tenant_id')
LANGUAGE plpgsql AS $$
DECLARE
    tenant_expr text := 'pgtenant.current_tenant()';
BEGIN
    IF (SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = tbl AND attname = tenant_column)
       IN ('text', 'character varying') THEN
        tenant_expr := 'pgtenant.current_tenant_text()';
    END IF;
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);
    EXECUTE format('DROP POLICY IF EXISTS pgtenant_isolation ON %s', tbl);
    EXECUTE format(
        'CREATE POLICY pgtenant_isolation ON %s USING (%I = %s) WITH CHECK (%I = %s)',
        tbl, tenant_column, tenant_expr, tenant_column, tenant_expr);
END $$;

GRANT USAGE ON SCHEMA pgtenant TO PUBLIC;
GRANT EXECUTE ON FUNCTION pgtenant.current_tenant() TO PUBLIC;
GRANT EXECUTE ON FUNCTION pgtenant.current_tenant_text() TO PUBLIC;
