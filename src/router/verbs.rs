//! What a statement's first word makes it: the one table of statement verbs that every
//! question about a statement starts from (may it write, wait, change the session,
//! control the transaction, need a tenant, share an implicit transaction). A word not
//! in the table is `Verb::Other`, which every consumer takes as the unsafe case.

use super::words::Words;

/// The class of a statement by its first word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// SELECT, VALUES, TABLE: a read, unless it has `INTO` or a locking clause.
    Read,
    /// WITH: a read, or a write through a data-modifying CTE.
    With,
    /// INSERT, UPDATE, DELETE, MERGE.
    Write,
    /// EXPLAIN (with ANALYZE it runs the statement).
    Explain,
    /// COPY: `TO` reads, `FROM` writes.
    Copy,
    /// SET, RESET: followed by pgtenant.
    Setting,
    /// SHOW.
    Show,
    /// DISCARD.
    Discard,
    /// DEALLOCATE.
    Deallocate,
    /// BEGIN, START, COMMIT, END, ROLLBACK, ABORT.
    Transaction,
    /// SAVEPOINT, RELEASE.
    Savepoint,
    /// DECLARE, FETCH, MOVE, CLOSE.
    Cursor,
    /// LISTEN, UNLISTEN.
    Listen,
    /// NOTIFY (PostgreSQL refuses it in a read-only transaction).
    Notify,
    /// CREATE, ALTER, DROP.
    Schema,
    /// Anything else: DO, CALL, EXECUTE, PREPARE, VACUUM, LOCK, GRANT, TRUNCATE, ...
    Other,
}

/// Every first word pgtenant tells apart, lowercase.
const VERBS: [(&str, Verb); 33] = [
    ("select", Verb::Read),
    ("values", Verb::Read),
    ("table", Verb::Read),
    ("with", Verb::With),
    ("insert", Verb::Write),
    ("update", Verb::Write),
    ("delete", Verb::Write),
    ("merge", Verb::Write),
    ("explain", Verb::Explain),
    ("copy", Verb::Copy),
    ("set", Verb::Setting),
    ("reset", Verb::Setting),
    ("show", Verb::Show),
    ("discard", Verb::Discard),
    ("deallocate", Verb::Deallocate),
    ("begin", Verb::Transaction),
    ("start", Verb::Transaction),
    ("commit", Verb::Transaction),
    ("end", Verb::Transaction),
    ("rollback", Verb::Transaction),
    ("abort", Verb::Transaction),
    ("savepoint", Verb::Savepoint),
    ("release", Verb::Savepoint),
    ("declare", Verb::Cursor),
    ("fetch", Verb::Cursor),
    ("move", Verb::Cursor),
    ("close", Verb::Cursor),
    ("listen", Verb::Listen),
    ("unlisten", Verb::Listen),
    ("notify", Verb::Notify),
    ("create", Verb::Schema),
    ("alter", Verb::Schema),
    ("drop", Verb::Schema),
];

impl Verb {
    /// The verb of a statement's first word (its bytes, as written).
    pub(super) fn of_word(word: &[u8]) -> Verb {
        VERBS
            .iter()
            .find(|(w, _)| word.eq_ignore_ascii_case(w.as_bytes()))
            .map_or(Verb::Other, |(_, verb)| *verb)
    }

    /// The verb of a statement given as its code tokens (a word first, or `Other`).
    pub(super) fn of(w: &Words) -> Verb {
        match w.is_word(0) {
            true => Verb::of_word(w.text(0).as_bytes()),
            false => Verb::Other,
        }
    }

    /// SELECT/INSERT/UPDATE/DELETE/MERGE/WITH/VALUES/TABLE: a statement PostgreSQL runs
    /// in an implicit transaction shared with messages before it (it refuses VACUUM,
    /// CREATE INDEX CONCURRENTLY and the like there), and the statements of the
    /// plain-DML fast path.
    pub fn is_dml(self) -> bool {
        matches!(self, Verb::Read | Verb::With | Verb::Write)
    }

    /// BEGIN ... ABORT, SAVEPOINT, RELEASE: the statements that move the transaction
    /// block (`PREPARE TRANSACTION` too, which is `Other` by its first word).
    pub fn moves_transaction(self) -> bool {
        matches!(self, Verb::Transaction | Verb::Savepoint)
    }

    /// Statements that touch no table of a tenant's whatever they name: no tenant needed.
    pub fn needs_no_tenant(self) -> bool {
        matches!(
            self,
            Verb::Show | Verb::Listen | Verb::Notify | Verb::Discard | Verb::Deallocate | Verb::Savepoint
        )
    }

    /// Statements pgtenant follows itself (SET, RESET, DISCARD, DEALLOCATE), that end
    /// with the transaction, or that only read a setting: they leave the server
    /// session's settings as pgtenant knows them.
    pub fn leaves_session_known(self) -> bool {
        matches!(
            self,
            Verb::Setting
                | Verb::Show
                | Verb::Discard
                | Verb::Deallocate
                | Verb::Transaction
                | Verb::Savepoint
        )
    }
}

/// Transaction control of any kind, savepoints and `PREPARE TRANSACTION` included.
pub(super) fn controls_transaction_block(w: &Words) -> bool {
    Verb::of(w).moves_transaction() || (w.is(0, "prepare") && w.is(1, "transaction"))
}

#[cfg(test)]
mod tests {
    use super::{VERBS, Verb};

    #[test]
    fn each_word_has_one_verb() {
        for (i, (word, _)) in VERBS.iter().enumerate() {
            assert!(VERBS[i + 1..].iter().all(|(w, _)| w != word), "{word} twice");
            assert_eq!(word.to_ascii_lowercase(), *word);
        }
        assert_eq!(Verb::of_word(b"SeLeCt"), Verb::Read);
        assert_eq!(Verb::of_word(b"DROP"), Verb::Schema);
        assert_eq!(Verb::of_word(b"vacuum"), Verb::Other);
        assert_eq!(Verb::of_word(b"select1"), Verb::Other);
    }
}
