//! From accepted socket to running `Session`: startup negotiation, client
//! authentication, then a server checkout on which the client's settings are applied,
//! so that the client receives the real server's ParameterStatus values.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::auth::authenticate;
use super::error::FrontendError;
use super::error_response::write_error;
use super::params::parse_startup;
use super::session::{Session, SessionStart};
use super::startup::{Negotiated, negotiate};
use super::{ClientTls, Shared, primary_now};
use crate::backend::{
    BackendError, CheckoutError, PooledConn, ServerPool, SettingValue, Settings, TenantGuc, Wanted,
    settings_sql, tenant_sql,
};
use crate::net::{Duplex, Stream};
use crate::observe::conns::ConnState;
use crate::protocol::{self, TxStatus};

/// Serves one accepted connection from startup to the end of its session.
pub async fn serve_connection(
    stream: Stream,
    shared: Arc<Shared>,
    slots: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
) {
    // The startup and the login run in a box of their own, freed once the session
    // runs: the client's task keeps only the session and its loop's state, not the
    // login's locals beside them (see bench/idle_clients.sh).
    let Some(mut started) = Box::pin(start_session(stream, shared, slots, &shutdown)).await else { return };
    // Run where it lies: a session moved out of `started` first would be kept twice.
    started.session.run(shutdown).await;
    let Started { session, permit, pid, since } = started;
    drop(session);
    tracing::info!(client = pid, seconds = since.elapsed().as_secs_f64(), "client disconnected");
    // The client's slot under `max_clients` is given back last.
    drop(permit);
}

/// A session ready to run: its client logged in.
struct Started {
    session: Session,
    /// The client's slot under `max_clients`.
    permit: OwnedSemaphorePermit,
    pid: u32,
    since: std::time::Instant,
}

/// Negotiates the startup and logs the client in; a session to run, or `None` once
/// the connection is over (a cancel request, a refused login, an admin console
/// session, which is served here).
async fn start_session(
    stream: Stream,
    shared: Arc<Shared>,
    slots: Arc<Semaphore>,
    shutdown: &watch::Receiver<bool>,
) -> Option<Started> {
    let peer = match &stream {
        Stream::Plain(tcp) => {
            let _ = tcp.get_ref().set_nodelay(true);
            tcp.get_ref().peer_addr().ok()
        }
        _ => None,
    };
    let timeout = shared.config.proxy.startup_timeout();
    // The TLS of this connection, from its handshake to its channel binding, whatever a
    // RELOAD installs meanwhile.
    let tls = shared.client_tls();
    let negotiated =
        match tokio::time::timeout(timeout, negotiate(stream, tls.as_ref().map(|t| &t.acceptor))).await {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "startup failed");
                return None;
            }
            Err(_) => {
                tracing::debug!("startup timed out");
                return None;
            }
        };
    let (stream, minor, params) = match negotiated {
        Negotiated::Cancel { mut stream, pid, key } => {
            forward_cancel(&shared, pid, key).await;
            // As PostgreSQL: the connection closes once the cancel is sent on.
            let _ = tokio::time::timeout(timeout, stream.shutdown()).await;
            return None;
        }
        Negotiated::Login { stream, minor, params } => (stream, minor, params),
    };
    let mut client = Duplex::for_client(stream);
    let login =
        tokio::time::timeout(timeout, login(&mut client, &shared, tls.as_deref(), slots, minor, params))
            .await;
    let (login, permit) = match login {
        Ok(Ok(ok)) => ok,
        Ok(Err(err)) => {
            refuse(client, &err).await;
            return None;
        }
        Err(_) => {
            let err = FrontendError::StartupTimeout { ms: shared.config.proxy.startup_timeout_ms };
            refuse(client, &err).await;
            return None;
        }
    };
    match login {
        Login::Session(mut start) => {
            start.peer = peer;
            let (pid, since) = (start.cancel.pid, std::time::Instant::now());
            tracing::info!(
                client = pid,
                user = %start.user.name,
                database = %start.database,
                tenant = start.tenant.as_ref().map(ToString::to_string),
                addr = peer.map(|p| p.to_string()),
                "client connected"
            );
            Some(Started { session: Session::new(shared, client, start), permit, pid, since })
        }
        Login::Console { user, pid, application_name } => {
            let info = super::client_info(
                &user.name,
                crate::admin::CONSOLE_DATABASE,
                peer,
                client.stream.is_tls(),
                application_name,
                pid,
            );
            let listed = shared.clients.register(info, None);
            listed.set_state(ConnState::Active, None);
            tracing::info!(client = pid, user = %user.name, addr = peer.map(|p| p.to_string()), "admin console connected");
            let max_message = shared.config.proxy.max_message_size;
            let view = shared.admin_view();
            let console = crate::admin::serve_console(
                &mut client,
                &view,
                max_message,
                shutdown.clone(),
                listed.killed(),
            );
            if let Err(e) = Box::pin(console).await {
                tracing::debug!(error = %e, "admin console session ends");
            }
            drop(permit);
            None
        }
    }
}

