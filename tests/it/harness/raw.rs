//! A raw-protocol client for tests that send what no driver would: it speaks the
//! startup and SCRAM exchange itself, then writes arbitrary bytes.

use bytes::{BufMut, BytesMut};
use postgres_protocol::authentication::sasl::{ChannelBinding, SCRAM_SHA_256, ScramSha256};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct RawClient {
    pub stream: TcpStream,
    buf: BytesMut,
    /// BackendKeyData's process id and secret key, once logged in.
    pub key: Option<(i32, i32)>,
}

/// One backend message: tag and body.
#[derive(Debug)]
pub struct Msg {
    pub tag: u8,
    pub body: Vec<u8>,
}

impl Msg {
    /// The SQLSTATE of an ErrorResponse or NoticeResponse; `None` for other messages.
    pub fn sqlstate(&self) -> Option<String> {
        if !matches!(self.tag, b'E' | b'N') {
            return None;
        }
        let mut fields = self.body.split(|b| *b == 0);
        fields.find_map(|f| f.strip_prefix(b"C").map(|c| String::from_utf8_lossy(c).into_owned()))
    }
}

impl RawClient {
    pub async fn connect(addr: std::net::SocketAddr) -> RawClient {
        RawClient { stream: TcpStream::connect(addr).await.unwrap(), buf: BytesMut::new(), key: None }
    }

    /// Connects and logs in as app/app with the given startup parameters.
    pub async fn login(addr: std::net::SocketAddr, params: &[(&str, &str)]) -> RawClient {
        let mut c = Self::connect(addr).await;
        let mut all = vec![("user", "app"), ("database", "app")];
        all.extend_from_slice(params);
        let mut out = BytesMut::new();
        frontend::startup_message(all.iter().copied(), &mut out).unwrap();
        c.send(&out).await;
        let mut scram = ScramSha256::new(b"app", ChannelBinding::unsupported());
        loop {
            let m = c.recv().await.expect("login message");
            match m.tag {
                b'R' => {
                    let code = i32::from_be_bytes(m.body[..4].try_into().unwrap());
                    let mut out = BytesMut::new();
                    match code {
                        10 => {
                            frontend::sasl_initial_response(SCRAM_SHA_256, scram.message(), &mut out).unwrap()
                        }
                        11 => {
                            scram.update(&m.body[4..]).unwrap();
                            frontend::sasl_response(scram.message(), &mut out).unwrap();
                        }
                        12 | 0 => {}
                        other => panic!("unexpected auth code {other}"),
                    }
                    if !out.is_empty() {
                        c.send(&out).await;
                    }
                }
                b'K' => {
                    let word = |at: usize| i32::from_be_bytes(m.body[at..at + 4].try_into().unwrap());
                    c.key = Some((word(0), word(4)));
                }
                b'Z' => return c,
                b'E' => panic!("login failed: {:?}", String::from_utf8_lossy(&m.body)),
                _ => {}
            }
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Next backend message, or `None` when the connection closed.
    pub async fn recv(&mut self) -> Option<Msg> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() > len {
                    let raw = self.buf.split_to(len + 1);
                    return Some(Msg { tag: raw[0], body: raw[5..].to_vec() });
                }
            }
            let mut chunk = [0u8; 8192];
            let n = tokio::time::timeout(std::time::Duration::from_secs(10), self.stream.read(&mut chunk))
                .await
                .ok()?
                .ok()?;
            if n == 0 {
                return None;
            }
            self.buf.put_slice(&chunk[..n]);
        }
    }

    /// Reads messages up to and including ReadyForQuery.
    pub async fn until_ready(&mut self) -> Vec<Msg> {
        let mut out = Vec::new();
        while let Some(m) = self.recv().await {
            let done = m.tag == b'Z';
            out.push(m);
            if done {
                break;
            }
        }
        out
    }

    /// Sends `request` and reads its answer, up to and including ReadyForQuery.
    pub async fn request(&mut self, request: &[u8]) -> Vec<Msg> {
        self.send(request).await;
        self.until_ready().await
    }

    pub async fn query(&mut self, sql: &str) -> Vec<Msg> {
        let mut out = BytesMut::new();
        frontend::query(sql, &mut out).unwrap();
        self.send(&out).await;
        self.until_ready().await
    }
}

/// The SQLSTATE of the first ErrorResponse, if any.
pub fn sqlstate(msgs: &[Msg]) -> Option<String> {
    msgs.iter().filter(|m| m.tag == b'E').find_map(|m| m.sqlstate())
}

/// The text of the first column of every DataRow.
pub fn first_column(msgs: &[Msg]) -> Vec<String> {
    msgs.iter()
        .filter(|m| m.tag == b'D')
        .map(|m| {
            let len = i32::from_be_bytes(m.body[2..6].try_into().unwrap());
            String::from_utf8_lossy(&m.body[6..6 + len as usize]).into_owned()
        })
        .collect()
}

/// Bind (F) of the unnamed statement to the unnamed portal: no parameters, text results.
pub fn bind_unnamed(out: &mut BytesMut) {
    let no_values = std::iter::empty::<()>();
    let serialize = |_: (),
                     _: &mut BytesMut|
     -> Result<postgres_protocol::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        Ok(postgres_protocol::IsNull::Yes)
    };
    if frontend::bind("", "", std::iter::empty(), no_values, serialize, [0i16], out).is_err() {
        panic!("bind encodes");
    }
}

/// Parse of `sql` as the unnamed statement, Bind (`bind_unnamed`), a Describe (`b'P'`:
/// of the portal, `b'S'`: of the statement) if asked, Execute, then `end` (Sync or
/// Flush): one statement's request as drivers send it.
pub fn unnamed_request(sql: &str, describe: Option<u8>, end: fn(&mut BytesMut)) -> BytesMut {
    let mut out = BytesMut::new();
    frontend::parse("", sql, [], &mut out).unwrap();
    bind_unnamed(&mut out);
    if let Some(kind) = describe {
        frontend::describe(kind, "", &mut out).unwrap();
    }
    frontend::execute("", 0, &mut out).unwrap();
    end(&mut out);
    out
}
