//! The structure-aware session target: the input's bytes are read as a program of
//! protocol steps (Query, Parse/Bind/Describe/Execute/Close, Sync, Flush, copy
//! messages, FunctionCall, raw messages, Terminate, pauses, a second client) that one
//! or two clients send through a real proxy (started in this process for the program:
//! shipped defaults but small pools) to a fake server of its own (`fake_server`),
//! whose markers make a server fail, die or lag at any point. Both pool modes, both
//! protocols, pipelined lanes.
//!
//! What must hold, for every program: nothing in the proxy panics, the proxy keeps
//! accepting, and every client ends its program answered: after a closing
//! `CopyFail, Sync, ROLLBACK`, then `ROLLBACK; SELECT 'fuzz-end'` (a few tries), the
//! marker's row comes back, or a refusal that does not say a server is missing or
//! broken, unless the session was ended with a FATAL error or the program itself ended
//! it (Terminate, a raw message, a server that died). Waiting longer than
//! `ANSWER_WITHIN` for an answer is a hang.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use crate::protocol::*;

/// Longer than any wait the proxy's configuration below allows (checkout 2 s).
const ANSWER_WITHIN: Duration = Duration::from_secs(8);

/// Steps per program: longer inputs are cut (keeps one input well under a second).
const MAX_STEPS: usize = 200;

/// Statements the programs draw from: every family the session treats apart.
const STATEMENTS: &[&str] = &[
    "SELECT 1",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT s",
    "ROLLBACK TO SAVEPOINT s",
    "RELEASE SAVEPOINT s",
    "COPY accounts FROM STDIN",
    "COPY accounts TO STDOUT",
    "SELECT * FROM accounts WHERE tenant_id = 7",
    "SELECT * FROM accounts WHERE tenant_id = 8",
    "UPDATE accounts SET balance = 1 WHERE tenant_id = 7",
    "INSERT INTO accounts (tenant_id, id) VALUES (7, $1)",
    "SELECT $1::int",
    "SET pgtenant.tenant_id = 7",
    "SET pgtenant.tenant_id = 1500",
    "RESET pgtenant.tenant_id",
    "SET TIME ZONE 'UTC'",
    "RESET ALL",
    "DISCARD ALL",
    "PREPARE p AS SELECT 1",
    "EXECUTE p",
    "DEALLOCATE p",
    "DEALLOCATE ALL",
    "LISTEN c",
    "SELECT pg_sleep(0)",
    "SELECT pg_advisory_lock(1)",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    "START TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
    "FETCH ALL FROM c",
    "CLOSE c",
    "SELECT pgtenant.next_id()",
    "SELECT pgtenant.next_id(2)",
    "",
];

/// What the fake server is told to do with a statement that carries it.
const MARKERS: &[&str] = &["fuzz_error", "fuzz_slow", "fuzz_close", "fuzz_fatal", "fuzz_notice"];

const NAMES: &[&[u8]] = &[b"", b"a", b"b"];

/// A panic on one of these threads (the proxy's tasks, and the fake server's) is a
/// finding; the program's own checks panic on the caller's thread.
const PROXY_THREADS: &str = "pgtenant-fuzz-proxy";
static PANICKED: AtomicBool = AtomicBool::new(false);

/// The runtime every program runs on; each program gets its own proxy and fake
/// server on it, so that it ends as it would alone (a finding reproduces by itself).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        // A panic on any of the proxy's tasks is a finding, though tokio catches it.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(PROXY_THREADS) {
                PANICKED.store(true, Ordering::SeqCst);
            }
            previous(info);
        }));
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(PROXY_THREADS)
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

/// The shipped defaults, but small pools (so that a server a session leaks shows up
/// as a checkout timeout within one input), a 2 s checkout and no health checks worth
/// the name.
fn config_text(fake: SocketAddr) -> String {
    let port = fake.port();
    format!(
        r#"
[proxy]
listen = "127.0.0.1:0"
checkout_timeout_ms = 2000
connect_timeout_ms = 2000
shutdown_timeout_ms = 100

[[users]]
name = "app"
auth = "trust"
password = "app"
pool_size = 3

[[users]]
name = "sess"
auth = "trust"
password = "sess"
pool_size = 3
pool_mode = "session"

[snowflake]
instance = 1

[health]
interval_ms = 600000

[[shards]]
id = 1
[[shards.nodes]]
host = "127.0.0.1"
port = {port}
dbname = "one"
role = "primary"

[[shards]]
id = 2
[[shards.nodes]]
host = "127.0.0.1"
port = {port}
dbname = "two"
role = "primary"

[[ranges]]
min = 1
max = 1000
shard = 1

[[ranges]]
min = 1001
max = 2000
shard = 2
"#
    )
}

