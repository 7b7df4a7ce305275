//! What a move does on the shards themselves: the preflight, row-filtered logical
//! replication from the source to the target (a publication of the tenant's rows, a
//! subscription that copies them and then applies every later change), the marker rows
//! that show how far the target has applied, and the cleanup of either side.

use futures_util::{SinkExt, StreamExt};
use tokio_postgres::Client;

use super::MoveError;
use crate::backend::quote_literal;

/// The table the markers go through: published with the tenant's rows, so a marker
/// applied on the target means every change committed on the source before it is too.
// One string, so one transaction: the lock makes two moves' set-ups in one database take
// turns (CREATE ... IF NOT EXISTS fails on a duplicate key when another makes it at once).
const MARKER_SQL: &str = "SELECT pg_advisory_xact_lock(hashtext('pgtenant.move_marker'));
     CREATE SCHEMA IF NOT EXISTS pgtenant;
     CREATE TABLE IF NOT EXISTS pgtenant.move_marker (
         move_id bigint NOT NULL, token bigint NOT NULL, at timestamptz NOT NULL DEFAULT now(),
         PRIMARY KEY (move_id, token))";

/// `name` as an SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A libpq connection string value.
pub fn conninfo_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// The moving tenant's rows, as a WHERE condition.
fn tenant_filter(column: &str, tenant: i64) -> String {
    format!("{} = {tenant}", quote_ident(column))
}

/// One table's columns: name and type, in the table's order (generated ones left out).
async fn columns(client: &Client, table: &str) -> Result<Vec<(String, String)>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
             WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
             ORDER BY a.attnum",
            &[&table],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The source's tables that hold the tenant column (quoted `schema.table`), checked for
/// a move to `target`: see `preflight`.
pub struct Preflight {
    pub tables: Vec<String>,
}

/// Checks that the tenant's rows can move from `source` to `target`: logical WAL on the
/// source; every table with the tenant column there exists on the target with the same
/// columns; on both, the tenant column is in the table's replica identity (else, once a
/// row-filtered publication exists, PostgreSQL refuses every UPDATE and DELETE of the
/// table on the source, for every tenant); the target holds none of the tenant's rows.
pub async fn preflight(
    source: &Client,
    target: &Client,
    (source_id, target_id): (u16, u16),
    column: &str,
    tenant: i64,
    copy_started: bool,
) -> Result<Preflight, MoveError> {
    let on_source = MoveError::shard(source_id);
    let on_target = MoveError::shard(target_id);
    let wal_level: String = source.query_one("SHOW wal_level", &[]).await.map_err(&on_source)?.get(0);
    if wal_level != "logical" {
        return Err(MoveError::Refused(format!(
            "shard {source_id} runs with wal_level = {wal_level}: moves replicate the tenant's rows and need wal_level = logical (postgresql.conf, then a restart)"
        )));
    }
    let tables: Vec<(String, String)> = source
        .query(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname), c.relkind::text
             FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE a.attname = $1 AND a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p')
               AND NOT c.relispartition AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pgtenant')
             ORDER BY 1",
            &[&column],
        )
        .await
        .map_err(&on_source)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    if tables.is_empty() {
        return Err(MoveError::Refused(format!(
            "shard {source_id} has no table with the tenant column {column}: nothing to move"
        )));
    }
    for (table, kind) in &tables {
        if kind == "p" {
            return Err(MoveError::Refused(format!(
                "{table} on shard {source_id} is partitioned: moves do not copy partitioned tables yet"
            )));
        }
        let mine = columns(source, table).await.map_err(&on_source)?;
        let exists: bool = target
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[table])
            .await
            .map_err(&on_target)?
            .get(0);
        if !exists {
            return Err(MoveError::Refused(format!(
                "table {table} is missing on shard {target_id}: create it there with the same columns first"
            )));
        }
        let theirs = columns(target, table).await.map_err(&on_target)?;
        if mine != theirs {
            let show = |c: &[(String, String)]| {
                c.iter().map(|(n, t)| format!("{n} {t}")).collect::<Vec<_>>().join(", ")
            };
            return Err(MoveError::Refused(format!(
                "table {table} differs between shard {source_id} ({}) and shard {target_id} ({}): give both the same columns first",
                show(&mine),
                show(&theirs)
            )));
        }
        for (client, shard) in [(source, source_id), (target, target_id)] {
            check_replica_identity(client, shard, table, column).await?;
        }
        let sql = format!("SELECT EXISTS (SELECT 1 FROM {table} WHERE {})", tenant_filter(column, tenant));
        let held: bool = target.query_one(&sql, &[]).await.map_err(&on_target)?.get(0);
        if held && !copy_started {
            return Err(MoveError::Refused(format!(
                "shard {target_id} already holds rows of tenant {tenant} in {table}: remove them first (left by an earlier copy?)"
            )));
        }
    }
    Ok(Preflight { tables: tables.into_iter().map(|(t, _)| t).collect() })
}

