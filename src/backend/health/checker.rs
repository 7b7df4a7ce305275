//! The checks: a task per shard node asks it, every `interval_ms`, whether it is in
//! recovery, where its WAL is and on which timeline, over a connection of its own
//! (tokio-postgres, kept between checks), and records the answer in the view. A
//! supervisor starts and stops node tasks as the topology changes. Nothing here runs
//! on a client's path.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;

use super::view::{CheckOutcome, HealthView, NodeKey, NodeState, Observation, ObservedRole, is_notable};
use crate::config::{Config, NodeConfig};
use crate::directory::Topology;

/// One query: role, WAL position (replayed on a replica, written on a primary),
/// timeline (from the current WAL file's name on a primary, which changes at promotion
/// at once; from the last checkpoint on a replica), the WAL a replica has received, and
/// the newest position a primary's synchronous standbys confirmed (see `SYNC_SQL`).
const CHECK_SQL: &str = "SELECT pg_is_in_recovery(), \
     (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text, \
     CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint()) \
          ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END, \
     (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() END)::text, ";

/// The last column of `CHECK_SQL` for a checker that may read the synchronous
/// standbys' positions (`pg_read_all_stats`); NULL for one that may not: the
/// positions would read NULL, and where `sql/session_privacy.sql` revoked the
/// function from other roles, naming it at all fails the query.
const SYNC_SQL: &str = "(CASE WHEN NOT pg_is_in_recovery() THEN (SELECT max(flush_lsn) FROM \
     pg_catalog.pg_stat_get_wal_senders() WHERE sync_state IN ('sync', 'quorum')) END)::text";

/// Whether the checker's role may read the synchronous standbys' positions.
const MAY_READ_SYNC_SQL: &str = "SELECT pg_has_role('pg_read_all_stats', 'USAGE') \
     AND has_function_privilege('pg_catalog.pg_stat_get_wal_senders()', 'EXECUTE')";

/// A checker's connection and the query it asks with.
pub(super) struct Checker {
    client: tokio_postgres::Client,
    sql: String,
}

/// How often nodes are checked while requests wait for a primary.
const HOLDING_INTERVAL: Duration = Duration::from_millis(100);

/// How the checks log in and how often they run.
#[derive(Clone)]
pub(super) struct CheckSettings {
    user: String,
    password: Option<String>,
    dbname: String,
    pub(super) interval: Duration,
    pub(super) timeout: Duration,
}

impl CheckSettings {
    pub(super) fn from(config: &Config) -> Self {
        let health = &config.health;
        let first = config.users.first();
        Self {
            user: health
                .user
                .clone()
                .or_else(|| first.map(|u| u.server_user().to_string()))
                .or_else(|| config.auth.user.clone())
                .unwrap_or_else(|| "postgres".into()),
            password: health.password.clone().or_else(|| match first {
                Some(u) => u.server_password().map(str::to_string),
                None => config.auth.password.clone(),
            }),
            dbname: health.dbname.clone(),
            interval: Duration::from_millis(health.interval_ms.max(10)),
            timeout: Duration::from_millis(health.timeout_ms.max(10)),
        }
    }
}

/// Runs the checks for as long as `topology` answers (it holds the proxy weakly).
/// `went_down` is told of each node that goes down, so that its idle connections
/// are closed.
pub fn spawn(
    view: Arc<HealthView>,
    config: &Config,
    topology: impl Fn() -> Option<Arc<Topology>> + Send + 'static,
    went_down: impl Fn(&NodeKey) + Send + Sync + 'static,
) -> JoinHandle<()> {
    let settings = CheckSettings::from(config);
    let went_down: Arc<dyn Fn(&NodeKey) + Send + Sync> = Arc::new(went_down);
    tokio::spawn(async move {
        let mut tasks: HashMap<NodeKey, JoinHandle<()>> = HashMap::new();
        let mut every = tokio::time::interval(settings.interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(topology) = topology() else { break };
            let mut wanted: HashMap<NodeKey, NodeConfig> = HashMap::new();
            for id in topology.shard_ids() {
                for node in topology.shard(id).map(|s| s.nodes.as_slice()).unwrap_or_default() {
                    wanted.insert(NodeKey::of(id, node), node.clone());
                }
            }
            tasks.retain(|key, task| {
                let keep = wanted.contains_key(key) && !task.is_finished();
                if !keep {
                    task.abort();
                }
                keep
            });
            view.retain(|key| wanted.contains_key(key));
            for (key, node) in wanted {
                if let std::collections::hash_map::Entry::Vacant(slot) = tasks.entry(key) {
                    let key = slot.key().clone();
                    let task =
                        watch_node(Arc::downgrade(&view), key, node, settings.clone(), went_down.clone());
                    slot.insert(tokio::spawn(task));
                }
            }
        }
        for task in tasks.values() {
            task.abort();
        }
    })
}

