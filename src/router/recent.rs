//! The last few statement texts one session analyzed. Parameterized SQL (drivers,
//! ORMs, prepared statements) sends the same text again and again, so a repeat is
//! recognised by comparing bytes instead of analyzing again, and a text that differs
//! from a recent one only in its literal values shares its analysis (see `template`).
//! Per session, so no lock.

use std::collections::VecDeque;
use std::sync::Arc;

use super::analyze::Literals;
use super::{Analysis, Router, template};

/// pgbench's TPC-B script alone has 11 shapes (a negative number is two tokens).
const ENTRIES: usize = 16;
/// Longer texts are analyzed every time rather than kept.
const MAX_TEXT: usize = 4096;
/// The kept texts' bytes at most, per session: eight of the longest kept.
const MAX_KEPT_BYTES: usize = 8 * MAX_TEXT;

#[derive(Default)]
pub struct RecentAnalyses {
    /// Keyed by each analysis' own copy of its text (no second copy per new text; a
    /// text that was not valid UTF-8 differs from its copy and is analyzed again).
    /// Oldest first.
    entries: VecDeque<Arc<Analysis>>,
    /// The bytes of their texts.
    kept_bytes: usize,
    /// The position in `entries` of the last lookup's answer: a script's statements
    /// come round in the same order, so the entry after it is tried first (a hint
    /// only: positions move as entries come and go).
    last_found: usize,
    /// The analyses of the long texts of the request at hand, worked out off the
    /// runtime's threads before their messages were handled (`prime`): all of them, for
    /// a request of several Parses is analyzed at its Sync. Its messages are held
    /// meanwhile, so these add at most a copy of what the request holds.
    primed: Vec<Arc<Analysis>>,
}

impl RecentAnalyses {
    /// Whether `sql`'s analysis is at hand without analyzing it.
    pub fn holds(&self, sql: &[u8]) -> bool {
        self.primed.iter().chain(&self.entries).any(|a| a.sql.as_bytes() == sql)
    }

    /// Keeps the analysis of a long text for the lookups of that text; `new_request`
    /// (nothing of a request is held) forgets the earlier ones first.
    pub fn prime(&mut self, analysis: Arc<Analysis>, new_request: bool) {
        if new_request {
            self.primed.clear();
        }
        self.primed.push(analysis);
    }

    /// Forgets the primed analyses once their request has been handled.
    pub fn forget_primed(&mut self) {
        self.primed.clear();
    }

    pub fn get_or_analyze(&mut self, router: &Router, sql: &[u8]) -> Arc<Analysis> {
        // The entry after the last one found first, then most recent first: a
        // request's Parse is looked up again when it is forwarded.
        if let Some(hit) = self.serves_as_it_is(router, self.last_found + 1, sql) {
            return hit;
        }
        if let Some(at) = self.entries.iter().rposition(|a| a.sql.as_bytes() == sql) {
            self.last_found = at;
            return self.entries[at].clone();
        }
        if sql.len() > MAX_TEXT {
            if let Some(primed) = self.primed.iter().rev().find(|a| a.sql.as_bytes() == sql) {
                return primed.clone();
            }
            return router.analyze(sql);
        }
        let mut rebased = None;
        for (at, template) in self.entries.iter().enumerate().rev() {
            match template_serves(router, template, sql) {
                None => continue,
                Some(Serves::AsItIs) => {
                    self.last_found = at;
                    return template.clone();
                }
                Some(Serves::Rebased(literals)) => {
                    rebased = template::rebased(template, sql, literals);
                    if rebased.is_some() {
                        break;
                    }
                }
            }
        }
        let analysis = rebased.map(Arc::new).unwrap_or_else(|| router.analyze(sql));
        self.keep(analysis.clone());
        analysis
    }

    /// The entry at `at` (the first at the end of the list), if it is `sql`'s analysis
    /// as it is: the same text, or a template that serves it as it is.
    fn serves_as_it_is(&mut self, router: &Router, at: usize, sql: &[u8]) -> Option<Arc<Analysis>> {
        let at = if at < self.entries.len() { at } else { 0 };
        let entry = self.entries.get(at)?;
        let serves = entry.sql.as_bytes() == sql
            || (sql.len() <= MAX_TEXT && matches!(template_serves(router, entry, sql), Some(Serves::AsItIs)));
        if !serves {
            return None;
        }
        self.last_found = at;
        Some(entry.clone())
    }

    /// Keeps `analysis` as the newest; the oldest go while there are more than
    /// `ENTRIES` or their texts pass `MAX_KEPT_BYTES` (the newest, at most `MAX_TEXT`,
    /// always stays).
    fn keep(&mut self, analysis: Arc<Analysis>) {
        self.kept_bytes += analysis.sql.len();
        self.entries.push_back(analysis);
        while self.entries.len() > ENTRIES || self.kept_bytes > MAX_KEPT_BYTES {
            let Some(oldest) = self.entries.pop_front() else { break };
            self.kept_bytes -= oldest.sql.len();
        }
        self.last_found = self.entries.len().saturating_sub(1);
    }
}

/// How a kept analysis serves a text that differs from its own only in literal values.
enum Serves {
    /// None of the values is ever read (there is no tenant column to compare them
    /// with): the analysis serves as it is.
    AsItIs,
    /// Rebased on the text's own literals (which name its tenant).
    Rebased(Literals),
}

/// How `template` serves `sql`, if only literal values differ between them.
fn template_serves(router: &Router, template: &Analysis, sql: &[u8]) -> Option<Serves> {
    if template.mentions(router.tenant_column()) {
        template::literal_change(template, sql).map(Serves::Rebased)
    } else {
        template::is_literal_change(template, sql).then_some(Serves::AsItIs)
    }
}
