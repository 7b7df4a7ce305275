//! The last few statement texts one session analyzed. Parameterized SQL (drivers,
//! ORMs, prepared statements) sends the same text again and again, so a repeat is
//! recognised by comparing bytes instead of analyzing again. Per session, so no lock.

use std::sync::Arc;

use super::{Analysis, Router};

const ENTRIES: usize = 8;
/// Longer texts are analyzed every time rather than kept.
const MAX_TEXT: usize = 4096;

#[derive(Default)]
pub struct RecentAnalyses {
    entries: Vec<(Box<[u8]>, Arc<Analysis>)>,
    next: usize,
}

impl RecentAnalyses {
    pub fn get_or_analyze(&mut self, router: &Router, sql: &[u8]) -> Arc<Analysis> {
        if let Some((_, hit)) = self.entries.iter().find(|(text, _)| **text == *sql) {
            return hit.clone();
        }
        let analysis = router.analyze(sql);
        if sql.len() <= MAX_TEXT {
            let entry = (Box::from(sql), analysis.clone());
            if self.entries.len() < ENTRIES {
                self.entries.push(entry);
            } else {
                self.entries[self.next] = entry;
                self.next = (self.next + 1) % ENTRIES;
            }
        }
        analysis
    }
}
