-- Row-level security keyed on the tenant GUC that pgtenant sets on every server
-- connection it hands to a tenant (proxy.set_tenant_guc, on by default). It is the
-- second wall behind pgtenant's own checks: even a statement without any WHERE sees
-- only the session tenant's rows.
--
--   psql -d app -f sql/rls.sql
--   SELECT pgtenant.set_context_key('<proxy.tenant_context_key>');   -- as a superuser
--   CALL pgtenant.enable_tenant_isolation('accounts');            -- column tenant_id
--   CALL pgtenant.enable_tenant_isolation('orders', 'customer_tenant');
--
-- Run it on every shard. FORCE makes the policy bind the table owner too; superusers
-- and roles with BYPASSRLS are still exempt, so applications must not use them.
--
-- A tenant's own SQL can set the GUC (set_config in a DO block or a function). With a
-- context key installed, it cannot forge the tenant: pgtenant also sets
-- pgtenant.tenant_sig, an HMAC-SHA-256 under the key of '<tenant>/<backend pid>', and
-- the functions below trust the GUC only when the signature matches. The key sits in a
-- table only its owner reads, behind SECURITY DEFINER functions; a signature is good on
-- one server backend only. Without a key installed they trust the GUC alone.

CREATE SCHEMA IF NOT EXISTS pgtenant;

-- The key, as HMAC's inner and outer padded keys; readable by its owner only.
CREATE TABLE IF NOT EXISTS pgtenant.context_key (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    inner_key bytea NOT NULL,
    outer_key bytea NOT NULL
);
REVOKE ALL ON pgtenant.context_key FROM PUBLIC;

-- Installs the key pgtenant signs with (its proxy.tenant_context_key); NULL removes it.
CREATE OR REPLACE FUNCTION pgtenant.set_context_key(key text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
DECLARE
    k bytea := convert_to(key, 'UTF8');
    inner_key bytea;
    outer_key bytea;
BEGIN
    DELETE FROM pgtenant.context_key;
    IF key IS NULL THEN
        RETURN;
    END IF;
    IF length(k) > 64 THEN
        k := sha256(k);
    END IF;
    k := k || decode(repeat('00', 64 - length(k)), 'hex');
    inner_key := k;
    outer_key := k;
    FOR i IN 0..63 LOOP
        inner_key := set_byte(inner_key, i, get_byte(k, i) # 54);
        outer_key := set_byte(outer_key, i, get_byte(k, i) # 92);
    END LOOP;
    INSERT INTO pgtenant.context_key VALUES (true, inner_key, outer_key);
END $$;
REVOKE ALL ON FUNCTION pgtenant.set_context_key(text) FROM PUBLIC;

-- The tenant GUC's value when pgtenant set it: its signature checks out, or no key is
-- installed. NULL otherwise, and when none is set.
CREATE OR REPLACE FUNCTION pgtenant.current_tenant_text() RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    tenant text := nullif(current_setting('pgtenant.tenant_id', true), '');
    signature text := current_setting('pgtenant.tenant_sig', true);
    key record;
BEGIN
    SELECT inner_key, outer_key INTO key FROM pgtenant.context_key;
    IF NOT FOUND OR tenant IS NULL THEN
        RETURN tenant;
    END IF;
    IF signature IS DISTINCT FROM encode(
        sha256(key.outer_key || sha256(key.inner_key || convert_to(tenant || '/' || pg_backend_pid(), 'UTF8'))),
        'hex') THEN
        RETURN NULL;
    END IF;
    RETURN tenant;
END $$;

-- The same for bigint tenant keys.
CREATE OR REPLACE FUNCTION pgtenant.current_tenant() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT pgtenant.current_tenant_text()::bigint
$$;

-- Bigint tenant columns compare with current_tenant(), text ones with current_tenant_text().
-- The call is a subquery, so that PostgreSQL works it out once per statement, not per row.
CREATE OR REPLACE PROCEDURE pgtenant.enable_tenant_isolation(tbl regclass, tenant_column name DEFAULT 'tenant_id')
LANGUAGE plpgsql AS $$
DECLARE
    tenant_expr text := '(SELECT pgtenant.current_tenant())';
BEGIN
    IF (SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = tbl AND attname = tenant_column)
       IN ('text', 'character varying') THEN
        tenant_expr := '(SELECT pgtenant.current_tenant_text())';
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
