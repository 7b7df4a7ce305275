//! The admin console's commands, parsed from a statement's text: PgBouncer's words
//! (case-insensitive, a trailing `;` allowed) and pgtenant's own.

pub use super::fleet_request::FleetRequest;
use crate::tenancy::PlacementStep;

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
    /// `SHOW TENANTS [SHARD n] [ORDER BY column] [LIMIT k]`: per-tenant statistics.
    Tenants {
        shard: Option<u16>,
        order_by: Option<String>,
        limit: Option<usize>,
    },
    Routing,
    Lanes,
    Pauses,
    Moves,
    Help,
    /// PgBouncer's `SHOW TOTALS`: SHOW STATS over every database, as name/value rows.
    Totals,
    /// PgBouncer's `SHOW STATE`: active, paused, suspended.
    State,
}

/// What a PAUSE or RESUME names (a tenant as written: its key type is the proxy's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    All,
    Shard(u16),
    Tenant(String),
    /// PgBouncer's `PAUSE db`: a database clients ask for (a bare number is a shard).
    Database(String),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Show(Show),
    /// `PAUSE [[SHARD] n | TENANT id] [TIMEOUT seconds]`.
    Pause {
        scope: Scope,
        timeout_secs: Option<f64>,
    },
    /// `RESUME [[SHARD] n | TENANT id]`.
    Resume(Scope),
    /// `KILL CLIENT id` (or PgBouncer's `KILL_CLIENT id`): ends that client's session.
    KillClient(u64),
    /// `KILL db` (PgBouncer's): ends every client of that database and closes its
    /// server connections.
    KillDatabase(String),
    /// `RECONNECT [[SHARD] n]`: replace the server connections (all shards': `None`).
    Reconnect(Option<u16>),
    /// `SHUTDOWN`: the proxy stops as on SIGTERM; `WAIT_FOR_CLIENTS`: it stops
    /// accepting and ends once every client has left.
    Shutdown {
        wait_for_clients: bool,
    },
    /// `RELOAD`: the configuration file is read again.
    Reload,
    /// `PLACE TENANT id [LEASE seconds]`, `CONFIRM TENANT id`, `CANCEL TENANT id`
    /// (also `... PLACEMENT id`): a new tenant's place, through the catalog.
    Placement {
        tenant: i64,
        step: crate::tenancy::PlacementStep,
    },
    /// `MOVE TENANT id TO SHARD n [DATABASE name]`: an online move (catalog).
    Move {
        tenant: i64,
        shard: u16,
        database: Option<String>,
    },
    /// `CLEANUP MOVE id`, `ROLLBACK MOVE id`, `CANCEL MOVE id` (a rollback before the
    /// switch only).
    MoveRequest {
        id: i64,
        step: MoveStep,
    },
    /// `DISABLE db` / `ENABLE db` (PgBouncer's): refuse new clients of a database, or
    /// take them again.
    Disable(String),
    Enable(String),
    /// `WAIT_CLOSE [db]`: answers once the server connections a RECONNECT or RELOAD
    /// retired (of `db`, or all) have closed.
    WaitClose(Option<String>),
    /// DRAIN SHARD, REBALANCE, ISOLATE TENANT, PAUSE / RESUME REBALANCE, SHOW PLAN,
    /// SHOW BATCHES (see `tenancy::fleet`).
    Fleet(FleetRequest),
    /// An empty statement (only blanks or `;`).
    Empty,
}

/// What an operator asks of a running move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveStep {
    Cleanup,
    Rollback,
    Cancel,
}

