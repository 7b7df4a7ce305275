//! The admin console's commands, parsed from a statement's text: PgBouncer's words
//! (case-insensitive, a trailing `;` allowed) and pgtenant's own.

/// What a `SHOW` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Show {
    Pools,
    Clients,
    Servers,
    /// PgBouncer's `SHOW STATS`: totals and averages in one row per database.
    Stats,
    StatsTotals,
    StatsAverages,
    Databases,
    Config,
    Version,
    Lists,
    Users,
    Shards,
    Nodes,
    Tenant(String),
    Routing,
    Lanes,
    Help,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Show(Show),
    /// An empty statement (only blanks or `;`).
    Empty,
}

/// Why a statement is not a console command.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("unknown command \"{0}\" (the admin console answers SHOW commands; SHOW HELP lists them)")]
    Unknown(String),
    #[error("SHOW {0} is not a console view (SHOW HELP lists them)")]
    UnknownView(String),
    #[error("SHOW TENANT needs a tenant id: SHOW TENANT 42")]
    TenantMissing,
    #[error("{0} is not available in the admin console yet")]
    NotYet(String),
}

impl CommandError {
    pub fn sqlstate(&self) -> &'static str {
        use crate::protocol::sqlstate;
        match self {
            CommandError::Unknown(_) | CommandError::TenantMissing => sqlstate::SYNTAX_ERROR,
            CommandError::UnknownView(_) => sqlstate::UNDEFINED_OBJECT,
            CommandError::NotYet(_) => sqlstate::FEATURE_NOT_SUPPORTED,
        }
    }
}

/// The commands that steer the proxy, which this console does not do yet.
const NOT_YET: [&str; 7] = ["pause", "resume", "reload", "reconnect", "kill", "shutdown", "set"];

pub fn parse(sql: &str) -> Result<Command, CommandError> {
    let text = sql.trim().trim_end_matches(';').trim();
    let words: Vec<&str> = text.split_whitespace().collect();
    let Some(first) = words.first() else { return Ok(Command::Empty) };
    let first = first.to_ascii_lowercase();
    if NOT_YET.contains(&first.as_str()) {
        return Err(CommandError::NotYet(first.to_ascii_uppercase()));
    }
    if first != "show" {
        return Err(CommandError::Unknown(text.chars().take(80).collect()));
    }
    let what = words.get(1).map(|w| w.to_ascii_lowercase()).unwrap_or_default();
    let show = match (what.as_str(), words.len()) {
        ("pools", 2) => Show::Pools,
        ("clients", 2) => Show::Clients,
        ("servers", 2) => Show::Servers,
        ("stats", 2) => Show::Stats,
        ("stats_totals", 2) => Show::StatsTotals,
        ("stats_averages", 2) => Show::StatsAverages,
        ("databases", 2) => Show::Databases,
        ("config", 2) => Show::Config,
        ("version", 2) => Show::Version,
        ("lists", 2) => Show::Lists,
        ("users", 2) => Show::Users,
        ("shards", 2) => Show::Shards,
        ("nodes", 2) => Show::Nodes,
        ("routing", 2) => Show::Routing,
        ("lanes", 2) => Show::Lanes,
        ("help", 2) => Show::Help,
        ("tenant", 3) => Show::Tenant(unquote(words[2])),
        ("tenant", 2) => return Err(CommandError::TenantMissing),
        _ => return Err(CommandError::UnknownView(words[1..].join(" ").chars().take(80).collect())),
    };
    Ok(Command::Show(show))
}

/// `'acme'` or `acme` as the tenant's text.
fn unquote(word: &str) -> String {
    word.strip_prefix('\'').and_then(|w| w.strip_suffix('\'')).unwrap_or(word).replace("''", "'")
}

/// The console's views, for SHOW HELP.
pub const HELP: &[(&str, &str)] = &[
    ("SHOW POOLS", "clients and server connections per database and user (PgBouncer's columns)"),
    ("SHOW CLIENTS", "every client connection (PgBouncer's columns, with tenant and shard)"),
    ("SHOW SERVERS", "every server connection (PgBouncer's columns, with shard)"),
    ("SHOW STATS", "totals and averages per database (also STATS_TOTALS, STATS_AVERAGES)"),
    ("SHOW DATABASES", "every pool's node and limits, one row per database and node"),
    ("SHOW CONFIG", "the configuration in force, with defaults"),
    ("SHOW VERSION", "pgtenant's version"),
    ("SHOW LISTS", "counts of databases, users, pools, clients and servers"),
    ("SHOW USERS", "the configured users"),
    ("SHOW SHARDS", "shards: status, nodes, primary, pool use, tenants placed by rule"),
    ("SHOW NODES", "shard nodes: configured and observed role, health, timeline, lag"),
    ("SHOW TENANT <id>", "how a tenant resolves: source, shard, node, routing version, clients"),
    ("SHOW ROUTING", "routing version served and the directory in use"),
    ("SHOW LANES", "pipelined lanes per pool"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pgbouncer_words_in_any_case_with_a_trailing_semicolon() {
        assert_eq!(parse("show pools;"), Ok(Command::Show(Show::Pools)));
        assert_eq!(parse("  SHOW   Stats_Totals "), Ok(Command::Show(Show::StatsTotals)));
        assert_eq!(parse("show tenant 42"), Ok(Command::Show(Show::Tenant("42".into()))));
        assert_eq!(parse("show tenant 'o''brien'"), Ok(Command::Show(Show::Tenant("o'brien".into()))));
        assert_eq!(parse(" ; "), Ok(Command::Empty));
        assert_eq!(parse("show tenant"), Err(CommandError::TenantMissing));
        assert!(matches!(parse("show nothing"), Err(CommandError::UnknownView(_))));
        assert!(matches!(parse("select 1"), Err(CommandError::Unknown(_))));
        assert_eq!(parse("PAUSE"), Err(CommandError::NotYet("PAUSE".into())));
    }
}
