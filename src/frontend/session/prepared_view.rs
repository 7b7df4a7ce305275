//! `pg_prepared_statements` as the client's own (see `router::prepared_view`): a
//! statement that reads it goes to its server with the view replaced by the client's
//! statements under the client's names, each prepared on that server first so that
//! it shows. Its text is the one the statement has from then on: a statement prepared
//! on it lists the client's statements as they were at its Parse.

use std::sync::Arc;

use super::Session;
use super::extended::prepare_on;
use crate::router::{Analysis, rewrite_prepared_view};

impl Session {
    /// The text that goes to the attached server for `analysis`: its own, or with
    /// `pg_prepared_statements` replaced (`None` when it does not read the view).
    pub(super) fn text_for_server(&mut self, analysis: &Arc<Analysis>) -> Option<String> {
        if analysis.prepared_view.is_empty() {
            return None;
        }
        let mut own = Vec::new();
        for (name, statement) in self.statements.iter() {
            let stmt = statement.stmt.clone();
            if let Some(a) = self.server.as_mut() {
                prepare_on(&mut a.conn, &stmt);
            }
            let server = String::from_utf8_lossy(&stmt.server_name).into_owned();
            own.push((server, String::from_utf8_lossy(name).into_owned()));
        }
        Some(rewrite_prepared_view(analysis.text(), &analysis.prepared_view, &own))
    }
}