/// Why a statement is not a console command.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("\"{0}\" is not an admin console command (SHOW HELP lists them)")]
    Unknown(String),
    #[error("SHOW {0} is not a console view (SHOW HELP lists them)")]
    UnknownView(String),
    #[error("SHOW needs a view name, as in SHOW POOLS (SHOW HELP lists them)")]
    ViewMissing,
    /// A PgBouncer command that has no meaning in pgtenant: why, and what to use.
    #[error("{command} is PgBouncer's and has no counterpart in pgtenant: {why}")]
    NotInPgtenant { command: &'static str, why: &'static str },
    #[error("SHOW TENANT needs a tenant id: SHOW TENANT 42")]
    TenantMissing,
    #[error("{0} is not available in the admin console yet")]
    NotYet(String),
    #[error("shard {0} is not in the directory")]
    UnknownShard(u16),
    #[error("\"{0}\" is not a tenant id of this proxy's key type")]
    BadTenant(String),
    #[error("{0}")]
    PauseEnded(String),
    #[error("no client has id {0} (SHOW CLIENTS lists them)")]
    UnknownClient(u64),
    #[error("the configuration was not reloaded; the running one is kept: {}", .0.join("; "))]
    ReloadRefused(Vec<String>),
    #[error("cannot read \"{0}\" (SHOW HELP lists the commands and their arguments)")]
    BadScope(String),
    #[error(transparent)]
    Placement(#[from] crate::tenancy::PlacementError),
    #[error(transparent)]
    Move(#[from] crate::tenancy::moves::MoveError),
    #[error(transparent)]
    Fleet(#[from] crate::tenancy::fleet::FleetError),
}

impl CommandError {
    pub fn sqlstate(&self) -> &'static str {
        use crate::protocol::sqlstate;
        match self {
            CommandError::Unknown(_)
            | CommandError::TenantMissing
            | CommandError::ViewMissing
            | CommandError::BadScope(_) => sqlstate::SYNTAX_ERROR,
            CommandError::NotInPgtenant { .. } => sqlstate::FEATURE_NOT_SUPPORTED,
            CommandError::UnknownView(_) => sqlstate::UNDEFINED_OBJECT,
            CommandError::NotYet(_) => sqlstate::FEATURE_NOT_SUPPORTED,
            CommandError::UnknownShard(_) | CommandError::UnknownClient(_) => sqlstate::UNDEFINED_OBJECT,
            CommandError::BadTenant(_) => sqlstate::INVALID_PARAMETER_VALUE,
            CommandError::PauseEnded(_) => sqlstate::QUERY_CANCELED,
            CommandError::ReloadRefused(_) => sqlstate::CONFIG_FILE_ERROR,
            CommandError::Move(e) => {
                use crate::tenancy::moves::MoveError as M;
                match e {
                    M::NoCatalog | M::NoDatabase { .. } | M::NoLogin | M::Refused(_) => {
                        sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE
                    }
                    M::BadArgument(_) => sqlstate::INVALID_PARAMETER_VALUE,
                    M::Busy(_) => sqlstate::OBJECT_IN_USE,
                    M::UnknownMove(_) => sqlstate::UNDEFINED_OBJECT,
                    M::Catalog(_) | M::Shard { .. } => sqlstate::UNABLE_TO_CONNECT,
                }
            }
            CommandError::Fleet(e) => {
                use crate::tenancy::fleet::FleetError as F;
                match e {
                    F::Plan(_) | F::TooManyTenants { .. } | F::NotPausable { .. } | F::NoDatabase => {
                        sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE
                    }
                    F::Move(m) => CommandError::Move(m.clone()).sqlstate(),
                    F::UnknownBatch(_) => sqlstate::UNDEFINED_OBJECT,
                    F::Catalog(_) | F::Shard { .. } => sqlstate::UNABLE_TO_CONNECT,
                }
            }
            CommandError::Placement(e) => {
                use crate::tenancy::PlacementError as P;
                match e {
                    P::NoCatalog | P::NotPending(_) => sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
                    P::NoRoom { .. } => sqlstate::CONFIGURATION_LIMIT_EXCEEDED,
                    P::BadArgument(_) => sqlstate::INVALID_PARAMETER_VALUE,
                    P::Catalog(_) => sqlstate::UNABLE_TO_CONNECT,
                }
            }
        }
    }
}

/// The commands that steer the proxy, which this console does not do yet.
const NOT_YET: [&str; 1] = ["set"];

pub fn parse(sql: &str) -> Result<Command, CommandError> {
    let text = sql.trim().trim_end_matches(';').trim();
    let words: Vec<&str> = text.split_whitespace().collect();
    let Some(first) = words.first() else { return Ok(Command::Empty) };
    let first = first.to_ascii_lowercase();
    if NOT_YET.contains(&first.as_str()) {
        return Err(CommandError::NotYet(first.to_ascii_uppercase()));
    }
    // Fleet commands, before PAUSE and RESUME (`PAUSE REBALANCE` is one of them).
    let spaced = text.replace(',', " ");
    let lower: Vec<String> = spaced.split_whitespace().map(str::to_ascii_lowercase).collect();
    let lower: Vec<&str> = lower.iter().map(String::as_str).collect();
    if let Some(request) = super::fleet_request::parse(&lower) {
        let mut request = request.map_err(|()| CommandError::BadScope(text.chars().take(80).collect()))?;
        // A database name keeps its case, as MOVE TENANT's does.
        if let FleetRequest::Run { database: database @ Some(_), .. } = &mut request {
            let at = lower.iter().position(|w| *w == "database").map_or(0, |i| i + 1);
            *database = spaced.split_whitespace().nth(at).map(unquote);
        }
        return Ok(Command::Fleet(request));
    }
    if first == "pause" || first == "resume" {
        return pause_or_resume(&first, &words[1..]);
    }
    let rest: Vec<String> = words[1..].iter().map(|w| w.to_ascii_lowercase()).collect();
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let bad = || CommandError::BadScope(text.chars().take(80).collect());
    match (first.as_str(), rest.as_slice()) {
        ("kill", ["client", id]) | ("kill_client", [id]) => {
            return Ok(Command::KillClient(id.parse().map_err(|_| bad())?));
        }
        ("kill", [_]) => return Ok(Command::KillDatabase(unquote(words[1]))),
        ("kill", _) | ("kill_client", _) => return Err(bad()),
        ("reconnect", []) => return Ok(Command::Reconnect(None)),
        ("reconnect", ["shard", n] | [n]) => {
            return Ok(Command::Reconnect(Some(n.parse().map_err(|_| bad())?)));
        }
        ("reconnect", _) => return Err(bad()),
        ("shutdown", []) => return Ok(Command::Shutdown { wait_for_clients: false }),
        ("shutdown", ["wait_for_clients"]) => return Ok(Command::Shutdown { wait_for_clients: true }),
        ("reload", []) => return Ok(Command::Reload),
        ("disable", [_]) => return Ok(Command::Disable(unquote(words[1]))),
        ("enable", [_]) => return Ok(Command::Enable(unquote(words[1]))),
        ("wait_close", []) => return Ok(Command::WaitClose(None)),
        ("wait_close", [_]) => return Ok(Command::WaitClose(Some(unquote(words[1])))),
        ("disable", _) | ("enable", _) | ("wait_close", _) => return Err(bad()),
        ("suspend", []) => {
            return Err(CommandError::NotInPgtenant {
                command: "SUSPEND",
                why: "it readies PgBouncer's socket hand-over (-R); pgtenant restarts without one (with reuse_port a new \
                      process binds beside the old, and SHUTDOWN WAIT_FOR_CLIENTS lets the old one drain)",
            });
        }
        ("place", ["tenant", id]) => return placement_of(id, PlacementStep::Place { lease_secs: 300 }),
        ("place", ["tenant", id, "lease", secs]) => {
            let lease_secs = secs.parse().ok().filter(|s: &i32| *s >= 1).ok_or_else(bad)?;
            return placement_of(id, PlacementStep::Place { lease_secs });
        }
        ("confirm", ["tenant" | "placement", id]) => return placement_of(id, PlacementStep::Confirm),
        ("cancel", ["tenant" | "placement", id]) => return placement_of(id, PlacementStep::Cancel),
        ("move", ["tenant", id, "to", "shard", n])
        | ("move", ["tenant", id, "to", "shard", n, "database", _]) => {
            let tenant = id.parse().map_err(|_| CommandError::BadTenant(id.to_string()))?;
            let shard = n.parse().map_err(|_| bad())?;
            let database = words.get(7).map(|w| unquote(w));
            return Ok(Command::Move { tenant, shard, database });
        }
        ("cleanup", ["move", id]) => return move_request(id, MoveStep::Cleanup),
        ("rollback", ["move", id]) => return move_request(id, MoveStep::Rollback),
        ("cancel", ["move", id]) => return move_request(id, MoveStep::Cancel),
        ("place", _) | ("confirm", _) | ("cancel", _) | ("move", _) | ("cleanup", _) => return Err(bad()),
        ("shutdown", _) => return Err(bad()),
        _ => {}
    }
    if first != "show" {
        return Err(CommandError::Unknown(text.chars().take(80).collect()));
    }
    let Some(what) = words.get(1).map(|w| w.to_ascii_lowercase()) else {
        return Err(CommandError::ViewMissing);
    };
    let socket_level = "pgtenant's sockets are tokio's: SHOW CLIENTS and SHOW SERVERS list every connection, \
                        /metrics their traffic";
    let show = match (what.as_str(), words.len()) {
        ("totals", 2) => Show::Totals,
        ("state", 2) => Show::State,
        ("mem", 2) => {
            return Err(CommandError::NotInPgtenant {
                command: "SHOW MEM",
                why: "it lists PgBouncer's slab caches; pgtenant has none (its memory is bounded per client by \
                      max_message_size and max_client_statement_bytes)",
            });
        }
        ("fds", 2) => {
            return Err(CommandError::NotInPgtenant {
                command: "SHOW FDS",
                why: "it serves PgBouncer's socket hand-over (-R); pgtenant restarts without one",
            });
        }
        ("sockets", 2) => {
            return Err(CommandError::NotInPgtenant { command: "SHOW SOCKETS", why: socket_level });
        }
        ("active_sockets", 2) => {
            return Err(CommandError::NotInPgtenant { command: "SHOW ACTIVE_SOCKETS", why: socket_level });
        }
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
        ("pauses", 2) => Show::Pauses,
        ("moves", 2) => Show::Moves,
        ("help", 2) => Show::Help,
        ("tenant", 3) => Show::Tenant(unquote(words[2])),
        ("tenants", _) => tenants(&words[2..])?,
        ("tenant", 2) => return Err(CommandError::TenantMissing),
        _ => return Err(CommandError::UnknownView(words[1..].join(" ").chars().take(80).collect())),
    };
    Ok(Command::Show(show))
}

/// `[SHARD n] [ORDER BY column] [LIMIT k]`, in that order, each optional. The column
/// is checked by the view (`show::tenants`).
fn tenants(words: &[&str]) -> Result<Show, CommandError> {
    let bad = || CommandError::BadScope(words.join(" ").chars().take(80).collect());
    let lower: Vec<String> = words.iter().map(|w| w.to_ascii_lowercase()).collect();
    let mut at = 0;
    let mut shard = None;
    if lower.get(at).map(String::as_str) == Some("shard") {
        shard = Some(words.get(at + 1).and_then(|n| n.parse().ok()).ok_or_else(bad)?);
        at += 2;
    }
    let mut order_by = None;
    if lower.get(at).map(String::as_str) == Some("order") {
        if lower.get(at + 1).map(String::as_str) != Some("by") {
            return Err(bad());
        }
        let column = lower.get(at + 2).cloned().ok_or_else(bad)?;
        if super::show::tenants::order_column(&column).is_none() {
            return Err(bad());
        }
        order_by = Some(column);
        at += 3;
    }
    let mut limit = None;
    if lower.get(at).map(String::as_str) == Some("limit") {
        limit = Some(words.get(at + 1).and_then(|n| n.parse().ok()).ok_or_else(bad)?);
        at += 2;
    }
    if at != words.len() {
        return Err(bad());
    }
    Ok(Show::Tenants { shard, order_by, limit })
}

fn pause_or_resume(verb: &str, words: &[&str]) -> Result<Command, CommandError> {
    let bad = || CommandError::BadScope(words.join(" ").chars().take(80).collect());
    let lower: Vec<String> = words.iter().map(|w| w.to_ascii_lowercase()).collect();
    let (scope, rest) = match lower.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] | ["timeout", ..] => (Scope::All, 0),
        ["shard", n, ..] => (Scope::Shard(n.parse().map_err(|_| bad())?), 2),
        ["tenant", _, ..] => (Scope::Tenant(unquote(words[1])), 2),
        // A number is a shard; anything else a database (PgBouncer's PAUSE db).
        [n, ..] => match n.parse() {
            Ok(shard) => (Scope::Shard(shard), 1),
            Err(_) => (Scope::Database(unquote(words[0])), 1),
        },
    };
    let timeout_secs = match &lower[rest..] {
        [] => None,
        [t, secs] if t == "timeout" && verb == "pause" => {
            Some(secs.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0).ok_or_else(bad)?)
        }
        _ => return Err(bad()),
    };
    Ok(if verb == "pause" { Command::Pause { scope, timeout_secs } } else { Command::Resume(scope) })
}

