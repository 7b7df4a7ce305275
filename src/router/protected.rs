//! The settings pgtenant sets on a server connection to enforce something, as one
//! class: which they are, and every way a statement can change one (SET or RESET of any
//! scope, `set_config` by a name pgtenant reads or one given at Bind, `ALTER ... SET`,
//! and for the read-only wall `READ WRITE`). The admission step refuses what this
//! finds; after SQL pgtenant cannot follow, the session's bookkeeping sets each again
//! before the next transaction (the tenant GUC and its signature as `TenantGuc`, the
//! wall as `ReadOnlyGuc`). A later setting joins by a variant here.

use super::classify::set_or_reset_name;
use super::set_config::{parameter_at, set_config_calls, set_config_name};
use super::words::{Words, contains_ignore_case};
use crate::backend::TENANT_SIGNATURE_GUC;

/// A setting pgtenant protects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protected {
    /// The tenant parameter. A session SET or RESET of it is pgtenant's own tenant
    /// switch, never sent; `SET LOCAL`, `set_config` and `ALTER ... SET` would change the
    /// server's tenant GUC behind pgtenant's back.
    TenantGuc,
    /// The tenant's signature (`backend::TENANT_SIGNATURE_GUC`), set by pgtenant only.
    TenantSignature,
    /// `default_transaction_read_only` and `transaction_read_only`, and `READ WRITE`
    /// transactions: the wall pgtenant puts up for a tenant that may not write. Others
    /// may change them.
    ReadOnlyWall,
}

/// The settings that make a transaction read-only: pgtenant turns the first on for a
/// tenant that may not write, and the tenant may change neither.
pub const READ_ONLY_SETTINGS: [&str; 2] = ["default_transaction_read_only", "transaction_read_only"];

impl Protected {
    const ALL: [Protected; 3] = [Protected::TenantGuc, Protected::TenantSignature, Protected::ReadOnlyWall];

    /// The protected setting called `name` (case ignored), if it is one.
    pub fn named(name: &str, tenant_param: &str) -> Option<Protected> {
        Protected::ALL.into_iter().find(|p| p.names(tenant_param).any(|n| name.eq_ignore_ascii_case(n)))
    }

    /// Whether nobody may change it (else only a tenant that may not write is refused).
    pub fn refused_to_all(self) -> bool {
        self != Protected::ReadOnlyWall
    }

    fn names(self, tenant_param: &str) -> impl Iterator<Item = &str> {
        let names: &[&str] = match self {
            Protected::TenantGuc => &[],
            Protected::TenantSignature => &[TENANT_SIGNATURE_GUC],
            Protected::ReadOnlyWall => &READ_ONLY_SETTINGS,
        };
        (self == Protected::TenantGuc).then_some(tenant_param).into_iter().chain(names.iter().copied())
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The protected settings a statement (or a Bind's parameters) may change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProtectedSet(u8);

impl ProtectedSet {
    /// Every protected setting: what a name pgtenant cannot read may be.
    pub const ALL: ProtectedSet = ProtectedSet(0b111);

    pub fn contains(self, p: Protected) -> bool {
        self.0 & p.bit() != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn union(self, other: ProtectedSet) -> ProtectedSet {
        ProtectedSet(self.0 | other.0)
    }

    fn insert(&mut self, p: Protected) {
        self.0 |= p.bit();
    }

    /// The protected setting among `self` that nobody may change, if any.
    pub fn refused_to_all(self) -> Option<Protected> {
        Protected::ALL.into_iter().find(|&p| self.contains(p) && p.refused_to_all())
    }

    /// The protected setting a `set_config` name read at Bind is (`None`: a name pgtenant
    /// could not read, which may be any).
    pub fn of_bound_name(name: Option<&str>, tenant_param: &str) -> ProtectedSet {
        let Some(name) = name else { return ProtectedSet::ALL };
        let mut set = ProtectedSet::default();
        if let Some(p) = Protected::named(name, tenant_param) {
            set.insert(p);
        }
        set
    }
}

/// The protected settings statement `w` changes, other than by the tenant switch (a
/// session SET or RESET of the tenant parameter, which pgtenant carries out itself). A
/// `set_config` name pgtenant cannot read counts as every one; a `$n` name is read at
/// Bind instead (`ProtectedSet::of_bound_name`).
pub(super) fn changed_by(w: &Words, tenant_param: &str) -> ProtectedSet {
    let mut set = ProtectedSet::default();
    if let Some(name) = set_or_reset_name(w)
        && let Some(p) = Protected::named(&name, tenant_param)
        && (p != Protected::TenantGuc || w.is(1, "local"))
    {
        set.insert(p);
    }
    for i in set_config_calls(w) {
        match set_config_name(w, i) {
            Some(name) => set = set.union(ProtectedSet::of_bound_name(Some(&name), tenant_param)),
            None if parameter_at(w, i + 2).is_some() && w.text(i + 3) == "," => {}
            None => set = ProtectedSet::ALL,
        }
    }
    if w.is(0, "alter") {
        // ALTER ROLE/DATABASE ... SET: a default server connections would start with.
        let rest = w.rest_from(0).as_bytes();
        for p in Protected::ALL {
            if p.names(tenant_param).any(|n| contains_ignore_case(rest, n.as_bytes())) {
                set.insert(p);
            }
        }
    }
    if opens_read_write(w) {
        set.insert(Protected::ReadOnlyWall);
    }
    set
}

/// `BEGIN`/`START TRANSACTION`/`SET TRANSACTION`/`SET SESSION CHARACTERISTICS AS
/// TRANSACTION` with `READ WRITE`: a transaction that may write although
/// `default_transaction_read_only` is on.
fn opens_read_write(w: &Words) -> bool {
    let read_write = (1..w.tokens.len()).any(|i| w.is(i - 1, "read") && w.is(i, "write"));
    let begins = w.is(0, "begin") || (w.is(0, "start") && w.is(1, "transaction"));
    let sets_mode =
        w.is(0, "set") && (w.is(1, "transaction") || (w.is(1, "session") && w.is(2, "characteristics")));
    read_write && (begins || sets_mode)
}
