//! A server connection: opened, optionally upgraded to TLS, and authenticated by
//! pgtenant (trust, cleartext, md5, SCRAM-SHA-256), then used as a relay target.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Buf;
use postgres_protocol::authentication::sasl::SCRAM_SHA_256;
use postgres_protocol::message::frontend;
use tokio::net::{TcpStream, UnixStream};

use super::addr::ServerAddr;
use super::cancel::CancelTarget;
use super::error::BackendError;
use super::prepared::{PreparedStatement, server_name};
use super::prepared_on_server::PreparedOnServer;
use super::settings::{ReadOnlyGuc, Settings, TenantGuc};
use super::state::{OnError, Pending, Reply, ResponseQueue};
use super::tls::ServerTls;
use crate::net::{Duplex, Stream};
use crate::observe::conns::ConnHandle;
use crate::observe::stats::PoolStats;
use crate::protocol::scram::{PassthroughError, ScramClient, ScramKeys};
use crate::protocol::{self, ErrorFields, TxStatus};

/// Where and as whom to connect.
#[derive(Clone, Debug)]
pub struct ConnectTarget {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    /// Logs in as `user` without a password (SCRAM passthrough; see `protocol::scram`).
    pub passthrough: Option<Arc<ScramKeys>>,
    /// The keys `password` gave for the salt the server named last: shared by the
    /// target's clones (a pool's connections, and the like pools `min_pool_size` opens
    /// on the shard's other nodes), so that its SCRAM logins stretch the password once,
    /// not once per connection.
    pub password_keys: Arc<PasswordKeys>,
    pub database: String,
    pub connect_timeout: Duration,
    /// How many statements a connection keeps prepared (`max_prepared_statements`).
    pub max_prepared: usize,
}

