-- Snowflake IDs minted on a shard itself, for clients that reach it without pgtenant.
-- The layout is pgtenant's (seeds/003): 41 bits of milliseconds since 2024-01-01 UTC,
-- 10 bits of shard id, 12 bits of sequence = instance number (high bits) + counter.
-- These functions always mint as instance 0, which no proxy is ever given, so their
-- IDs never collide with a proxy's. Through pgtenant the same calls are answered by
-- the proxy and never reach these functions.
--
--   psql -d app -f sql/snowflake.sql
--   psql -d app -c "SELECT pgtenant.set_snowflake_shard(3)"
--   SELECT pgtenant.next_id();                 -- this shard's id
--   SELECT pgtenant.next_id(5);                -- an explicit shard id
--   SELECT * FROM pgtenant.next_ids(10);
--   SELECT * FROM pgtenant.decode_id(382976039778787584);
--
-- Idempotent; run it on every shard with its own shard id. instance_bits must match
-- the proxies' [snowflake] instance_bits (default 4).

CREATE SCHEMA IF NOT EXISTS pgtenant;

-- This shard's id and the sequence split: one row.
CREATE TABLE IF NOT EXISTS pgtenant.snowflake_shard (
    only_row      boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    shard_id      smallint NOT NULL CHECK (shard_id BETWEEN 0 AND 1023),
    instance_bits smallint NOT NULL DEFAULT 4 CHECK (instance_bits BETWEEN 1 AND 11)
);

-- (millisecond << counter bits) + counter of the last ID minted here. A sequence is not
-- rolled back with a transaction, so an ID handed out is never handed out again.
CREATE SEQUENCE IF NOT EXISTS pgtenant.snowflake_clock;

-- Records this shard's id (and the split, if not the default).
CREATE OR REPLACE FUNCTION pgtenant.set_snowflake_shard(p_shard_id integer, p_instance_bits integer DEFAULT 4)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO pgtenant.snowflake_shard (shard_id, instance_bits) VALUES (p_shard_id, p_instance_bits)
    ON CONFLICT (only_row) DO UPDATE SET shard_id = EXCLUDED.shard_id, instance_bits = EXCLUDED.instance_bits
$$;

CREATE OR REPLACE FUNCTION pgtenant.next_id(p_shard_id integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    epoch_ms     CONSTANT bigint := 1704067200000;
    counter_bits int;
    now_ms       bigint;
    v            bigint;
BEGIN
    IF p_shard_id IS NULL OR p_shard_id < 0 OR p_shard_id > 1023 THEN
        RAISE EXCEPTION 'shard id % is out of range for a snowflake ID (0..1023)', p_shard_id
            USING ERRCODE = '22023';
    END IF;
    SELECT 12 - s.instance_bits INTO counter_bits FROM pgtenant.snowflake_shard s;
    IF counter_bits IS NULL THEN
        RAISE EXCEPTION 'pgtenant.snowflake_shard is empty: SELECT pgtenant.set_snowflake_shard(<this shard''s id>)'
            USING ERRCODE = '55000';
    END IF;
    now_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - epoch_ms;
    -- Held for a nextval and maybe a setval only (a session lock, not the transaction's):
    -- moving the sequence up to the clock must not race another session's nextval.
    PERFORM pg_advisory_lock(hashtext('pgtenant.snowflake_clock'));
    v := nextval('pgtenant.snowflake_clock');
    IF (v >> counter_bits) < now_ms THEN
        v := now_ms << counter_bits;
        PERFORM setval('pgtenant.snowflake_clock', v, true);
    END IF;
    PERFORM pg_advisory_unlock(hashtext('pgtenant.snowflake_clock'));
    -- A millisecond's counters used up (or the clock went back): wait for the clock.
    WHILE (v >> counter_bits) > now_ms LOOP
        IF (v >> counter_bits) - now_ms > 1000 THEN
            RAISE EXCEPTION 'the clock went back % ms; not minting', (v >> counter_bits) - now_ms
                USING ERRCODE = '55000';
        END IF;
        PERFORM pg_sleep(0.0001);
        now_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - epoch_ms;
    END LOOP;
    -- Instance 0: the counter takes the low bits, the instance bits stay zero.
    RETURN ((v >> counter_bits) << 22) | (p_shard_id::bigint << 12) | (v & ((1::bigint << counter_bits) - 1));
END $$;

CREATE OR REPLACE FUNCTION pgtenant.next_id() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT pgtenant.next_id((SELECT shard_id FROM pgtenant.snowflake_shard)::integer)
$$;

CREATE OR REPLACE FUNCTION pgtenant.next_ids(n integer) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    shard integer := (SELECT shard_id FROM pgtenant.snowflake_shard);
BEGIN
    IF n IS NULL OR n < 1 OR n > 10000 THEN
        RAISE EXCEPTION 'cannot mint % IDs in one call (1..10000)', n USING ERRCODE = '22023';
    END IF;
    FOR i IN 1..n LOOP
        RETURN NEXT pgtenant.next_id(shard);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION pgtenant.decode_id(id bigint)
RETURNS TABLE ("timestamp" timestamptz, shard_id integer, instance integer, sequence integer)
LANGUAGE sql STABLE AS $$
    SELECT to_timestamp(((id >> 22) + 1704067200000) / 1000.0),
           ((id >> 12) & 1023)::integer,
           ((id & 4095) >> (12 - s.instance_bits))::integer,
           (id & ((1 << (12 - s.instance_bits)) - 1))::integer
    FROM pgtenant.snowflake_shard s
$$;