/// What a login leads to.
enum Login {
    Session(SessionStart),
    /// An admin user's session in the admin console.
    Console {
        user: Arc<crate::config::UserConfig>,
        pid: u32,
        application_name: String,
    },
}

/// The ParameterStatus values the admin console reports: a server's usual set, in
/// UTF-8 and UTC (the console writes timestamps so).
fn console_parameters(application_name: &str) -> [(&'static str, String); 9] {
    [
        ("server_version", "16.0 (pgtenant admin console)".into()),
        ("server_encoding", "UTF8".into()),
        ("client_encoding", "UTF8".into()),
        ("DateStyle", "ISO, MDY".into()),
        ("TimeZone", "UTC".into()),
        ("IntervalStyle", "postgres".into()),
        ("integer_datetimes", "on".into()),
        ("standard_conforming_strings", "on".into()),
        ("application_name", application_name.into()),
    ]
}

async fn refuse(mut client: Duplex, err: &FrontendError) {
    tracing::info!(error = %err, "login refused");
    if !matches!(err, FrontendError::Io(_)) {
        write_error(&mut client.wbuf, err);
        let _ = client.flush().await;
    }
}

async fn forward_cancel(shared: &Shared, pid: u32, key: u32) {
    tracing::debug!(pid, "cancel request");
    super::cancel::forward(shared.cancels.reach(pid, key)).await;
}

/// Authenticates and prepares the session; `tls`: what the client's handshake used.
async fn login(
    client: &mut Duplex,
    shared: &Arc<Shared>,
    tls: Option<&ClientTls>,
    slots: Arc<Semaphore>,
    minor: u16,
    params: Vec<(String, String)>,
) -> Result<(Login, OwnedSemaphorePermit), FrontendError> {
    let config = &shared.config;
    let params = parse_startup(params, &config.proxy.tenant_parameter, config.proxy.tenant_key)?;
    if minor > 0 || !params.protocol_options.is_empty() {
        negotiate_protocol_version(&mut client.wbuf, &params.protocol_options);
    }
    let users = shared.users();
    // Channel binding to the certificate this client's TLS was set up with.
    let binding = client.stream.is_tls().then(|| tls?.end_point.as_deref()).flatten();
    let user = authenticated_user(client, shared, &users, &params.user, binding).await?;
    let permit = slots
        .try_acquire_owned()
        .map_err(|_| FrontendError::TooManyClients { max: config.proxy.max_clients })?;
    if crate::admin::is_console(&params.database) {
        if !user.admin {
            return Err(FrontendError::NotAdmin { user: user.name.clone(), database: params.database });
        }
        let application_name = super::params::application_name(&params.settings);
        let cancel = shared.cancels.register();
        for (name, value) in console_parameters(&application_name) {
            protocol::parameter_status_msg(&mut client.wbuf, name, &value);
        }
        protocol::backend_key_data(&mut client.wbuf, cancel.pid, cancel.key);
        protocol::ready_for_query(&mut client.wbuf, TxStatus::Idle);
        return Ok((Login::Console { user, pid: cancel.pid, application_name }, permit));
    }
    if let Some(max) = user.client_limit(&config.proxy)
        && shared.clients.count_user(&user.name) >= max
    {
        return Err(FrontendError::TooManyUserClients { user: user.name.clone(), max });
    }
    if shared.pauses.is_disabled(&params.database) {
        return Err(FrontendError::DatabaseDisabled { database: params.database });
    }

    // The tenant's shard reports the parameters; an unplaced tenant gets its error
    // with its first statement, as a session tenant set later would.
    let placed = match &params.tenant {
        Some(t) => shared.router.placement(t).await.ok().map(|p| p.shard),
        None => None,
    };
    let shard = match placed {
        Some(shard) => shard,
        None => shared.router.default_shard().map_err(FrontendError::Route)?,
    };
    let topology = shared.router.topology();
    let node = primary_now(&shared.health, &topology, shard)?;
    let settings = Settings::intern(params.settings);
    let pool = shared.pools.pool(shard, &node, &user, &params.database);
    // The server never rejects an application_name, which many clients make unique; a
    // login that differs from an accepted one only there needs no server.
    let to_check = if settings.list.iter().any(|(n, _)| n.eq_ignore_ascii_case("application_name")) {
        settings.without("application_name")
    } else {
        settings.clone()
    };
    let wanted = Wanted { tenant: None, settings: Some(settings.version) };
    // A server connection to apply the settings on, or else the node's known parameters.
    let server: Result<PooledConn, _> = match pool.server_params() {
        // Known from an earlier login, and so are these settings: no server needed.
        Some(known) if pool.accepts(&to_check) => Err(known),
        // New settings are tried on a connection that is free now. A login does not wait
        // for a busy pool for that: the settings are then tried at the first checkout.
        Some(known) => shared
            .pools
            .checkout_if_free(&pool, shard, &None, wanted)
            .await
            .map_err(checkout_error)?
            .ok_or(known),
        None => Ok(shared.pools.checkout_from(&pool, shard, &None, wanted).await.map_err(checkout_error)?),
    };
    let reported = match server {
        Ok(conn) => {
            apply_login_settings(shared, &pool, conn, shard, &settings, &to_check, params.tenant.as_ref())
                .await?
        }
        Err(known) => with_client_settings(&known, &settings),
    };
    let cancel = shared.cancels.register();
    for (name, value) in &reported {
        protocol::parameter_status_msg(&mut client.wbuf, name, value);
    }
    protocol::backend_key_data(&mut client.wbuf, cancel.pid, cancel.key);
    protocol::ready_for_query(&mut client.wbuf, TxStatus::Idle);
    let target = params.target.or(user.target).unwrap_or_default();
    Ok((
        Login::Session(SessionStart {
            user,
            database: params.database,
            tenant: params.tenant,
            target,
            settings,
            cancel,
            peer: None,
        }),
        permit,
    ))
}

/// Authenticates `name` as `[[users]]` has it, or else as the database answers for it
/// (`[auth] query`: the login then reaches the servers as its own role); after a failed
/// login, waits as `FailedLogins` says before the error goes out.
async fn authenticated_user(
    client: &mut Duplex,
    shared: &Shared,
    users: &super::reload::Users,
    name: &str,
    binding: Option<&[u8]>,
) -> Result<Arc<crate::config::UserConfig>, FrontendError> {
    let max_len = shared.config.proxy.max_message_size;
    let in_file = users.configs.get(name).cloned();
    let from_database = match (&in_file, &users.from_database) {
        (None, Some(source)) => {
            let shard = source.shard().map_or_else(|| shared.router.default_shard(), Ok)?;
            let node = primary_now(&shared.health, &shared.router.topology(), shard)?;
            let answer = source
                .lookup(name, &node)
                .await
                .map_err(|e| FrontendError::AuthSource { user: name.to_string(), reason: e.to_string() })?;
            Some((source, answer))
        }
        _ => None,
    };
    let auth = match &from_database {
        Some((_, answer)) => answer.found.as_ref().map(|found| &found.auth),
        None => users.auth.get(name),
    };
    let failed = || FrontendError::AuthFailed { user: name.to_string() };
    let keys = match authenticate(client, name, auth, binding, max_len).await {
        Ok(keys) => keys,
        Err(err @ FrontendError::AuthFailed { .. }) => {
            if let Some((source, _)) = &from_database {
                source.failed(name);
            }
            tokio::time::sleep(shared.failed_logins.delay(name)).await;
            return Err(err);
        }
        Err(err) => return Err(err),
    };
    match (in_file, from_database) {
        (Some(user), _) => Ok(user),
        (None, Some((source, answer))) => match (&answer.found, keys) {
            (Some(found), Some(keys)) => Ok(source.user(name, found, keys)),
            _ => Err(failed()),
        },
        (None, None) => Err(failed()),
    }
}

/// NegotiateProtocolVersion (B): pgtenant speaks 3.0 and none of the `_pq_` options.
fn negotiate_protocol_version(buf: &mut BytesMut, options: &[String]) {
    protocol::put_message(buf, b'v', |b| {
        b.extend_from_slice(&0i32.to_be_bytes());
        b.extend_from_slice(&(options.len() as i32).to_be_bytes());
        for o in options {
            b.extend_from_slice(o.as_bytes());
            b.extend_from_slice(b"\0");
        }
    });
}

/// The server's parameters with the client's startup settings in place of the defaults.
fn with_client_settings(server: &[(String, String)], settings: &Settings) -> Vec<(String, String)> {
    server
        .iter()
        .map(|(name, value)| {
            let own =
                settings.list.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).and_then(|(_, v)| match v {
                    SettingValue::Config(v) => Some(v.clone()),
                    SettingValue::Sql(_) => None,
                });
            (name.clone(), own.unwrap_or_else(|| value.clone()))
        })
        .collect()
}

