//! Per-tenant limits on the server connections of each pool a tenant uses: a weight
//! against other tenants, a cap and a minimum. They come from `[[tenant_limits]]` in
//! the configuration file and, with a catalog, from its `tenant_limits` table (which
//! wins for the tenants it names), and travel with the topology, so that the catalog's
//! NOTIFY path reloads them with it.

use std::collections::HashMap;

use super::{TenantId, TenantKey};
use crate::config::TenantLimitConfig;

/// One tenant's limits in every pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantLimit {
    /// Its weight against the other tenants with work for the same pool.
    pub weight: u32,
    /// At most this many connections of one pool at once.
    pub max_connections: Option<u32>,
    /// While it has work, this many connections of a pool are kept for it.
    pub min_connections: u32,
}

impl Default for TenantLimit {
    fn default() -> Self {
        Self { weight: 1, max_connections: None, min_connections: 0 }
    }
}

/// The tenants with limits of their own; every other tenant has the default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantLimits(HashMap<TenantId, TenantLimit>);

/// Weights are kept within this (the catalog's values are clamped, the file's checked).
pub const MAX_WEIGHT: u32 = 10_000;

impl TenantLimits {
    pub fn from_config(entries: &[TenantLimitConfig], kind: TenantKey) -> Self {
        let mut limits = Self::default();
        for e in entries {
            if let Some(tenant) = TenantId::parse(&e.tenant.to_string(), kind) {
                limits.set(
                    tenant,
                    TenantLimit {
                        weight: e.weight,
                        max_connections: e.max_connections,
                        min_connections: e.min_connections,
                    },
                );
            }
        }
        limits
    }

    /// Sets one tenant's limits, clamped to what the pools can use.
    pub fn set(&mut self, tenant: TenantId, limit: TenantLimit) {
        let limit = TenantLimit {
            weight: limit.weight.clamp(1, MAX_WEIGHT),
            max_connections: limit.max_connections.map(|cap| cap.max(1)),
            min_connections: limit.min_connections,
        };
        self.0.insert(tenant, limit);
    }

    /// `tenant`'s limits (the default for a tenant not named, or no tenant).
    pub fn get(&self, tenant: Option<&TenantId>) -> TenantLimit {
        self.named(tenant).unwrap_or_default()
    }

    /// `tenant`'s own limits, if it is named.
    pub fn named(&self, tenant: Option<&TenantId>) -> Option<TenantLimit> {
        tenant.and_then(|t| self.0.get(t)).copied()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `other`'s entries replace these for the tenants it names.
    pub fn overlay(&mut self, other: TenantLimits) {
        self.0.extend(other.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MappedKey;

    #[test]
    fn named_tenants_have_theirs_and_the_rest_the_default() {
        let entries = vec![TenantLimitConfig {
            tenant: MappedKey::Int(7),
            weight: 3,
            max_connections: Some(5),
            min_connections: 1,
        }];
        let mut limits = TenantLimits::from_config(&entries, TenantKey::Bigint);
        assert_eq!(limits.get(Some(&TenantId::Int(7))).max_connections, Some(5));
        assert_eq!(limits.get(Some(&TenantId::Int(8))), TenantLimit::default());
        assert_eq!(limits.get(None), TenantLimit::default());
        let mut catalog = TenantLimits::default();
        catalog
            .set(TenantId::Int(7), TenantLimit { weight: 0, max_connections: Some(0), min_connections: 0 });
        limits.overlay(catalog);
        assert_eq!(
            limits.get(Some(&TenantId::Int(7))),
            TenantLimit { weight: 1, max_connections: Some(1), min_connections: 0 },
            "the catalog's entry wins, clamped"
        );
    }
}
