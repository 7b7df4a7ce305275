//! The client's named prepared statements, with the bytes they hold counted: a
//! backend lets a client prepare until the server runs out of memory, but the proxy
//! serves every tenant from one process, so each client gets a byte budget
//! (`max_client_statement_bytes`) and a Parse past it is refused (53200) while the
//! session goes on.

use bytes::Bytes;

use super::ClientStatement;

/// What one entry costs beyond its texts (map slot, Arcs, analysis), roughly: it keeps
/// a client naming endless empty statements within the budget too.
const ENTRY_OVERHEAD: usize = 256;

pub(super) struct NamedStatements {
    map: super::FastMap<Bytes, ClientStatement>,
    bytes: usize,
    budget: usize,
}

/// A named statement would take the client past its budget.
#[derive(Debug)]
pub(super) struct OverBudget {
    pub held: usize,
    pub budget: usize,
}

fn cost(name: &[u8], query: &[u8], param_types: &[u8]) -> usize {
    name.len() + query.len() + param_types.len() + ENTRY_OVERHEAD
}

fn cost_of(name: &[u8], s: &ClientStatement) -> usize {
    cost(name, &s.stmt.query, &s.stmt.param_types)
}

impl NamedStatements {
    pub fn new(budget: usize) -> Self {
        Self { map: Default::default(), bytes: 0, budget }
    }

    /// Whether statement `name` may be (re)defined as `query` within the budget.
    pub fn check_room(&self, name: &[u8], query: &[u8], param_types: &[u8]) -> Result<(), OverBudget> {
        let replaced = self.map.get(name).map_or(0, |s| cost_of(name, s));
        let after = self.bytes - replaced + cost(name, query, param_types);
        if self.budget > 0 && after > self.budget {
            return Err(OverBudget { held: self.bytes, budget: self.budget });
        }
        Ok(())
    }

    /// Defines `name` (checked with `check_room` first).
    pub fn insert(&mut self, name: Bytes, statement: ClientStatement) {
        self.bytes += cost_of(&name, &statement);
        if let Some(old) = self.map.insert(name.clone(), statement) {
            self.bytes -= cost_of(&name, &old);
        }
    }

    /// How many statements it holds.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn get(&self, name: &[u8]) -> Option<&ClientStatement> {
        self.map.get(name)
    }

    pub fn get_key_value(&self, name: &[u8]) -> Option<(&Bytes, &ClientStatement)> {
        self.map.get_key_value(name)
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<ClientStatement> {
        let (key, old) = self.map.remove_entry(name)?;
        self.bytes -= cost_of(&key, &old);
        Some(old)
    }

    /// Every statement, with the client's name for it.
    pub fn iter(&self) -> impl Iterator<Item = (&Bytes, &ClientStatement)> {
        self.map.iter()
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.bytes = 0;
    }
}