impl ConnectTarget {
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// See `ConnectTarget::password_keys`. A server whose role has another salt (its
/// password set again, or a node with a verifier of its own) replaces them.
#[derive(Debug, Default)]
pub struct PasswordKeys(std::sync::Mutex<Option<Arc<ScramKeys>>>);

impl PasswordKeys {
    /// The SCRAM keys of `password` for the salt and iterations `server_first` names:
    /// the kept ones when they are for those, else derived (off the runtime's threads:
    /// the key stretching takes about a millisecond) and kept.
    async fn for_server(
        &self,
        password: &str,
        server_first: &[u8],
    ) -> Result<Arc<ScramKeys>, LoginKeysError> {
        let (salt, iterations) = crate::protocol::scram::server_salt(server_first)?;
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(keys) = kept.filter(|k| (&k.salt, k.iterations) == (&salt, iterations)) {
            return Ok(keys);
        }
        let password = password.to_string();
        let keys = tokio::task::spawn_blocking(move || ScramKeys::from_password(&password, salt, iterations))
            .await
            .map(Arc::new)
            .map_err(|e| LoginKeysError::Derivation(e.to_string()))?;
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(keys.clone());
        Ok(keys)
    }
}

/// Why `PasswordKeys::for_server` has none.
#[derive(Debug)]
enum LoginKeysError {
    Server(PassthroughError),
    Derivation(String),
}

impl From<PassthroughError> for LoginKeysError {
    fn from(e: PassthroughError) -> Self {
        Self::Server(e)
    }
}

/// Statements forgotten on one connection and not closed yet, at most (see
/// `ServerConn::forget_statement`).
const MAX_TO_CLOSE: usize = 64;

/// Messages larger than this from a server are treated as a broken connection.
pub const MAX_SERVER_MESSAGE: usize = 1 << 30;
/// Rows `query_first_column` keeps at most (the calls that use it ask for fewer).
const MAX_KEPT_ROWS: usize = 100_000;

/// A DataRow's first value as text (`None`: NULL, or not text).
pub fn first_text_value(body: &[u8]) -> Option<String> {
    let len = i32::from_be_bytes(body.get(2..6)?.try_into().ok()?);
    let len = usize::try_from(len).ok()?;
    String::from_utf8(body.get(6..6 + len)?.to_vec()).ok()
}

pub struct ServerConn {
    pub io: Duplex,
    pub addr: String,
    pub cancel: CancelTarget,
    /// ParameterStatus values, as reported at startup and updated since.
    pub params: Vec<(String, String)>,
    /// Statement ids prepared on this server (`__pgtenant_<id>`).
    pub prepared: PreparedOnServer,
    /// Statements prepared here since the server was last idle outside a transaction.
    /// Until their transaction commits, their plans may rest on what it created (a
    /// type, a table) and a rollback takes away: a statement is not trusted to another
    /// client before that (see `after_ready`).
    pub unsettled: Vec<Arc<PreparedStatement>>,
    /// The transaction of `unsettled` failed or was rolled back (wholly, or to a
    /// savepoint), as far as the server said.
    unsettled_doubtful: bool,
    /// Statements forgotten here that the server still holds: closed before the next
    /// request starts on the connection (`flush_closes`), or before one of them is
    /// prepared again (`note_prepared`). Not at once: after an error the server skips
    /// everything up to the Sync, a Close too, and a Close added behind a request's
    /// ReadyForQuery would leave the connection owing an answer between requests.
    to_close: Vec<u64>,
    pub settings: Arc<Settings>,
    pub tenant: TenantGuc,
    /// `default_transaction_read_only`, turned on for a tenant that may not write.
    pub read_only: ReadOnlyGuc,
    /// SQL that ran here may have changed settings behind pgtenant's back (a DO block,
    /// a function it does not know): the next transaction pooled onto it starts with
    /// RESET ALL, and its settings and tenant GUC are sent again.
    pub settings_unknown: bool,
    pub status: TxStatus,
    pub queue: ResponseQueue,
    /// Left in a state that cannot be trusted; closed instead of reused.
    pub broken: bool,
    /// The FATAL error the server ended the session with (`pg_terminate_backend`, a
    /// shutdown, a crash of another backend), kept from the client for its session to
    /// decide what it sees (see `Session::on_server_lost`).
    pub fatal: Option<ErrorFields>,
    /// When it was opened (`coarse_clock::now_ms`).
    pub opened_ms: u64,
    /// The client thread its socket is registered on (`net::client_threads`), whose
    /// clients it serves without waking another thread.
    pub home: Option<usize>,
    /// When it last went back to its pool (`coarse_clock::coarse_ms`).
    pub idle_since_ms: u64,
    /// Its slots of `max_db_connections` / `max_user_connections` (see `caps`).
    pub cap_slots: super::caps::CapSlots,
    /// Its pool's epoch when it began to open (see `NodePool::epoch`).
    pub pool_epoch: u64,
    /// Its pool's traffic counters, and the byte counts of `io` already added there.
    pub stats: Arc<PoolStats>,
    /// Its line in the admin console's SHOW SERVERS (once its pool took it).
    pub listed: Option<ConnHandle>,
    counted_bytes: (u64, u64),
}

impl ServerConn {
    /// A client request was answered: counts it (and its transaction, when `xact_us`
    /// says it ended one), with the bytes exchanged since the last count; returns the
    /// bytes the server sent for it.
    #[inline]
    pub fn count_request(&mut self, request_us: u64, xact_us: Option<u64>, failed: bool) -> u64 {
        self.stats.request_done(request_us, xact_us);
        if failed {
            self.stats.error();
        }
        let (written, read) = (self.io.bytes_written, self.io.bytes_read);
        self.stats.bytes(written - self.counted_bytes.0, read - self.counted_bytes.1);
        self.stats.statements(self.queue.take_counts());
        let bytes_out = read - self.counted_bytes.1;
        self.counted_bytes = (written, read);
        bytes_out
    }