async fn check_replica_identity(
    client: &Client,
    shard: u16,
    table: &str,
    column: &str,
) -> Result<(), MoveError> {
    let row = client
        .query_one(
            "SELECT c.relreplident::text,
                    EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                            WHERE i.indrelid = c.oid AND a.attname = $2
                              AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))),
                    (SELECT string_agg(a.attname, ', ') FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                     WHERE i.indrelid = c.oid AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident)))
             FROM pg_class c WHERE c.oid = $1::text::regclass",
            &[&table, &column],
        )
        .await
        .map_err(MoveError::shard(shard))?;
    let (identity, has_column, key): (String, bool, Option<String>) = (row.get(0), row.get(1), row.get(2));
    if identity == "f" || has_column {
        return Ok(());
    }
    let now = match (identity.as_str(), key) {
        ("n", _) => "REPLICA IDENTITY NOTHING".to_string(),
        (_, Some(key)) => format!("a replica identity of ({key})"),
        (_, None) => "no primary key (so no replica identity)".to_string(),
    };
    Err(MoveError::Refused(format!(
        "table {table} on shard {shard} has {now}, without the tenant column {column}: once the move publishes the tenant's rows, PostgreSQL would refuse every UPDATE and DELETE of the table there, for every tenant. Fix: ALTER TABLE {table} REPLICA IDENTITY FULL, or a primary key that includes {column}"
    )))
}

/// One tenant's rows: where they are (quoted table names) and how to find them.
#[derive(Clone, Copy)]
pub struct TenantRows<'a> {
    pub tables: &'a [String],
    pub column: &'a str,
    pub tenant: i64,
}

/// Creates the publication on the source and the subscription on the target (which
/// copies the tenant's rows, then applies every later change); whatever exists from an
/// earlier try is kept.
pub async fn start_replication(
    source: &Client,
    target: &Client,
    (source_id, target_id): (u16, u16),
    (id, name): (i64, &str),
    rows: TenantRows<'_>,
    source_conninfo: &str,
) -> Result<(), MoveError> {
    let TenantRows { tables, column, tenant } = rows;
    let on_source = MoveError::shard(source_id);
    let on_target = MoveError::shard(target_id);
    source.batch_execute(MARKER_SQL).await.map_err(&on_source)?;
    target.batch_execute(MARKER_SQL).await.map_err(&on_target)?;
    let published = source
        .query_opt("SELECT 1 FROM pg_publication WHERE pubname = $1", &[&name])
        .await
        .map_err(&on_source)?
        .is_some();
    if !published {
        let filter = tenant_filter(column, tenant);
        let mut list: Vec<String> = tables.iter().map(|t| format!("TABLE {t} WHERE ({filter})")).collect();
        list.push(format!("TABLE pgtenant.move_marker WHERE (move_id = {id})"));
        // Never TRUNCATE: row filters do not apply to it.
        let sql = format!(
            "CREATE PUBLICATION {} FOR {} WITH (publish = 'insert, update, delete')",
            quote_ident(name),
            list.join(", ")
        );
        source.batch_execute(&sql).await.map_err(&on_source)?;
    }
    if !is_subscribed(target, target_id, name).await? {
        // The slot is made first, from a connection of the source that holds no
        // transaction ID: CREATE SUBSCRIPTION would make it while its own transaction
        // on the target is open, and a slot waits for every transaction writing on its
        // server. Two such set-ups in opposite directions between two servers (moves of
        // two catalogs, or two databases) would then wait for each other, for ever.
        source
            .execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')
                 WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)",
                &[&name],
            )
            .await
            .map_err(&on_source)?;
        let sql = format!(
            "CREATE SUBSCRIPTION {n} CONNECTION {c} PUBLICATION {n} \
             WITH (copy_data = true, create_slot = false, slot_name = {n})",
            n = quote_ident(name),
            c = quote_literal(source_conninfo)
        );
        target.batch_execute(&sql).await.map_err(&on_target)?;
    }
    Ok(())
}

