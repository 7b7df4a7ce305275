//! What a statement may do besides reading rows and returning them: one `Effects` value
//! per statement text, worked out in one pass over its tokens from its verbs
//! (`verbs`) and the calls it makes (`known_calls`), and read by every consumer: the
//! read-only wall and read-your-writes (`writes`), lanes and replicas (`cannot_wait`),
//! the session's bookkeeping (`session`), the shard's write hooks (`changes_schema`),
//! and what may share an implicit transaction with pgtenant's own messages.
//!
//! Conservative by construction: a statement counts as one that cannot wait, or that
//! leaves the session alone, only when every part of it is recognised. What the text
//! cannot show stays possible: a view or a row-level security policy that calls a
//! function that waits, a user-defined operator, a `search_path` that puts a schema
//! before `pg_catalog`, and a read that waits for the ACCESS EXCLUSIVE lock of DDL or
//! `LOCK TABLE`. Lanes bound those by timing each statement shape (`quick`); a function
//! that writes is stopped for a read-only tenant by the server's
//! `default_transaction_read_only`, which pgtenant protects (`Writes::ThroughCode`).

use super::known_calls::calls_only_known;
use super::lexer::{TokenKind, code_tokens};
use super::verbs::{Verb, controls_transaction_block};
use super::words::Words;

/// What a statement text may do, answered once for every question pgtenant asks of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Effects {
    /// The most any of its statements may write.
    pub writes: Writes,
    /// One statement that only reads and can wait on no other session: a SELECT,
    /// VALUES, TABLE or WITH without a locking clause, `INTO`, a data-modifying CTE, or a
    /// call of a function pgtenant does not know. What may ride a lane or go to a replica.
    pub cannot_wait: bool,
    /// The most any of its statements may do to the server session's state.
    pub session: SessionRisk,
    /// A statement of it controls the transaction block (BEGIN, COMMIT, SAVEPOINT,
    /// PREPARE TRANSACTION, ...).
    pub controls_transaction: bool,
    /// One SELECT/INSERT/UPDATE/DELETE/MERGE/WITH/VALUES/TABLE statement.
    pub single_dml: bool,
    /// A statement of it is CREATE, ALTER or DROP: it may change tables, their policies,
    /// triggers or defaults, and what pgtenant read of the shard's catalog.
    pub changes_schema: bool,
}

/// What a statement may write, from least to most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Writes {
    /// Nothing: reads with known functions only, and statements about the session or
    /// the transaction.
    Nothing,
    /// Its text reads, but it calls code pgtenant cannot follow (a function of the
    /// user's, `nextval`, a cursor over such a call), which may write. Only the server
    /// can tell: a read-only tenant's `default_transaction_read_only` refuses it there.
    ThroughCode,
    /// Rows: INSERT, UPDATE, DELETE, MERGE, a data-modifying CTE, `SELECT ... INTO`, a
    /// locking clause, `COPY ... FROM`, NOTIFY, `EXPLAIN ANALYZE`.
    Rows,
    /// The schema: CREATE, ALTER, DROP.
    Schema,
    /// A statement pgtenant does not recognise as a read (DO, CALL, EXECUTE, VACUUM,
    /// LOCK, GRANT, ...): counted as one that writes.
    Unrecognised,
}

impl Writes {
    /// What it writes, in words for an error message.
    pub fn describe(self) -> &'static str {
        match self {
            Writes::Nothing => "nothing",
            Writes::ThroughCode => "a call of code that may write",
            Writes::Rows => "a statement that writes rows or takes row locks",
            Writes::Schema => "a statement that changes the schema",
            Writes::Unrecognised => "a statement pgtenant does not recognise as a read",
        }
    }

    /// Whether the text shows a write (or cannot show that it does not): what pgtenant
    /// refuses for a tenant that may not write.
    pub fn shown(self) -> bool {
        self >= Writes::Rows
    }
}

/// What a statement text may do to the server session's state (settings, the tenant
/// GUC) behind pgtenant's back, beyond the SET/RESET statements it follows itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SessionRisk {
    /// Nothing: reads of known functions only, and the session and transaction
    /// statements pgtenant follows or that end with the transaction.
    Nothing,
    /// Writes with known functions only: a trigger on the table could still call
    /// `set_config`.
    ThroughTriggers,
    /// Anything: DO, CALL, EXECUTE, a function pgtenant does not know, a statement it
    /// does not recognise.
    Anything,
}

impl Effects {
    /// The effects of a statement text (one or more statements).
    pub fn of(sql: &str) -> Effects {
        let tokens = code_tokens(sql);
        let mut statements = tokens.split(|t| t.kind == TokenKind::Semicolon).filter(|s| !s.is_empty());
        let mut effects = Effects {
            writes: Writes::Nothing,
            cannot_wait: false,
            session: SessionRisk::Nothing,
            controls_transaction: false,
            single_dml: false,
            changes_schema: false,
        };
        let mut count = 0;
        for statement in statements.by_ref() {
            let one = StatementEffects::of(&Words { sql, tokens: statement });
            count += 1;
            effects.writes = effects.writes.max(one.writes);
            effects.session = effects.session.max(one.session);
            effects.controls_transaction |= one.controls_transaction;
            effects.cannot_wait = count == 1 && one.cannot_wait;
            effects.single_dml = count == 1 && one.verb.is_dml();
            effects.changes_schema |= one.verb == Verb::Schema;
        }
        effects
    }

