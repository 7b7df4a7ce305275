//! Tenant -> shard resolution. The `Directory` trait is what routing asks: an
//! explicit placement first, then the topology's rules (ranges, hash groups).
//! `StaticDirectory` answers from the configuration file; `CatalogDirectory` from a
//! PostgreSQL catalog shared by many proxies, through a cache that the catalog's
//! NOTIFY messages keep exact.

mod catalog;
mod limits;
mod static_dir;
mod topology;

use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::Arc;

pub use crate::config::TenantKey;
pub use catalog::listen::{CatalogLink, CatalogListener};
pub use catalog::{CatalogDirectory, CatalogError};
pub use limits::{MAX_WEIGHT, TenantLimit, TenantLimits};
pub use static_dir::StaticDirectory;
pub use topology::{PlacementRule, Shard, ShardStatus, Topology, hash_group};

/// A tenant key: a bigint, or text when `proxy.tenant_key = "text"`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TenantId {
    Int(i64),
    Text(Arc<str>),
}

/// The key alone, without the variant's discriminant the derived hash writes first: one
/// write less for every lookup of a tenant (the fair-share gate's line, per-tenant
/// statistics and figures, the catalog cache: several per transaction). A bigint and
/// a text may then hash alike, which equality still tells apart. No placement reads
/// this hash (`hash_group` hashes the key's text).
impl Hash for TenantId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            TenantId::Int(n) => state.write_i64(*n),
            TenantId::Text(s) => s.hash(state),
        }
    }
}

/// Text keys longer than this are refused as values (they would only bloat caches).
pub const MAX_TEXT_KEY: usize = 256;

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenantId::Int(n) => n.fmt(f),
            TenantId::Text(s) => s.fmt(f),
        }
    }
}

impl From<&TenantId> for crate::observe::conns::ShownTenant {
    fn from(tenant: &TenantId) -> Self {
        match tenant {
            TenantId::Int(n) => Self::Int(*n),
            TenantId::Text(s) => Self::Text(s.clone()),
        }
    }
}

impl From<i64> for TenantId {
    fn from(n: i64) -> Self {
        TenantId::Int(n)
    }
}

impl TenantId {
    /// Parses a tenant from text as clients write it (`42`, ` 42 `, `'42'`, `'acme'`).
    pub fn parse(text: &str, kind: TenantKey) -> Option<Self> {
        if kind == TenantKey::Bigint
            && let Some(n) = plain_digits(text.as_bytes())
        {
            // The usual literal: nothing to trim or unquote.
            return n.map(TenantId::Int);
        }
        let t = text.trim();
        let unquoted = t.strip_prefix('\'').and_then(|t| t.strip_suffix('\''));
        match kind {
            TenantKey::Bigint => unquoted.unwrap_or(t).trim().parse().ok().map(TenantId::Int),
            TenantKey::Text => {
                let key = match unquoted {
                    Some(inner) => inner.replace("''", "'"),
                    None => t.to_string(),
                };
                (!key.is_empty() && key.len() <= MAX_TEXT_KEY).then(|| TenantId::Text(key.into()))
            }
        }
    }

    /// A key from raw bytes (a Bind parameter or a NOTIFY payload), as text.
    pub fn from_text_bytes(bytes: &[u8], kind: TenantKey) -> Option<Self> {
        match kind {
            TenantKey::Bigint => match plain_digits(bytes) {
                Some(n) => n.map(TenantId::Int),
                None => std::str::from_utf8(bytes).ok()?.trim().parse().ok().map(TenantId::Int),
            },
            TenantKey::Text => {
                let key = std::str::from_utf8(bytes).ok()?;
                (!key.is_empty() && key.len() <= MAX_TEXT_KEY).then(|| TenantId::Text(key.into()))
            }
        }
    }

    /// The key as the catalog and the tenant GUC hold it.
    pub fn key_text(&self) -> KeyText<'_> {
        match self {
            TenantId::Int(n) => KeyText::int(*n),
            TenantId::Text(s) => KeyText::Text(s),
        }
    }
}

/// The value of a non-empty run of ASCII digits (`Some(None)` when it overflows a
/// bigint), or `None` when `bytes` is anything else: the common form of a tenant key,
/// read without a UTF-8 check, trimming or unquoting.
fn plain_digits(bytes: &[u8]) -> Option<Option<i64>> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(bytes.iter().try_fold(0i64, |n, d| n.checked_mul(10)?.checked_add(i64::from(d - b'0'))))
}

/// A tenant key as text, without an allocation: an integer's digits inline (this is
/// written on every switch of a connection's tenant GUC), a text key borrowed.
pub enum KeyText<'a> {
    Int { digits: [u8; 20], start: usize },
    Text(&'a str),
}