/// A checkout error as a login reports it: a server's refusal as the server said it.
fn checkout_error(e: CheckoutError) -> FrontendError {
    match e {
        CheckoutError::Unreachable { source: BackendError::Refused { fields, .. }, .. } => {
            FrontendError::ServerRefused(fields)
        }
        other => FrontendError::Checkout(other),
    }
}

/// A login that needs a server (the first to a pool, or one with start-up settings the
/// node has not accepted before): `conn` applies the client's settings (a real server
/// would refuse bad ones at login too) and reports the resulting values; once it has,
/// `pool` notes `to_check` (the settings less what needs no check) as accepted.
async fn apply_login_settings(
    shared: &Shared,
    pool: &ServerPool,
    mut conn: PooledConn,
    shard: crate::directory::ShardId,
    settings: &std::sync::Arc<Settings>,
    to_check: &Settings,
    tenant: Option<&crate::directory::TenantId>,
) -> Result<Vec<(String, String)>, FrontendError> {
    let context = super::tenant_context(&shared.config);
    // One string is fine here: a rejected setting refuses the login, and nothing is recorded.
    let sql: String =
        [settings_sql(&conn.settings, settings), tenant_sql(&conn.tenant, tenant, context, conn.cancel.pid)]
            .into_iter()
            .flatten()
            .collect();
    if !sql.is_empty() {
        let applied = conn.run_sql(&sql).await;
        let refused = applied.map_err(|e| FrontendError::ServerLost { shard, reason: e.to_string() })?;
        if let Some(fields) = refused {
            return Err(FrontendError::ServerRefused(fields));
        }
        conn.settings = settings.clone();
        conn.tenant = TenantGuc::Known(tenant.cloned());
    }
    if conn.status != TxStatus::Idle {
        return Err(FrontendError::Protocol("server connection not idle after login".into()));
    }
    pool.accept_settings(to_check);
    Ok(conn.params.clone())
}