    /// Whether the statement may run after a message of pgtenant's own in one implicit
    /// transaction (no Sync between): one DML statement calling no code pgtenant cannot
    /// follow. A function may run VACUUM or the like, which PostgreSQL would then refuse
    /// as "within a pipeline" instead of with the error it gives the statement alone.
    pub fn shares_implicit_transaction(&self) -> bool {
        self.single_dml && self.session != SessionRisk::Anything
    }

    /// Whether the transaction it runs in may have written (read-your-writes).
    pub fn may_have_written(&self) -> bool {
        self.writes != Writes::Nothing
    }
}

/// The effects of one statement.
struct StatementEffects {
    verb: Verb,
    controls_transaction: bool,
    writes: Writes,
    cannot_wait: bool,
    session: SessionRisk,
}

impl StatementEffects {
    fn of(w: &Words) -> StatementEffects {
        let verb = Verb::of(w);
        let known = calls_only_known(w);
        let writes_rows = ["insert", "update", "delete", "merge"].iter().any(|k| w.contains_word(k));
        let select = w.is(0, "select");
        // FOR UPDATE / NO KEY UPDATE / SHARE / KEY SHARE: PostgreSQL refuses every
        // locking clause in a read-only transaction, and each waits for row locks.
        let locks =
            select && w.contains_word("for") && (w.contains_word("update") || w.contains_word("share"));
        let writes = match verb {
            Verb::Read if (select && w.contains_word("into")) || locks => Writes::Rows,
            Verb::With if writes_rows => Writes::Rows,
            // COPY ... TO writes no table, unless its query writes or it writes a file.
            Verb::Copy => {
                let copies_out =
                    w.contains_word("to") && !w.contains_word("from") && !w.contains_word("program");
                if copies_out && !writes_rows { Writes::Nothing } else { Writes::Rows }
            }
            Verb::Explain if w.contains_word("analyze") => Writes::Rows,
            Verb::Write | Verb::Notify => Writes::Rows,
            Verb::Schema => Writes::Schema,
            Verb::Other => Writes::Unrecognised,
            _ => Writes::Nothing,
        };
        let writes = match (writes, known) {
            (Writes::Nothing, false) => Writes::ThroughCode,
            (writes, _) => writes,
        };
        // `FOR UPDATE/SHARE/...` waits for row locks; `INTO` creates a table; the others
        // are writes inside a WITH. (`substring(x FOR n)` counts too: rare enough.)
        let cannot_wait = matches!(verb, Verb::Read | Verb::With)
            && known
            && !["for", "into"].iter().any(|k| w.contains_word(k))
            && !writes_rows;
        StatementEffects {
            verb,
            controls_transaction: controls_transaction_block(w),
            writes,
            cannot_wait,
            session: session_risk(w, verb, known, writes_rows),
        }
    }
}

/// What one statement may do to the session's state.
fn session_risk(w: &Words, verb: Verb, known: bool, writes_rows: bool) -> SessionRisk {
    if !known {
        return SessionRisk::Anything;
    }
    if verb.leaves_session_known() {
        return SessionRisk::Nothing;
    }
    if writes_rows && w.contains_word("pg_settings") {
        // pg_settings' own rule turns an UPDATE of it into set_config().
        return SessionRisk::Anything;
    }
    match verb {
        Verb::Read | Verb::With if !writes_rows => SessionRisk::Nothing,
        Verb::Write | Verb::With => SessionRisk::ThroughTriggers,
        // SELECT with a writable CTE is a WITH; anything else (DO, CALL, EXECUTE, COPY,
        // utility statements) may run code pgtenant does not see.
        _ => SessionRisk::Anything,
    }
}

#[cfg(test)]
mod tests {
    use super::{Effects, SessionRisk, Writes};

    fn session_risk(sql: &str) -> SessionRisk {
        Effects::of(sql).session
    }

    fn cannot_wait(sql: &str) -> bool {
        Effects::of(sql).cannot_wait
    }

    #[test]
    fn what_each_statement_writes() {
        for (sql, writes) in [
            ("SELECT a FROM t WHERE tenant_id = 7", Writes::Nothing),
            ("SET search_path = a; SHOW search_path; BEGIN; SAVEPOINT s; RELEASE s; COMMIT", Writes::Nothing),
            ("COPY (SELECT 1) TO STDOUT", Writes::Nothing),
            ("SELECT w()", Writes::ThroughCode),
            ("SELECT nextval('s')", Writes::ThroughCode),
            ("DECLARE c CURSOR FOR SELECT w()", Writes::ThroughCode),
            ("SELECT * FROM t FOR KEY SHARE", Writes::Rows),
            ("SELECT * INTO t2 FROM t", Writes::Rows),
            ("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", Writes::Rows),
            ("COPY t FROM STDIN", Writes::Rows),
            ("COPY (SELECT 1) TO PROGRAM 'x'", Writes::Rows),
            ("NOTIFY c", Writes::Rows),
            ("EXPLAIN ANALYZE SELECT 1", Writes::Rows),
            ("SELECT 1; CREATE TABLE x (a int)", Writes::Schema),
            ("DO $$ BEGIN END $$", Writes::Unrecognised),
            ("VACUUM t", Writes::Unrecognised),
        ] {
            assert_eq!(Effects::of(sql).writes, writes, "{sql}");
        }
        assert!(!Writes::ThroughCode.shown() && Writes::Rows.shown() && Writes::Unrecognised.shown());
    }