/// Reads the input as a program, front to back; zeros once it runs out.
struct Program<'a> {
    data: &'a [u8],
}

impl Program<'_> {
    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = (self.byte() as usize % (max + 1)).min(self.data.len());
        let (taken, rest) = self.data.split_at(n);
        self.data = rest;
        taken.to_vec()
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.byte() as usize % from.len()]
    }

    fn statement(&mut self) -> String {
        self.pick(STATEMENTS).to_string()
    }
}

/// One client of a program: what it writes, and what it is answered.
struct Client {
    write: OwnedWriteHalf,
    answers: mpsc::UnboundedReceiver<Answer>,
    /// The program ended the session on purpose (or may have: a raw message, a
    /// server told to die).
    may_end: bool,
    terminated: bool,
}

/// What the proxy said, as far as the end of a program goes.
#[derive(Debug)]
enum Answer {
    Ready,
    Error {
        fatal: bool,
        text: String,
    },
    /// The closing marker's row.
    Marker,
    Closed,
}

/// Forwards what the proxy sends, message by message, until it hangs up.
async fn read_answers(mut read: OwnedReadHalf, answers: mpsc::UnboundedSender<Answer>) {
    let mut buf = BytesMut::with_capacity(8192);
    loop {
        while let Ok(Some(frame)) = try_parse_frame(&mut buf, 1 << 26) {
            let answer = match frame.tag {
                b'E' => {
                    let field = |kind| {
                        String::from_utf8_lossy(error_field(frame.body(), kind).unwrap_or_default())
                            .into_owned()
                    };
                    let severity = field(b'V');
                    let fatal = severity == "FATAL" || severity == "PANIC";
                    Answer::Error { fatal, text: format!("{severity} {} {}", field(b'C'), field(b'M')) }
                }
                b'D' if frame.body().windows(8).any(|w| w == b"fuzz-end") => Answer::Marker,
                b'Z' => Answer::Ready,
                _ => continue,
            };
            let _ = answers.send(answer);
        }
        match read.read_buf(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = answers.send(Answer::Closed);
                return;
            }
            Ok(_) => {}
        }
    }
}

fn startup_packet(user: &str, tenant: Option<&str>) -> BytesMut {
    let mut body = BytesMut::new();
    body.put_u32(196608);
    for (name, value) in [("user", user), ("database", "app")] {
        body.put_slice(name.as_bytes());
        body.put_u8(0);
        body.put_slice(value.as_bytes());
        body.put_u8(0);
    }
    if let Some(tenant) = tenant {
        body.put_slice(b"options\0");
        body.put_slice(format!("-c pgtenant.tenant_id={tenant}").as_bytes());
        body.put_u8(0);
    }
    body.put_u8(0);
    let mut packet = BytesMut::with_capacity(body.len() + 4);
    packet.put_u32(body.len() as u32 + 4);
    packet.put_slice(&body);
    packet
}

async fn connect(proxy: SocketAddr, program: &mut Program<'_>) -> Client {
    let login = program.byte();
    let user = if login & 1 == 0 { "app" } else { "sess" };
    let tenant = [None, Some("7"), Some("1500"), Some("x")][(login as usize >> 1) % 4];
    let stream = TcpStream::connect(proxy).await.expect("the proxy accepts connections");
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let _ = write.write_all(&startup_packet(user, tenant)).await;
    let (tx, answers) = mpsc::unbounded_channel();
    tokio::spawn(read_answers(read, tx));
    Client { write, answers, may_end: false, terminated: false }
}