    /// Connects and logs in, with `application_name` when one is given (the pools'
    /// connections give none: their clients' settings are applied to them); returns
    /// once the server sent ReadyForQuery.
    pub async fn connect(
        target: &ConnectTarget,
        tls: Option<&ServerTls>,
        application_name: Option<&str>,
    ) -> Result<ServerConn, BackendError> {
        let addr = target.addr();
        let (stream, peer) = tokio::time::timeout(target.connect_timeout, open(target, tls, &addr))
            .await
            .map_err(|_| BackendError::ConnectTimeout { addr: addr.clone() })??;
        let mut io = Duplex::new(stream);
        let io_err = |source| BackendError::Io { addr: addr.clone(), source };
        let named = application_name.map(|name| ("application_name", name));
        frontend::startup_message(
            [("user", target.user.as_str()), ("database", target.database.as_str())].into_iter().chain(named),
            &mut io.wbuf,
        )
        .map_err(io_err)?;
        io.flush().await.map_err(io_err)?;
        tokio::time::timeout(target.connect_timeout, login(io, target, &addr, peer))
            .await
            .map_err(|_| BackendError::ConnectTimeout { addr: addr.clone() })?
    }

    /// Idle at ReadyForQuery outside a transaction, with nothing owed: may go back to the pool.
    pub fn is_reusable(&self) -> bool {
        !self.broken && self.queue.is_empty() && self.status == TxStatus::Idle
    }

    /// Runs `sql` as a simple query outside the relay, for login, reset and rollback.
    /// ParameterStatus messages update `params`; the server's error, if any, is returned.
    pub async fn run_sql(&mut self, sql: &str) -> Result<Option<ErrorFields>, BackendError> {
        self.run_sql_into(sql, None).await
    }

    /// `run_sql`, keeping each row's first value as text (at most `MAX_KEPT_ROWS`).
    pub async fn query_first_column(
        &mut self,
        sql: &str,
    ) -> Result<Result<Vec<String>, ErrorFields>, BackendError> {
        let mut values = Vec::new();
        Ok(match self.run_sql_into(sql, Some(&mut values)).await? {
            Some(error) => Err(error),
            None => Ok(values),
        })
    }

    async fn run_sql_into(
        &mut self,
        sql: &str,
        mut values: Option<&mut Vec<String>>,
    ) -> Result<Option<ErrorFields>, BackendError> {
        protocol::query(&mut self.io.wbuf, sql);
        let addr = self.addr.clone();
        let io_err = |source| BackendError::Io { addr: addr.clone(), source };
        self.io.flush().await.map_err(io_err)?;
        let mut error = None;
        loop {
            let Some(frame) = self.io.read_frame(MAX_SERVER_MESSAGE).await.map_err(io_err)? else {
                self.broken = true;
                return Err(BackendError::Protocol { addr, message: "server closed the connection".into() });
            };
            match frame.tag {
                b'E' => error = Some(protocol::error_fields(frame.body())),
                b'D' => {
                    if let Some(values) = values.as_deref_mut().filter(|v| v.len() < MAX_KEPT_ROWS) {
                        values.extend(first_text_value(frame.body()));
                    }
                }
                b'S' => {
                    if let Some((name, value)) = protocol::parameter_status(frame.body()) {
                        self.set_param(name, value);
                    }
                }
                b'Z' => {
                    self.status = frame
                        .body()
                        .first()
                        .copied()
                        .and_then(TxStatus::from_byte)
                        .unwrap_or(TxStatus::Failed);
                    return Ok(error);
                }
                _ => {}
            }
        }
    }

    /// Records statement `stmt` as prepared, its Parse about to go out; closes the least
    /// recently used statement if that puts the connection over its limit. Not while
    /// the server skips messages after an error: it would skip the Close too.
    pub fn note_prepared(&mut self, stmt: &Arc<PreparedStatement>) {
        let id = stmt.id;
        self.unsettled.push(stmt.clone());
        if let Some(at) = self.to_close.iter().position(|&c| c == id) {
            // The server still holds the name: a Parse of it would fail (42P05).
            self.to_close.swap_remove(at);
            self.close_on_server(id);
        }
        if self.queue.is_skipping() {
            self.prepared.record(id);
            return;
        }
        if let Some(evicted) = self.prepared.insert(id) {
            self.close_on_server(evicted);
        }
    }