/// A placement command for tenant `id` (a bigint key: placement uses the catalog's map).
fn placement_of(id: &str, step: PlacementStep) -> Result<Command, CommandError> {
    let tenant = id.parse().map_err(|_| CommandError::BadTenant(id.to_string()))?;
    Ok(Command::Placement { tenant, step })
}

fn move_request(id: &str, step: MoveStep) -> Result<Command, CommandError> {
    let id = id.parse().map_err(|_| CommandError::BadScope(format!("move id {id}")))?;
    Ok(Command::MoveRequest { id, step })
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
    ("SHOW TENANT <id>", "how a tenant resolves: source, shard, node, routing version, clients, its figures"),
    (
        "SHOW TENANTS [SHARD n] [ORDER BY column] [LIMIT k]",
        "the heaviest tenants of each shard: transactions (with the bound of their error), requests, server time, bytes, errors, and the last window's",
    ),
    ("SHOW ROUTING", "routing version served and the directory in use"),
    ("SHOW LANES", "pipelined lanes per pool"),
    ("SHOW PAUSES", "the pauses in force"),
    ("SHOW TOTALS", "SHOW STATS over every database, as name and value"),
    ("SHOW STATE", "whether the proxy is active, paused or suspended"),
    (
        "PAUSE [[SHARD] n | TENANT id | db] [TIMEOUT s]",
        "hold new transactions of the scope; answers once running ones end",
    ),
    ("RESUME [[SHARD] n | TENANT id | db]", "lift a pause (RESUME alone lifts every pause)"),
    ("DISABLE db", "refuse new clients of a database (55000); connected ones go on"),
    ("ENABLE db", "take new clients of a database again"),
    ("WAIT_CLOSE [db]", "answer once the server connections a RECONNECT or RELOAD retired have closed"),
    ("KILL CLIENT id", "end a client's session (57P01), its transaction rolled back"),
    ("KILL db", "end every client of a database and close its server connections"),
    ("RECONNECT [[SHARD] n]", "replace server connections: idle ones now, busy ones when given back"),
    ("SHUTDOWN", "stop as on SIGTERM: stop accepting, let transactions finish, end idle sessions"),
    ("SHUTDOWN WAIT_FOR_CLIENTS", "stop accepting, and stop once every client has left"),
    ("RELOAD", "read the configuration file again: users, shards, ranges, tenant map, tenant limits"),
    (
        "PLACE TENANT id [LEASE s]",
        "reserve a new tenant's place on the fullest active shard with room (catalog)",
    ),
    ("CONFIRM TENANT id", "map a reserved tenant to its shard: routed there from now on"),
    ("CANCEL TENANT id", "give a pending reservation's place back"),
    ("SHOW MOVES", "tenant moves: phase, rows copied, lag, pause, attempts, errors"),
    (
        "MOVE TENANT id TO SHARD n [DATABASE name]",
        "move a tenant's rows to another shard while it works (copy, catch up, brief pause, switch)",
    ),
    ("CLEANUP MOVE id", "after a switch: delete the tenant's rows left on the source"),
    ("ROLLBACK MOVE id", "before cleanup: route the tenant back to its source, nothing lost"),
    ("CANCEL MOVE id", "before the switch: stop the move and drop its copy"),
    (
        "DRAIN SHARD n [DATABASE name] [PARALLEL k] [BANDWIDTH n MB] [DRY RUN]",
        "move every tenant off shard n (it takes no new ones), k moves at a time within a copy budget a second; DRY RUN shows the plan only",
    ),
    (
        "REBALANCE [SHARDS a, b, ...] [DATABASE name] [PARALLEL k] [BANDWIDTH n MB] [DRY RUN]",
        "even out the shards' load (every proxy's per-tenant counts), a new empty shard included",
    ),
    (
        "ISOLATE TENANT id [TO SHARD n] [DATABASE name] [DRY RUN]",
        "move one tenant to a shard of its own: n, or an active shard that holds no tenant",
    ),
    ("SHOW PLAN [batch]", "a fleet batch's moves (the newest batch's by default)"),
    (
        "SHOW BATCHES",
        "fleet batches: command, state, moves done and failed, longest pause, bytes copied, budget, error",
    ),
    ("PAUSE REBALANCE [batch]", "start no more moves of a batch (or of all); running ones finish"),
    ("RESUME REBALANCE [batch]", "go on with a paused batch"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pgbouncer_words_in_any_case_with_a_trailing_semicolon() {
        assert_eq!(parse("show pools;"), Ok(Command::Show(Show::Pools)));
        assert_eq!(parse("  SHOW   Stats_Totals "), Ok(Command::Show(Show::StatsTotals)));
        assert_eq!(parse("show tenant 42"), Ok(Command::Show(Show::Tenant("42".into()))));
        let tenants = |shard, order_by: Option<&str>, limit| {
            Ok(Command::Show(Show::Tenants { shard, order_by: order_by.map(str::to_string), limit }))
        };
        assert_eq!(parse("SHOW TENANTS"), tenants(None, None, None));
        assert_eq!(
            parse("show tenants shard 3 order by ERRORS limit 5;"),
            tenants(Some(3), Some("errors"), Some(5))
        );
        assert_eq!(parse("show tenants limit 2"), tenants(None, None, Some(2)));
        for bad in [
            "show tenants shard x",
            "show tenants order errors",
            "show tenants limit 2 shard 1",
            "show tenants order by tenant",
            "show tenants order by nonsense",
        ] {
            assert!(matches!(parse(bad), Err(CommandError::BadScope(_))), "{bad}");
        }
        assert_eq!(parse("show tenant 'o''brien'"), Ok(Command::Show(Show::Tenant("o'brien".into()))));
        assert_eq!(parse(" ; "), Ok(Command::Empty));
        assert_eq!(parse("show tenant"), Err(CommandError::TenantMissing));
        assert!(matches!(parse("show nothing"), Err(CommandError::UnknownView(_))));
        assert!(matches!(parse("select 1"), Err(CommandError::Unknown(_))));
        assert_eq!(parse("RELOAD;"), Ok(Command::Reload));
        assert_eq!(parse("SET x = 1"), Err(CommandError::NotYet("SET".into())));
        assert_eq!(parse("PAUSE"), Ok(Command::Pause { scope: Scope::All, timeout_secs: None }));
        assert_eq!(
            parse("pause 2 timeout 1.5"),
            Ok(Command::Pause { scope: Scope::Shard(2), timeout_secs: Some(1.5) })
        );
        assert_eq!(
            parse("PAUSE TENANT 42;"),
            Ok(Command::Pause { scope: Scope::Tenant("42".into()), timeout_secs: None })
        );
        assert_eq!(parse("resume shard 1"), Ok(Command::Resume(Scope::Shard(1))));
        // A name is a database (PgBouncer's PAUSE db), kept as written.
        assert_eq!(
            parse("PAUSE App"),
            Ok(Command::Pause { scope: Scope::Database("App".into()), timeout_secs: None })
        );
        assert_eq!(parse("resume app"), Ok(Command::Resume(Scope::Database("app".into()))));
        assert!(matches!(parse("PAUSE shard x"), Err(CommandError::BadScope(_))));
        assert_eq!(parse("DISABLE app"), Ok(Command::Disable("app".into())));
        assert_eq!(parse("enable app;"), Ok(Command::Enable("app".into())));
        assert_eq!(parse("WAIT_CLOSE"), Ok(Command::WaitClose(None)));
        assert_eq!(parse("show totals"), Ok(Command::Show(Show::Totals)));
        assert!(matches!(parse("SHOW"), Err(CommandError::ViewMissing)));
        assert!(matches!(parse("suspend"), Err(CommandError::NotInPgtenant { .. })));
        assert!(matches!(parse("RESUME 1 TIMEOUT 3"), Err(CommandError::BadScope(_))));
        assert_eq!(parse("kill client 12"), Ok(Command::KillClient(12)));
        assert_eq!(parse("KILL_CLIENT 3"), Ok(Command::KillClient(3)));
        assert_eq!(parse("KILL app"), Ok(Command::KillDatabase("app".into())));
        assert_eq!(parse("reconnect shard 2"), Ok(Command::Reconnect(Some(2))));
        assert_eq!(parse("RECONNECT"), Ok(Command::Reconnect(None)));
        assert_eq!(parse("shutdown"), Ok(Command::Shutdown { wait_for_clients: false }));
        assert_eq!(parse("SHUTDOWN WAIT_FOR_CLIENTS"), Ok(Command::Shutdown { wait_for_clients: true }));
        assert_eq!(
            parse("move tenant 77 to shard 2 database App"),
            Ok(Command::Move { tenant: 77, shard: 2, database: Some("App".into()) })
        );
        assert_eq!(
            parse("MOVE TENANT 7 TO SHARD 1;"),
            Ok(Command::Move { tenant: 7, shard: 1, database: None })
        );
        assert!(matches!(parse("MOVE TENANT 7 SHARD 1"), Err(CommandError::BadScope(_))));
        assert_eq!(parse("cleanup move 3"), Ok(Command::MoveRequest { id: 3, step: MoveStep::Cleanup }));
        assert_eq!(parse("CANCEL MOVE 4"), Ok(Command::MoveRequest { id: 4, step: MoveStep::Cancel }));
        assert_eq!(parse("ROLLBACK MOVE 5"), Ok(Command::MoveRequest { id: 5, step: MoveStep::Rollback }));
        assert_eq!(parse("show moves"), Ok(Command::Show(Show::Moves)));
    }

    #[test]
    fn fleet_commands_keep_the_database_name_as_written() {
        let Ok(Command::Fleet(FleetRequest::Run { database, .. })) =
            parse("drain shard 3 database App dry run;")
        else {
            panic!("not read as a fleet command")
        };
        assert_eq!(database.as_deref(), Some("App"));
        assert!(matches!(parse("REBALANCE now"), Err(CommandError::BadScope(_))));
        // PAUSE of a shard is still the pause it was.
        assert!(matches!(parse("PAUSE SHARD 1"), Ok(Command::Pause { .. })));
    }
}