    #[test]
    fn transaction_control_and_single_dml() {
        for (sql, controls, single_dml) in [
            ("BEGIN", true, false),
            ("SELECT 1; COMMIT", true, false),
            ("PREPARE TRANSACTION 'x'", true, false),
            ("ROLLBACK TO s", true, false),
            ("PREPARE s AS SELECT 1", false, false),
            ("INSERT INTO t VALUES (1)", false, true),
            ("SELECT 1; SELECT 2", false, false),
            ("VACUUM t", false, false),
        ] {
            let effects = Effects::of(sql);
            assert_eq!((effects.controls_transaction, effects.single_dml), (controls, single_dml), "{sql}");
        }
    }

    #[test]
    fn what_may_change_the_session_behind_pgtenants_back() {
        for (sql, risk) in [
            ("SELECT secret FROM iso WHERE tenant_id = 7", SessionRisk::Nothing),
            ("SET search_path = a; SHOW search_path; BEGIN; COMMIT", SessionRisk::Nothing),
            ("select current_setting('pgtenant.tenant_id')", SessionRisk::Nothing),
            ("UPDATE t SET a = 1 WHERE id = $1", SessionRisk::ThroughTriggers),
            ("INSERT INTO t VALUES (1, now())", SessionRisk::ThroughTriggers),
            (
                "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 2, 3, 4, CURRENT_TIMESTAMP)",
                SessionRisk::ThroughTriggers,
            ),
            ("insert into s.t as x (a) values (1) returning a", SessionRisk::ThroughTriggers),
            ("INSERT INTO t (a) SELECT f(1)", SessionRisk::Anything),
            ("INSERT INTO t (a) VALUES (my_default())", SessionRisk::Anything),
            ("UPDATE pg_settings SET setting = '8' WHERE name = 'pgtenant.tenant_id'", SessionRisk::Anything),
            ("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", SessionRisk::ThroughTriggers),
            (
                "DO $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); END $$",
                SessionRisk::Anything,
            ),
            ("SELECT my_function()", SessionRisk::Anything),
            ("SELECT 1; SELECT f(2)", SessionRisk::Anything),
            ("UPDATE t SET a = f(1)", SessionRisk::Anything),
            ("CALL p()", SessionRisk::Anything),
            ("EXECUTE s", SessionRisk::Anything),
            ("VACUUM t", SessionRisk::Anything),
        ] {
            assert_eq!(session_risk(sql), risk, "{sql}");
        }
    }

    #[test]
    fn reads_of_known_functions_cannot_wait() {
        for sql in [
            "SELECT 1",
            "select abalance from pgbench_accounts where aid = $1;",
            "SELECT count(*), max(a) FROM t WHERE tenant_id = 7 GROUP BY b ORDER BY 1 LIMIT 3",
            "with x as (select * from t) select * from x where a in (1, 2)",
            "SELECT pg_catalog.now(), '1.5'::numeric(10,2), coalesce(a, 0) FROM t /* hint */",
            "WITH x (a, b) AS (SELECT 1, 2) SELECT * FROM x",
            "VALUES (1), (2)",
            "TABLE t",
            "select exists (select 1 from t where a = any($1))",
        ] {
            assert!(cannot_wait(sql), "{sql}");
        }
    }

    #[test]
    fn anything_that_may_wait_or_is_not_recognised_may_wait() {
        for sql in [
            "SELECT pg_sleep(3)",
            "select pg_catalog.pg_sleep(1)",
            "SELECT * FROM t WHERE id = 1 FOR UPDATE",
            "select * from t for no key update",
            "SELECT pg_advisory_lock(1)",
            "select * from dblink('x', 'y') as t(a int)",
            "SELECT my_function(1)",
            "SELECT public.count(1)",
            "SELECT \"count\"(1)",
            "SELECT nextval('s')",
            "SELECT set_config('a.b', '1', false)",
            "WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d",
            "SELECT * INTO t2 FROM t",
            "UPDATE t SET a = 1",
            "INSERT INTO t VALUES (1)",
            "SELECT 1; SELECT 2",
            "LOCK TABLE t",
            "EXPLAIN ANALYZE SELECT 1",
            "DO $$ BEGIN PERFORM pg_sleep(1); END $$",
        ] {
            assert!(!cannot_wait(sql), "{sql}");
        }
    }
}