    /// What the server said may undo the statements prepared in the transaction under
    /// way: an error, a ROLLBACK (to a savepoint too), a PREPARE TRANSACTION.
    pub fn note_doubt(&mut self) {
        if !self.unsettled.is_empty() {
            self.unsettled_doubtful = true;
        }
    }

    /// A ReadyForQuery with `status` came. Once the server is idle outside a
    /// transaction, the statements prepared in it are settled: kept if it committed,
    /// else forgotten (see `forget_statement`), so that no other client binds a plan
    /// that rests on what the rollback took away (issue 57: a type created in a
    /// transaction that never committed).
    #[inline]
    pub fn after_ready(&mut self, status: TxStatus) {
        if status == TxStatus::Idle && !self.unsettled.is_empty() {
            let doubtful = std::mem::take(&mut self.unsettled_doubtful);
            for stmt in std::mem::take(&mut self.unsettled) {
                if doubtful {
                    stmt.unmark_validated();
                    self.forget_statement(stmt.id);
                }
            }
        }
    }

    /// The transaction of `unsettled` was rolled back outside the relay (the ROLLBACK of
    /// a client that left): their servers' word that they parse no longer holds. The
    /// connection must be closed, not reused: it still holds them.
    pub fn rolled_back_unsettled(&mut self) {
        for stmt in std::mem::take(&mut self.unsettled) {
            stmt.unmark_validated();
        }
    }

    /// Statement `id` is not to be used here any more: it is closed on the server before
    /// the next request (see `to_close`), and prepared again when a client binds it. A
    /// connection with more than `MAX_TO_CLOSE` such statements is closed instead.
    pub fn forget_statement(&mut self, id: u64) {
        self.prepared.remove(id);
        if !self.to_close.contains(&id) {
            self.to_close.push(id);
        }
        if self.to_close.len() > MAX_TO_CLOSE {
            self.broken = true;
        }
    }

    /// Closes the statements forgotten here, ahead of the request about to be written:
    /// their answers are swallowed.
    #[inline]
    pub fn flush_closes(&mut self) {
        if self.to_close.is_empty() || self.queue.is_skipping() {
            return;
        }
        for id in std::mem::take(&mut self.to_close) {
            self.close_on_server(id);
        }
    }

    fn close_on_server(&mut self, id: u64) {
        protocol::close_statement(&mut self.io.wbuf, server_name(id).as_bytes());
        self.queue.push(Pending::Injected {
            reply: Reply::Close,
            on_error: OnError::Swallow,
            statement: None,
        });
    }

    /// Runs `DISCARD ALL` so nothing of the previous client survives.
    pub async fn reset(&mut self) -> Result<(), BackendError> {
        if let Some(fields) = self.run_sql("DISCARD ALL").await? {
            self.broken = true;
            return Err(BackendError::Refused { addr: self.addr.clone(), fields });
        }
        self.prepared.clear();
        self.unsettled.clear();
        self.unsettled_doubtful = false;
        self.to_close.clear();
        self.settings = Settings::empty();
        self.tenant = TenantGuc::Unknown;
        self.read_only = ReadOnlyGuc::Off;
        self.settings_unknown = false;
        Ok(())
    }