/// The message one program step sends (Terminate and raw messages mark the client).
fn step_message(program: &mut Program<'_>, client: &mut Client, op: u8, out: &mut BytesMut) {
    match op {
        0 => query(out, &program.statement()),
        1 => {
            let (a, b) = (program.statement(), program.statement());
            query(out, &format!("{a}; {b}"));
        }
        2 => {
            let name = program.pick(NAMES);
            parse(out, name, program.statement().as_bytes(), &[0, 0]);
        }
        3 => {
            let (portal, statement) = (program.pick(NAMES), program.pick(NAMES));
            let params = program.byte() % 3;
            let format = program.byte() % 2;
            put_message(out, b'B', |b| {
                b.put_slice(portal);
                b.put_u8(0);
                b.put_slice(statement);
                b.put_u8(0);
                b.put_i16(0);
                b.put_i16(params.into());
                for _ in 0..params {
                    b.put_i32(1);
                    b.put_u8(b'7');
                }
                b.put_i16(1);
                b.put_i16(format.into());
            });
        }
        4 | 8 => {
            let kind = if program.byte().is_multiple_of(2) { b'S' } else { b'P' };
            let name = program.pick(NAMES);
            put_message(out, if op == 4 { b'D' } else { b'C' }, |b| {
                b.put_u8(kind);
                b.put_slice(name);
                b.put_u8(0);
            });
        }
        5 => {
            let portal = program.pick(NAMES);
            let max_rows = i32::from(program.byte() % 3);
            put_message(out, b'E', |b| {
                b.put_slice(portal);
                b.put_u8(0);
                b.put_i32(max_rows);
            });
        }
        6 => sync(out),
        7 => put_message(out, b'H', |_| {}),
        9 => {
            let row = program.bytes(64);
            put_message(out, b'd', |b| b.put_slice(&row));
        }
        10 => put_message(out, b'c', |_| {}),
        11 => put_message(out, b'f', |b| b.put_slice(b"fuzz\0")),
        12 => put_message(out, b'F', |b| {
            b.put_u32(2026); // pg_backend_pid
            b.put_i16(0);
            b.put_i16(0);
            b.put_i16(0);
        }),
        15 => {
            terminate(out);
            client.terminated = true;
        }
        16 => {
            let tag = program.byte();
            let body = program.bytes(32);
            put_message(out, tag, |b| b.put_slice(&body));
            client.may_end = true;
        }
        17 => query(out, &String::from_utf8_lossy(&program.bytes(64))),
        18 => parse(out, program.pick(NAMES), &program.bytes(64), &[0, 0]),
        _ => {
            let marker = program.pick(MARKERS);
            if matches!(marker, "fuzz_close" | "fuzz_fatal") {
                client.may_end = true;
            }
            let statement = program.statement();
            let sql = if statement.is_empty() {
                format!("SELECT '{marker}'")
            } else {
                format!("{statement} -- {marker}")
            };
            if program.byte().is_multiple_of(2) {
                query(out, &sql);
            } else {
                parse(out, b"", sql.as_bytes(), &[0, 0]);
                bind_text(out, b"", &[]);
                execute(out);
            }
        }
    }
}

/// A fresh fake server and proxy, the program, then both stopped.
async fn run(data: &[u8]) {
    let (fake, fake_task) = super::fake_server::start().await.expect("the fake server listens");
    let config = crate::config::Config::from_toml(&config_text(fake), std::path::Path::new("fuzz.toml"))
        .expect("the fuzz configuration parses");
    let proxy = crate::server::start(config).await.expect("the proxy starts");
    run_program(proxy.addr, data).await;
    proxy.shutdown().await;
    fake_task.abort();
}

async fn run_program(proxy: SocketAddr, data: &[u8]) {
    let mut program = Program { data };
    let two = program.byte().is_multiple_of(4);
    let mut clients = vec![connect(proxy, &mut program).await];
    if two {
        clients.push(connect(proxy, &mut program).await);
    }
    let mut current = 0;
    let mut out = BytesMut::new();
    let mut trace = Vec::new();
    for _ in 0..MAX_STEPS {
        if program.data.is_empty() {
            break;
        }
        let op = program.byte() % 20;
        match op {
            13 => {
                current = (current + 1) % clients.len();
                trace.push(format!("switch to {current}"));
            }
            14 => tokio::time::sleep(Duration::from_millis(u64::from(program.byte() % 4))).await,
            _ => {
                let client = &mut clients[current];
                if client.terminated {
                    continue;
                }
                out.clear();
                step_message(&mut program, client, op, &mut out);
                trace.push(format!("{current}:{}", describe_messages(&out)));
                // A proxy that hung up on it: the rest is not read.
                let _ = client.write.write_all(&out).await;
            }
        }
    }
    for (i, client) in clients.into_iter().enumerate() {
        finish(client, i, &trace).await;
    }
}

