//! The parse cache: query text -> shared `Analysis`, so a hot statement is
//! analyzed once. Bounded by entry count.

use std::sync::Arc;

use bytes::Bytes;
use moka::sync::Cache;

use super::analyze::{Analysis, analyze};

pub struct AnalysisCache {
    cache: Cache<Bytes, Arc<Analysis>>,
}

impl AnalysisCache {
    pub fn new(capacity: u64) -> Self {
        Self { cache: Cache::new(capacity) }
    }

    pub fn get_or_analyze(&self, sql: &[u8], tenant_param: &str) -> Arc<Analysis> {
        if let Some(hit) = self.cache.get(sql) {
            return hit;
        }
        let analysis = Arc::new(analyze(sql, tenant_param));
        // Copy the key so the cache does not keep a whole client buffer alive.
        self.cache.insert(Bytes::copy_from_slice(sql), analysis.clone());
        analysis
    }
}