    pub fn set_param(&mut self, name: String, value: String) {
        record_param(&mut self.params, name, value);
    }
}

/// Opens the socket: a Unix socket for a host that is a directory (as libpq does; no
/// TLS there), TCP with optional TLS otherwise.
async fn open(
    target: &ConnectTarget,
    tls: Option<&ServerTls>,
    addr: &str,
) -> Result<(Stream, ServerAddr), BackendError> {
    let connect_err = |source| BackendError::Connect { addr: addr.to_string(), source };
    if target.host.starts_with('/') {
        let path: Arc<Path> = Path::new(&target.host).join(format!(".s.PGSQL.{}", target.port)).into();
        let unix = UnixStream::connect(&path).await.and_then(crate::net::LocalSocket::from_tokio);
        return Ok((Stream::Unix(unix.map_err(connect_err)?), ServerAddr::Unix(path)));
    }
    let tcp = TcpStream::connect((target.host.as_str(), target.port)).await.map_err(connect_err)?;
    let _ = tcp.set_nodelay(true);
    let peer = tcp.peer_addr().map_err(|source| BackendError::Io { addr: addr.to_string(), source })?;
    let tcp = crate::net::TcpSocket::from_tokio(tcp).map_err(connect_err)?;
    let stream = match tls {
        Some(tls) => tls.negotiate(tcp, &target.host, addr).await?,
        None => Stream::Plain(tcp),
    };
    Ok((stream, ServerAddr::Tcp(peer)))
}

async fn login(
    mut io: Duplex,
    target: &ConnectTarget,
    addr: &str,
    peer: ServerAddr,
) -> Result<ServerConn, BackendError> {
    let io_err = |source| BackendError::Io { addr: addr.to_string(), source };
    let protocol_err =
        |message: &str| BackendError::Protocol { addr: addr.to_string(), message: message.to_string() };
    let passthrough_err = |reason: PassthroughError| BackendError::Passthrough {
        addr: addr.to_string(),
        user: target.user.clone(),
        reason,
    };
    let password = || match (&target.password, &target.passthrough) {
        (Some(password), _) => Ok(password.as_str()),
        // A role passed through has no password to give a server that asks for one.
        (None, Some(_)) => Err(passthrough_err(PassthroughError::PasswordAsked)),
        (None, None) => Err(BackendError::NoPassword { addr: addr.to_string(), user: target.user.clone() }),
    };
    // SCRAM's errors are the role's when it is passed through (its verifier must be the
    // same on every server), the server's otherwise.
    let scram_err = |reason: PassthroughError| match target.passthrough {
        Some(_) => passthrough_err(reason),
        None => protocol_err(&format!("SCRAM: {reason}")),
    };
    let mut scram: Option<ScramClient> = None;
    let mut params = Vec::new();
    let mut key = (0u32, 0u32);
    loop {
        let frame = io
            .read_frame(MAX_SERVER_MESSAGE)
            .await
            .map_err(io_err)?
            .ok_or_else(|| protocol_err("closed during login"))?;
        let mut body = frame.body();
        match frame.tag {
            b'R' => {
                if body.len() < 4 {
                    return Err(protocol_err("short authentication message"));
                }
                let code = body.get_i32();
                match code {
                    0 => {}
                    3 => {
                        let mut pw = password()?.as_bytes().to_vec();
                        pw.push(0);
                        protocol::put_message(&mut io.wbuf, b'p', |b| b.extend_from_slice(&pw));
                    }
                    5 => {
                        let salt: [u8; 4] = body
                            .get(..4)
                            .and_then(|s| s.try_into().ok())
                            .ok_or_else(|| protocol_err("short md5 salt"))?;
                        let hash = postgres_protocol::authentication::md5_hash(
                            target.user.as_bytes(),
                            password()?.as_bytes(),
                            salt,
                        );
                        frontend::password_message(hash.as_bytes(), &mut io.wbuf).map_err(io_err)?;
                    }
                    10 => {
                        let offers_scram = body.split(|c| *c == 0).any(|m| m == SCRAM_SHA_256.as_bytes());
                        if !offers_scram {
                            return Err(BackendError::UnsupportedAuth {
                                addr: addr.to_string(),
                                method: "SASL (no SCRAM-SHA-256)".into(),
                            });
                        }
                        if target.passthrough.is_none() {
                            password()?;
                        }
                        let nonce =
                            base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 18]>());
                        let (exchange, first) = ScramClient::start(nonce);
                        frontend::sasl_initial_response(SCRAM_SHA_256, &first, &mut io.wbuf)
                            .map_err(io_err)?;
                        scram = Some(exchange);
                    }
                    11 => {
                        let exchange =
                            scram.as_mut().ok_or_else(|| protocol_err("SASL continue without SASL"))?;
                        let keys = match &target.passthrough {
                            Some(keys) => keys.clone(),
                            None => match target.password_keys.for_server(password()?, body).await {
                                Ok(keys) => keys,
                                Err(LoginKeysError::Server(reason)) => return Err(scram_err(reason)),
                                Err(LoginKeysError::Derivation(e)) => {
                                    return Err(protocol_err(&format!("SCRAM: {e}")));
                                }
                            },
                        };
                        let last = exchange.proof(&keys, body).map_err(scram_err)?;
                        frontend::sasl_response(&last, &mut io.wbuf).map_err(io_err)?;
                    }
                    12 => {
                        let exchange = scram.take().ok_or_else(|| protocol_err("SASL final without SASL"))?;
                        exchange.finish(body).map_err(scram_err)?;
                    }
                    other => {
                        return Err(BackendError::UnsupportedAuth {
                            addr: addr.to_string(),
                            method: format!("code {other}"),
                        });
                    }
                }
                if !io.wbuf.is_empty() {
                    io.flush().await.map_err(io_err)?;
                }
            }
            b'E' => {
                return Err(BackendError::Refused {
                    addr: addr.to_string(),
                    fields: protocol::error_fields(body),
                });
            }
            b'S' => {
                if let Some(p) = protocol::parameter_status(body) {
                    params.push(p);
                }
            }
            b'K' => {
                if body.len() >= 8 {
                    key = (body.get_u32(), body.get_u32());
                }
            }
            b'N' => {}
            b'Z' => break,
            _ => return Err(protocol_err("unexpected message during login")),
        }
    }
    let opened_ms = super::coarse_clock::now_ms();
    Ok(ServerConn {
        io,
        addr: addr.to_string(),
        cancel: CancelTarget::new(peer, key.0, key.1),
        params,
        prepared: PreparedOnServer::new(target.max_prepared),
        unsettled: Vec::new(),
        unsettled_doubtful: false,
        to_close: Vec::new(),
        settings: Settings::empty(),
        tenant: TenantGuc::Unknown,
        read_only: ReadOnlyGuc::Off,
        settings_unknown: false,
        status: TxStatus::Idle,
        queue: ResponseQueue::default(),
        broken: false,
        fatal: None,
        opened_ms,
        home: crate::net::client_threads::current(),
        idle_since_ms: opened_ms,
        cap_slots: Default::default(),
        pool_epoch: 0,
        stats: Arc::default(),
        listed: None,
        counted_bytes: (0, 0),
    })
}