/// Ends a client's program: any COPY failed, any request synced, any transaction
/// rolled back, then the marker asked for until it is answered (a few tries: a
/// marker may be refused for a reason the program caused, a server it told to die).
async fn finish(mut client: Client, i: usize, trace: &[String]) {
    let mut seen: Vec<String> = Vec::new();
    let report = |seen: &[String]| format!("it read: {}; the program: {}", seen.join(", "), trace.join(", "));
    let mut fatal = false;
    // Until the proxy hangs up, or has been quiet for `quiet` (then `None`).
    let next = async |client: &mut Client, quiet: Duration, seen: &mut Vec<String>| {
        let answer = match tokio::time::timeout(quiet, client.answers.recv()).await {
            Ok(answer) => answer.unwrap_or(Answer::Closed),
            Err(_) => return None,
        };
        if seen.len() >= 32 {
            seen.remove(0);
        }
        seen.push(match &answer {
            Answer::Error { text, .. } => text.clone(),
            other => format!("{other:?}"),
        });
        Some(answer)
    };
    let mut out = BytesMut::new();
    if client.terminated {
        // Nothing may come but what the program's requests were owed, then the end.
        loop {
            match next(&mut client, ANSWER_WITHIN, &mut seen).await {
                None => panic!("client {i}: the session outlived its Terminate; {}", report(&seen)),
                Some(Answer::Closed) => return,
                Some(_) => {}
            }
        }
    }
    put_message(&mut out, b'f', |b| b.put_slice(b"fuzz end\0"));
    sync(&mut out);
    query(&mut out, "ROLLBACK");
    let _ = client.write.write_all(&out).await;
    // What the program's own requests were answered.
    loop {
        match next(&mut client, Duration::from_millis(100), &mut seen).await {
            None => break,
            Some(Answer::Closed) => {
                let on_purpose = client.may_end || fatal;
                assert!(on_purpose, "client {i}: the session ended without a FATAL error; {}", report(&seen));
                return;
            }
            Some(Answer::Error { fatal: true, .. }) => fatal = true,
            Some(_) => {}
        }
    }
    for _ in 0..4 {
        out.clear();
        // A transaction the program left failed (its server lost, say) is ended first.
        query(&mut out, "ROLLBACK");
        query(&mut out, "SELECT 'fuzz-end'");
        let _ = client.write.write_all(&out).await;
        let (mut answered, mut readies) = (false, 0);
        while readies < 2 {
            match next(&mut client, ANSWER_WITHIN, &mut seen).await {
                None => panic!("client {i}: no answer within {ANSWER_WITHIN:?} (a hang); {}", report(&seen)),
                Some(Answer::Closed) => {
                    let on_purpose = client.may_end || fatal;
                    assert!(
                        on_purpose,
                        "client {i}: the session ended without a FATAL error; {}",
                        report(&seen)
                    );
                    return;
                }
                Some(Answer::Marker) => answered = true,
                Some(Answer::Error { fatal: true, .. }) => fatal = true,
                Some(Answer::Ready) if answered => return,
                Some(Answer::Ready) => readies += 1,
                Some(Answer::Error { .. }) => {}
            }
        }
    }
    // Answered every time, by a refusal the program may have caused (a pinned session,
    // a tenant the wall keeps out). One that says a server is missing or broken is
    // a finding: a leaked pool slot, a lost connection the session keeps tripping on.
    let persistent = [
        sqlstate::TOO_MANY_CONNECTIONS,
        sqlstate::CONNECTION_FAILURE,
        sqlstate::PROTOCOL_VIOLATION,
        sqlstate::INTERNAL_ERROR,
    ];
    let last_refusal = seen.iter().rev().find(|s| s.starts_with("ERROR")).cloned().unwrap_or_default();
    assert!(
        !persistent.iter().any(|code| last_refusal.contains(code)),
        "client {i}: the closing marker was refused four times; {}",
        report(&seen)
    );
}

/// The messages of one step, for a finding's report: tags, and the SQL of a Query
/// or Parse.
fn describe_messages(out: &[u8]) -> String {
    let mut buf = BytesMut::from(out);
    let mut parts = Vec::new();
    while let Ok(Some(frame)) = try_parse_frame(&mut buf, usize::MAX) {
        let sql = match frame.tag {
            b'Q' => query_text(frame.body()).map(<[u8]>::to_vec),
            b'P' => parse_view(frame.body()).map(|p| p.query.to_vec()),
            _ => None,
        };
        match sql {
            Some(sql) => parts.push(format!("{}({:?})", frame.tag as char, String::from_utf8_lossy(&sql))),
            None => parts.push((frame.tag as char).to_string()),
        }
    }
    parts.join(" ")
}

/// The target: one program, two clients at most.
pub fn session(data: &[u8]) {
    // One program at a time: the tests that replay programs run in parallel threads,
    // and two programs at once would share the small pools.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    runtime().block_on(run(data));
    assert!(!PANICKED.load(Ordering::SeqCst), "a task of the proxy panicked");
}
