-- Other sessions are other tenants' sessions: every tenant reaches the shard as the
-- same server role, and PostgreSQL shows a role all of its own sessions (their
-- statement texts with literals, in pg_stat_activity; their locks; the progress of
-- their COPY or VACUUM) and lets it cancel or terminate them. pgtenant refuses the
-- statements that name these views and functions, and answers pg_backend_pid(),
-- pg_cancel_backend() and pg_terminate_backend() of a client's own pid itself. What
-- it cannot read (a DO block or a function that builds the name at run time) the
-- server must refuse: this takes the functions behind those views from PUBLIC.
--
--   psql -d app -f sql/session_privacy.sql      -- as a superuser, on every shard database
--
-- Monitoring keeps them: the reading functions go to pg_read_all_stats (and so to
-- pg_monitor), the signal functions to pg_signal_backend; superusers keep all. Grant
-- those roles to monitoring and admin roles, never to the role tenants' sessions use.
-- Safe to run again. `pg_stat_statements`, if installed, is covered wherever it lives.
-- pgtenant's health checks read the synchronous standbys' positions only as a role
-- that may (pg_read_all_stats); without it they read no positions, as before.
--
-- The list below must stay the one in src/router/other_sessions.rs (a test checks it).

DO $$
DECLARE
    reading text[] := ARRAY[
        -- functions: begin
        'pg_stat_get_activity',
        'pg_stat_get_progress_info',
        'pg_stat_get_wal_senders',
        'pg_stat_get_wal_receiver',
        'pg_stat_get_subscription',
        'pg_lock_status',
        'pg_blocking_pids',
        'pg_safe_snapshot_blocking_pids',
        'pg_isolation_test_session_is_blocked',
        'pg_prepared_xact',
        -- functions: end
        'pg_stat_statements',
        'pg_stat_statements_info'];
    signalling text[] := ARRAY[
        -- signal functions: begin
        'pg_cancel_backend',
        'pg_terminate_backend',
        'pg_log_backend_memory_contexts'
        -- signal functions: end
        ];
    f record;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure AS fn, p.proname = ANY (signalling) AS signals
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE (n.nspname = 'pg_catalog'
               AND (p.proname = ANY (reading || signalling)
                    -- prefixes: begin
                    OR p.proname LIKE 'pg\_stat\_get\_backend\_%'
                    -- prefixes: end
                    ))
           OR p.proname IN ('pg_stat_statements', 'pg_stat_statements_info', 'pg_stat_statements_reset')
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f.fn);
        IF f.signals THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO pg_signal_backend', f.fn);
        ELSE
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO pg_read_all_stats', f.fn);
        END IF;
    END LOOP;
END $$;