/// Records a ParameterStatus value, replacing an earlier one of the same name.
pub fn record_param(params: &mut Vec<(String, String)>, name: String, value: String) {
    match params.iter_mut().find(|(n, _)| *n == name) {
        Some(p) => p.1 = value,
        None => params.push((name, value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool's SCRAM logins stretch its password once per salt the server names: the
    /// keys are kept, and those of another salt replace them.
    #[tokio::test]
    async fn the_password_s_keys_are_derived_once_per_salt() {
        let server_first = |salt: &[u8]| {
            use base64::Engine;
            let salt = base64::engine::general_purpose::STANDARD.encode(salt);
            format!("r=ournonce+theirs,s={salt},i=4096").into_bytes()
        };
        let keys = PasswordKeys::default();
        let first = keys.for_server("pw", &server_first(b"salt one")).await.unwrap();
        assert_eq!(*first, ScramKeys::from_password("pw", b"salt one".to_vec(), 4096));
        let again = keys.for_server("pw", &server_first(b"salt one")).await.unwrap();
        assert!(Arc::ptr_eq(&first, &again), "kept, not derived again");
        let other = keys.for_server("pw", &server_first(b"salt two")).await.unwrap();
        assert_eq!(other.salt, b"salt two");
        let back = keys.for_server("pw", &server_first(b"salt one")).await.unwrap();
        assert!(!Arc::ptr_eq(&first, &back), "the other salt's keys replaced them");
        assert!(matches!(
            keys.for_server("pw", b"r=x,s=!!,i=1").await,
            Err(LoginKeysError::Server(PassthroughError::Malformed))
        ));
    }
}