/// Whether move `id`'s subscription exists on the target.
pub async fn is_subscribed(target: &Client, target_id: u16, name: &str) -> Result<bool, MoveError> {
    let row = target
        .query_opt("SELECT 1 FROM pg_subscription WHERE subname = $1", &[&name])
        .await
        .map_err(MoveError::shard(target_id))?;
    Ok(row.is_some())
}

/// How the copy stands on the target.
pub struct CopyState {
    /// Every table copied and replicating.
    pub ready: bool,
    /// Errors the subscription's workers met (each is retried; any means a problem).
    pub errors: i64,
    /// The tenant's rows on the target, and their size (sum of `pg_column_size`).
    pub rows: i64,
    pub bytes: i64,
}

pub async fn copy_state(
    target: &Client,
    target_id: u16,
    name: &str,
    rows: TenantRows<'_>,
) -> Result<CopyState, MoveError> {
    let on_target = MoveError::shard(target_id);
    let row = target
        .query_one(
            "SELECT count(*) FILTER (WHERE sr.srsubstate NOT IN ('r', 's')), count(*),
                    coalesce((SELECT st.apply_error_count + st.sync_error_count FROM pg_stat_subscription_stats st
                              WHERE st.subname = $1), 0)
             FROM pg_subscription s JOIN pg_subscription_rel sr ON sr.srsubid = s.oid WHERE s.subname = $1",
            &[&name],
        )
        .await
        .map_err(&on_target)?;
    let (pending, total, errors): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    let (rows, bytes) = tenant_size(target, rows).await.map_err(&on_target)?;
    Ok(CopyState { ready: total > 0 && pending == 0, errors, rows, bytes })
}

/// The tenant's rows in `tables` on the connected shard, and their size (the sum of
/// `pg_column_size` of each row): what a copy writes, and what a copy budget charges.
pub async fn tenant_size(client: &Client, rows: TenantRows<'_>) -> Result<(i64, i64), tokio_postgres::Error> {
    let TenantRows { tables, column, tenant } = rows;
    let (mut count, mut bytes) = (0, 0);
    for table in tables {
        let sql = format!(
            "SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)::bigint FROM {table} t WHERE {}",
            tenant_filter(column, tenant)
        );
        let counted = client.query_one(&sql, &[]).await?;
        count += counted.get::<_, i64>(0);
        bytes += counted.get::<_, i64>(1);
    }
    Ok((count, bytes))
}

/// Writes marker `token` of move `id` on the source. Its commit is flushed at once
/// (`synchronous_commit` may be off there): a WAL sender sends only flushed WAL, and
/// the cutover waits for this marker with the tenant paused.
pub async fn put_marker(source: &Client, source_id: u16, id: i64, token: i64) -> Result<(), MoveError> {
    let sql = format!(
        "BEGIN; SET LOCAL synchronous_commit = local;
         INSERT INTO pgtenant.move_marker (move_id, token) VALUES ({id}, {token}) ON CONFLICT DO NOTHING; COMMIT"
    );
    source.batch_execute(&sql).await.map_err(MoveError::shard(source_id))
}

/// Whether the target has applied marker `token` of move `id`.
pub async fn has_marker(target: &Client, target_id: u16, id: i64, token: i64) -> Result<bool, MoveError> {
    let row = target
        .query_opt("SELECT 1 FROM pgtenant.move_marker WHERE move_id = $1 AND token = $2", &[&id, &token])
        .await
        .map_err(MoveError::shard(target_id))?;
    Ok(row.is_some())
}