impl KeyText<'_> {
    fn int(n: i64) -> Self {
        // i64::MIN has 19 digits and a sign.
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        let mut rest = n.unsigned_abs();
        loop {
            start -= 1;
            digits[start] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        if n < 0 {
            start -= 1;
            digits[start] = b'-';
        }
        KeyText::Int { digits, start }
    }
}

impl Default for KeyText<'_> {
    fn default() -> Self {
        KeyText::Text("")
    }
}

impl std::ops::Deref for KeyText<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            // ASCII digits and a sign, written above.
            KeyText::Int { digits, start } => std::str::from_utf8(&digits[*start..]).unwrap_or_default(),
            KeyText::Text(s) => s,
        }
    }
}

/// A shard id (0..=1023).
pub type ShardId = u16;

/// What a tenant may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TenantState {
    #[default]
    Active,
    /// Reads are served, writes refused.
    ReadOnly,
    /// Being moved to another shard: reads are served, writes refused.
    Moving,
}

impl TenantState {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "active" => Some(Self::Active),
            "read_only" => Some(Self::ReadOnly),
            "moving" => Some(Self::Moving),
            _ => None,
        }
    }

    pub fn allows_writes(self) -> bool {
        self == Self::Active
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::ReadOnly => "read_only",
            Self::Moving => "moving",
        }
    }
}

/// Where a tenant lives and what it may do there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub shard: ShardId,
    pub state: TenantState,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DirectoryError {
    #[error("tenant {0} is not placed on any shard")]
    NotPlaced(TenantId),
    #[error("shard {shard}{} is disabled", for_tenant(.tenant))]
    ShardDisabled { tenant: Option<TenantId>, shard: ShardId },
    #[error("shard {shard}{} is not in the directory", for_tenant(.tenant))]
    UnknownShard { tenant: Option<TenantId>, shard: ShardId },
    #[error(
        "cannot look up tenant {tenant}: the catalog is unreachable ({reason}); cached tenants still route"
    )]
    CatalogUnavailable { tenant: TenantId, reason: String },
}

fn for_tenant(tenant: &Option<TenantId>) -> String {
    tenant.as_ref().map(|t| format!(" (tenant {t})")).unwrap_or_default()
}

/// A lookup that has to ask the source.
pub type Lookup<'a> = Pin<Box<dyn Future<Output = Result<Placement, DirectoryError>> + Send + 'a>>;

/// Answers where tenants live.
pub trait Directory: Send + Sync {
    /// The placement when it is known without asking the source (`None`: call `lookup`).
    fn cached(&self, tenant: &TenantId) -> Option<Result<Placement, DirectoryError>>;

    /// Asks the source and remembers the answer.
    fn lookup(&self, tenant: &TenantId) -> Lookup<'_>;

    /// The shards and placement rules in force.
    fn topology(&self) -> Arc<Topology>;

    /// The routing version served: it changes with every change of the source.
    fn version(&self) -> i64;

    /// Changes whenever a cached answer or the topology may have changed: an answer
    /// remembered with the same generation is still the directory's answer.
    fn generation(&self) -> u64;

    /// Forgets what is remembered of `tenant`, so that its next lookup asks the source
    /// (a tenant move's cutover, which knows its new placement is committed).
    fn forget(&self, _tenant: &TenantId) {}

    /// Takes the shards, ranges and tenant map of a reloaded configuration file (a
    /// catalog is its own source: nothing to take).
    fn reload_from(&self, _config: &crate::config::Config) -> Result<(), String> {
        Ok(())
    }

    /// Where placements come from and how that source is doing, for operators.
    fn status(&self) -> DirectoryStatus {
        DirectoryStatus { source: "configuration file".into(), ..DirectoryStatus::default() }
    }
}

/// A directory's source and cache, as the admin console and readiness see them.
#[derive(Clone, Debug, Default)]
pub struct DirectoryStatus {
    pub source: String,
    /// A catalog's change feed (LISTEN) is live (`None`: no catalog).
    pub listening: Option<bool>,
    pub cached_tenants: Option<u64>,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// How long after the catalog sent it the last routing change arrived (ms).
    pub change_lag_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_text_writes_integers_as_to_string_does_and_borrows_text() {
        for n in [0, 7, 42, -1, 1_000_000, i64::MAX, i64::MIN] {
            assert_eq!(&*TenantId::Int(n).key_text(), n.to_string());
        }
        assert_eq!(&*TenantId::Text("acme".into()).key_text(), "acme");
        assert_eq!(&*KeyText::default(), "");
    }
}
