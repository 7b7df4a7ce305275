//! Errors clients received, by SQLSTATE class and by who raised them (a server, or
//! pgtenant itself), for the metrics: fixed counters for the classes operators watch,
//! one for the rest. Process-wide: every proxy in a process adds to the same ones.

use std::sync::atomic::{AtomicU64, Ordering};

/// The classes counted apart; anything else counts as "other".
pub const CLASSES: [&str; 16] =
    ["08", "0A", "22", "23", "25", "28", "3D", "40", "42", "53", "54", "55", "57", "58", "P0", "XX"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Raiser {
    Server,
    Proxy,
}

impl Raiser {
    pub fn name(self) -> &'static str {
        match self {
            Raiser::Server => "server",
            Raiser::Proxy => "pgtenant",
        }
    }
}

static SERVER: [AtomicU64; CLASSES.len() + 1] = [const { AtomicU64::new(0) }; CLASSES.len() + 1];
static PROXY: [AtomicU64; CLASSES.len() + 1] = [const { AtomicU64::new(0) }; CLASSES.len() + 1];

/// Counts an error with SQLSTATE `code` raised by `raiser`.
pub fn count(raiser: Raiser, code: &[u8]) {
    let class = code.get(..2).and_then(|c| CLASSES.iter().position(|k| k.as_bytes() == c));
    let counters = match raiser {
        Raiser::Server => &SERVER,
        Raiser::Proxy => &PROXY,
    };
    counters[class.unwrap_or(CLASSES.len())].fetch_add(1, Ordering::Relaxed);
}

/// Every (raiser, class, count), "other" last.
pub fn snapshot() -> Vec<(Raiser, &'static str, u64)> {
    let mut out = Vec::new();
    for (raiser, counters) in [(Raiser::Server, &SERVER), (Raiser::Proxy, &PROXY)] {
        for (i, n) in counters.iter().enumerate() {
            out.push((raiser, CLASSES.get(i).copied().unwrap_or("other"), n.load(Ordering::Relaxed)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_count_by_class_and_raiser() {
        let n =
            |raiser, class| snapshot().into_iter().find(|(r, c, _)| *r == raiser && *c == class).unwrap().2;
        let before = (n(Raiser::Server, "23"), n(Raiser::Proxy, "other"));
        count(Raiser::Server, b"23505");
        count(Raiser::Proxy, b"ZZ000");
        assert_eq!(n(Raiser::Server, "23"), before.0 + 1);
        assert_eq!(n(Raiser::Proxy, "other"), before.1 + 1);
    }
}