/// Drops the subscription (and with it the slot on the source) and the publication;
/// what is gone already is skipped.
pub async fn stop_replication(
    source: &Client,
    target: &Client,
    (source_id, target_id): (u16, u16),
    (id, name): (i64, &str),
) -> Result<(), MoveError> {
    let on_target = MoveError::shard(target_id);
    let on_source = MoveError::shard(source_id);
    if is_subscribed(target, target_id, name).await? {
        let quoted = quote_ident(name);
        if target.batch_execute(&format!("DROP SUBSCRIPTION {quoted}")).await.is_err() {
            // The source cannot be reached to drop the slot: detach it, drop it below.
            target
                .batch_execute(&format!(
                    "ALTER SUBSCRIPTION {quoted} DISABLE; ALTER SUBSCRIPTION {quoted} SET (slot_name = NONE); DROP SUBSCRIPTION {quoted}"
                ))
                .await
                .map_err(&on_target)?;
        }
    }
    // A slot left behind would hold WAL on the source for ever. Its walsender may take a
    // moment to exit after the subscription is gone.
    for _ in 0..50 {
        let dropped = source
            .query(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active",
                &[&name],
            )
            .await
            .map_err(&on_source)?;
        let left = source
            .query_opt("SELECT 1 FROM pg_replication_slots WHERE slot_name = $1", &[&name])
            .await
            .map_err(&on_source)?;
        if left.is_none() || !dropped.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    source
        .batch_execute(&format!("DROP PUBLICATION IF EXISTS {}", quote_ident(name)))
        .await
        .map_err(&on_source)?;
    for (client, on) in [(source, &on_source), (target, &on_target)] {
        // The marker table is made with the replication: a move stopped before has none.
        let sql = format!(
            "DO $$ BEGIN IF to_regclass('pgtenant.move_marker') IS NOT NULL THEN
                 DELETE FROM pgtenant.move_marker WHERE move_id = {id}; END IF; END $$"
        );
        client.batch_execute(&sql).await.map_err(on)?;
    }
    Ok(())
}

/// Deletes the tenant's rows from `tables` in one transaction, foreign keys and
/// triggers not fired (as logical replication applies rows: the rows go as a whole).
pub async fn delete_tenant_rows(
    client: &mut Client,
    shard: u16,
    tables: &[String],
    column: &str,
    tenant: i64,
) -> Result<u64, MoveError> {
    let on = MoveError::shard(shard);
    let tx = client.transaction().await.map_err(&on)?;
    tx.batch_execute("SET LOCAL session_replication_role = replica").await.map_err(&on)?;
    let mut deleted = 0;
    for table in tables {
        let sql = format!("DELETE FROM {table} WHERE {}", tenant_filter(column, tenant));
        deleted += tx.execute(&sql, &[]).await.map_err(&on)?;
    }
    tx.commit().await.map_err(&on)?;
    Ok(deleted)
}

/// Replaces the tenant's rows on the source with the target's (a switched move rolled
/// back): in one transaction on the source, each table's rows streamed as binary COPY.
pub async fn copy_back(
    target: &Client,
    source: &mut Client,
    (source_id, target_id): (u16, u16),
    tables: &[String],
    column: &str,
    tenant: i64,
) -> Result<u64, MoveError> {
    let on_source = MoveError::shard(source_id);
    let on_target = MoveError::shard(target_id);
    let filter = tenant_filter(column, tenant);
    let mut lists = Vec::new();
    for table in tables {
        let names: Vec<String> = columns(source, table)
            .await
            .map_err(&on_source)?
            .into_iter()
            .map(|(n, _)| quote_ident(&n))
            .collect();
        lists.push(names.join(", "));
    }
    let tx = source.transaction().await.map_err(&on_source)?;
    tx.batch_execute("SET LOCAL session_replication_role = replica").await.map_err(&on_source)?;
    let mut copied = 0;
    for (table, list) in tables.iter().zip(&lists) {
        tx.execute(&format!("DELETE FROM {table} WHERE {filter}"), &[]).await.map_err(&on_source)?;
        let out = target
            .copy_out(&format!("COPY (SELECT {list} FROM {table} WHERE {filter}) TO STDOUT (FORMAT binary)"))
            .await
            .map_err(&on_target)?;
        let sink = tx
            .copy_in(&format!("COPY {table} ({list}) FROM STDIN (FORMAT binary)"))
            .await
            .map_err(&on_source)?;
        futures_util::pin_mut!(out);
        futures_util::pin_mut!(sink);
        while let Some(chunk) = out.next().await {
            sink.send(chunk.map_err(&on_target)?).await.map_err(&on_source)?;
        }
        copied += sink.finish().await.map_err(&on_source)?;
    }
    tx.commit().await.map_err(&on_source)?;
    Ok(copied)
}