async fn watch_node(
    view: Weak<HealthView>,
    key: NodeKey,
    node: NodeConfig,
    settings: CheckSettings,
    went_down: Arc<dyn Fn(&NodeKey) + Send + Sync>,
) {
    let mut client: Option<Checker> = None;
    let mut first = true;
    loop {
        if !std::mem::take(&mut first) {
            // While requests wait for a primary, or the shard has none, every node is
            // asked ten times as often, so that a promotion is seen within about 100 ms.
            // The first request to wait cuts a longer pause short.
            let Some(v) = view.upgrade() else { return };
            let hold_began = v.hold_began();
            let hurry = v.holding() || !v.shard_has_primary_up(key.shard);
            let pause = if hurry { settings.interval.min(HOLDING_INTERVAL) } else { settings.interval };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = hold_began => {}
            }
        }
        // Positions are stamped with when the check began: what it read is at least what
        // had committed by then (read-your-writes relies on it).
        let began_ms = crate::backend::coarse_clock::now_ms();
        let outcome = match tokio::time::timeout(settings.timeout, check(&mut client, &node, &settings)).await
        {
            Ok(outcome) => outcome,
            Err(_elapsed) => CheckOutcome::Failed,
        };
        if !matches!(outcome, CheckOutcome::Answered(_)) {
            client = None;
        }
        let Some(view) = view.upgrade() else { return };
        let (before, after) = view.record_checked(&key, outcome, began_ms);
        if before == NodeState::Unchecked && matches!(after, NodeState::Up { .. }) {
            tracing::info!(shard = key.shard, node = %format!("{}:{}", key.host, key.port), ?after, "shard node checked");
        } else if is_notable(before, after) {
            tracing::warn!(shard = key.shard, node = %format!("{}:{}", key.host, key.port), ?before, ?after, "shard node changed state");
        }
        if after == NodeState::Down && before != NodeState::Down {
            went_down(&key);
        }
    }
}

/// A connection to `node` as the checks log in.
pub(super) async fn connect(
    node: &NodeConfig,
    settings: &CheckSettings,
    purpose: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut pg = tokio_postgres::Config::new();
    pg.host(&node.host)
        .port(node.port)
        .user(&settings.user)
        .dbname(&settings.dbname)
        .application_name(purpose)
        .connect_timeout(settings.timeout);
    if let Some(password) = &settings.password {
        pg.password(password);
    }
    let (client, connection) = pg.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

pub(super) async fn check(
    checker: &mut Option<Checker>,
    node: &NodeConfig,
    settings: &CheckSettings,
) -> CheckOutcome {
    if checker.as_ref().is_none_or(|c| c.client.is_closed()) {
        let connected = match connect(node, settings, "pgtenant health check").await {
            Ok(c) => c,
            Err(e) => return failure(&e),
        };
        let may_read_sync = match connected.query_one(MAY_READ_SYNC_SQL, &[]).await {
            // A server that answers something else (NULL, another type) reads no positions.
            Ok(row) => row.try_get::<_, Option<bool>>(0).ok().flatten().unwrap_or(false),
            Err(e) => return failure(&e),
        };
        let sync = if may_read_sync { SYNC_SQL } else { "NULL::text" };
        *checker = Some(Checker { client: connected, sql: format!("{CHECK_SQL}{sync}") });
    }
    let Some(c) = checker.as_ref() else { return CheckOutcome::Failed };
    match c.client.query_one(&c.sql, &[]).await {
        Ok(row) => {
            let in_recovery: bool = row.get(0);
            let lsn = lsn_at(&row, 1).unwrap_or(0);
            let timeline: Option<i32> = row.get(2);
            CheckOutcome::Answered(Observation {
                role: if in_recovery { ObservedRole::Replica } else { ObservedRole::Primary },
                timeline: timeline.unwrap_or(0).max(0) as u32,
                lsn,
                received: lsn_at(&row, 3).unwrap_or(lsn).max(lsn),
                sync_confirmed: lsn_at(&row, 4),
            })
        }
        Err(e) => failure(&e),
    }
}

fn lsn_at(row: &tokio_postgres::Row, column: usize) -> Option<u64> {
    row.get::<_, Option<String>>(column).as_deref().and_then(parse_lsn)
}

/// Refused connections count at once; a server shutting down or starting up, a broken
/// connection or a timeout after `fail_after`; anything else (credentials,
/// permissions) leaves the node unchecked.
fn failure(e: &tokio_postgres::Error) -> CheckOutcome {
    if let Some(db) = e.as_db_error() {
        use tokio_postgres::error::SqlState;
        let gone = [SqlState::ADMIN_SHUTDOWN, SqlState::CRASH_SHUTDOWN, SqlState::CANNOT_CONNECT_NOW];
        return match gone.contains(db.code()) || *db.code() == SqlState::TOO_MANY_CONNECTIONS {
            true => CheckOutcome::Failed,
            false => CheckOutcome::Unchecked,
        };
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => CheckOutcome::Refused,
                _ => CheckOutcome::Failed,
            };
        }
        source = cause.source();
    }
    CheckOutcome::Failed
}

/// `X/Y` as PostgreSQL writes an LSN.
fn parse_lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    Some((u64::from_str_radix(high, 16).ok()? << 32) | u64::from_str_radix(low, 16).ok()?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn lsns_parse_as_postgresql_writes_them() {
        assert_eq!(super::parse_lsn("0/1935FB8"), Some(0x1935FB8));
        assert_eq!(super::parse_lsn("16/B374D848"), Some((0x16 << 32) | 0xB374D848));
        assert_eq!(super::parse_lsn("nonsense"), None);
    }
}
