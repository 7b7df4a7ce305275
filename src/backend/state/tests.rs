//! What a server connection owes, answer by answer.

use super::*;
use crate::protocol::try_parse_frame;

fn msg(tag: u8, body: &[u8]) -> (u8, Vec<u8>) {
    let mut b = BytesMut::new();
    protocol::put_message(&mut b, tag, |x| x.extend_from_slice(body));
    (tag, b.to_vec())
}

impl ResponseQueue {
    fn on(&mut self, m: (u8, Vec<u8>), out: &mut BytesMut) -> Effects {
        self.on_server_message(m.0, &m.1, out)
    }
}

fn client(reply: Reply) -> Pending {
    Pending::client(reply)
}

fn synthetic(build: fn(&mut BytesMut)) -> Pending {
    let mut b = BytesMut::new();
    build(&mut b);
    Pending::Synthetic(b.freeze())
}

fn tags(out: &BytesMut) -> Vec<u8> {
    let mut b = out.clone();
    std::iter::from_fn(|| try_parse_frame(&mut b, 1 << 20).unwrap().map(|f| f.tag)).collect()
}

#[test]
fn plain_answers_to_the_clients_own_messages_pass_as_on_server_message_would_pass_them() {
    let registry = crate::backend::prepared::StatementRegistry::new(10, 1 << 20);
    let stmt = registry.intern(b"select 1", b"\0\0");
    let mut q = ResponseQueue::default();
    q.push(Pending::Client { reply: Reply::Parse, statement: Some(stmt.clone()), changes: 0 });
    q.push(synthetic(protocol::parse_complete));
    q.push(client(Reply::Execute));
    q.push(client(Reply::Sync));
    assert_eq!(q.pass_answer(b'1'), Some(true), "completes the Parse; a synthetic reply is next");
    assert!(stmt.is_validated());
    let mut out = BytesMut::new();
    q.drain_synthetic(&mut out);
    assert_eq!(tags(&out), b"1");
    assert_eq!(q.pass_answer(b'D'), Some(false), "rows complete nothing");
    for tag in [b'E', b'Z', b'S', b'N', b'A', b'G', b'H', b'W', b'd', b'c'] {
        assert_eq!(q.pass_answer(tag), None, "{}", tag as char);
    }
    assert_eq!(q.pass_answer(b'C'), Some(false), "completes the Execute");
    assert_eq!(q.pass_answer(b'C'), Some(false), "forwarded as on_server_message would, nothing popped");
    assert!(!q.is_empty(), "the Sync waits for its ReadyForQuery");
    let mut q = ResponseQueue::default();
    q.push(Pending::Injected { reply: Reply::Bind, on_error: OnError::Swallow, statement: None });
    assert_eq!(q.pass_answer(b'2'), None, "swallowed by on_server_message");
}

#[test]
fn synthetic_parse_complete_comes_first_and_injected_replies_are_swallowed() {
    let mut q = ResponseQueue::default();
    let mut out = BytesMut::new();
    q.push(Pending::Injected { reply: Reply::Query, on_error: OnError::Swallow, statement: None });
    q.push(synthetic(protocol::parse_complete));
    q.push(client(Reply::Bind));
    q.push(client(Reply::Execute));
    q.push(client(Reply::Sync));
    for (tag, body) in
        [(b'C', &b"SET\0"[..]), (b'Z', b"I"), (b'2', b""), (b'D', b"\0\0"), (b'C', b"SELECT 1\0")]
    {
        let fx = q.on(msg(tag, body), &mut out);
        assert!(fx.ready.is_none() && !fx.desync);
    }
    let fx = q.on(msg(b'Z', b"I"), &mut out);
    assert_eq!(fx.ready, Some(TxStatus::Idle));
    assert_eq!(tags(&out), b"12DCZ");
    assert!(q.is_empty());
}

#[test]
fn a_failed_injected_message_before_a_simple_query_asks_for_a_sync() {
    let mut q = ResponseQueue::default();
    let mut out = BytesMut::new();
    for reply in [Reply::Bind, Reply::Execute] {
        q.push(Pending::Injected { reply, on_error: OnError::Forward, statement: None });
    }
    q.push(client(Reply::Query));
    assert_eq!(q.on(msg(b'2', b""), &mut out), Effects::default());
    let fx = q.on(msg(b'E', b"SERROR\0C42501\0Mdenied\0\0"), &mut out);
    assert!(fx.send_sync && fx.client_error);
    // The server skipped the query; the Sync's ReadyForQuery answers it.
    let fx = q.on(msg(b'Z', b"I"), &mut out);
    assert_eq!(fx.ready, Some(TxStatus::Idle));
    assert_eq!(tags(&out), b"EZ");
    assert!(q.is_empty());
}

#[test]
fn a_bind_refused_for_a_stale_plan_retires_its_statement_and_keeps_it_prepared() {
    let registry = crate::backend::StatementRegistry::new(10, 1 << 20);
    let stale = b"SERROR\0C0A000\0Mcached plan must not change result type\0RRevalidateCachedQuery\0\0";
    let translated = b"SERROR\0C0A000\0Mle plan en cache ne doit pas changer\0RRevalidateCachedQuery\0\0";
    let other = b"SERROR\0C22P02\0Minvalid input syntax\0RRevalidateCachedQuery\0\0";
    for (reply, error, retired) in [
        (Reply::Bind, &stale[..], true),
        (Reply::Describe, &translated[..], true),
        (Reply::Bind, &other[..], false),
    ] {
        let stmt = registry.intern(b"SELECT * FROM t", b"\0\0");
        let mut q = ResponseQueue::default();
        let mut out = BytesMut::new();
        q.push(Pending::Client { reply, statement: Some(stmt.clone()), changes: 0 });
        q.push(client(Reply::Execute));
        q.push(client(Reply::Sync));
        let fx = q.on(msg(b'E', error), &mut out);
        assert!(fx.client_error && fx.unprepared.is_empty(), "the server still has it: {fx:?}");
        let next = registry.intern(b"SELECT * FROM t", b"\0\0");
        assert_eq!(next.id != stmt.id, retired, "{reply:?} {:?}", String::from_utf8_lossy(error));
        assert_eq!(q.on(msg(b'Z', b"I"), &mut out).ready, Some(TxStatus::Idle));
    }
}

#[test]
fn error_skips_to_sync_and_forgets_failed_prepares() {
    let mut q = ResponseQueue::default();
    let mut out = BytesMut::new();
    let stmt = crate::backend::StatementRegistry::new(1, 1 << 20).intern(b"SELECT", b"\0\0");
    q.push(Pending::Client { reply: Reply::Parse, statement: Some(stmt.clone()), changes: 0 });
    q.push(client(Reply::Bind));
    q.push(synthetic(protocol::close_complete));
    q.push(client(Reply::Sync));
    let fx = q.on(msg(b'E', b"SERROR\0C42601\0Mbad\0\0"), &mut out);
    assert_eq!(fx.unprepared, vec![stmt.id]);
    assert!(!stmt.is_validated());
    let fx = q.on(msg(b'Z', b"I"), &mut out);
    assert_eq!(fx.ready, Some(TxStatus::Idle));
    assert_eq!(tags(&out), b"EZ");
    assert!(q.is_empty());
}

#[test]
fn simple_query_error_waits_for_ready() {
    let mut q = ResponseQueue::default();
    let mut out = BytesMut::new();
    q.push(client(Reply::Query));
    q.on(msg(b'E', b"SERROR\0\0"), &mut out);
    assert!(!q.is_empty());
    let fx = q.on(msg(b'Z', b"E"), &mut out);
    assert_eq!(fx.ready, Some(TxStatus::Failed));
    assert!(q.is_empty());
}

#[test]
fn syncs_sent_before_copy_data_get_no_reply() {
    let mut q = ResponseQueue::default();
    let mut out = BytesMut::new();
    q.push(client(Reply::Bind));
    q.push(client(Reply::Execute));
    q.push(client(Reply::Sync));
    q.push(Pending::CopyEnd);
    q.push(client(Reply::Sync));
    for (tag, body) in [(b'2', &b""[..]), (b'G', b"\0\0\0"), (b'C', b"COPY 1\0")] {
        q.on(msg(tag, body), &mut out);
    }
    let fx = q.on(msg(b'Z', b"I"), &mut out);
    assert_eq!(fx.ready, Some(TxStatus::Idle));
    assert!(q.is_empty(), "{q:?}");
    assert_eq!(tags(&out), b"2GCZ");
}

#[test]
fn a_successful_parse_validates_its_statement() {
    let mut q = ResponseQueue::default();
    let mut out = BytesMut::new();
    let stmt = crate::backend::StatementRegistry::new(1, 1 << 20).intern(b"SELECT", b"\0\0");
    q.push(Pending::Injected {
        reply: Reply::Parse,
        on_error: OnError::Forward,
        statement: Some(stmt.clone()),
    });
    q.on(msg(b'1', b""), &mut out);
    assert!(stmt.is_validated());
    assert!(out.is_empty(), "an injected ParseComplete is swallowed");
}

#[test]
fn a_failed_injected_set_is_swallowed_but_reported() {
    let mut q = ResponseQueue::default();
    let mut out = BytesMut::new();
    q.push(Pending::Injected { reply: Reply::Query, on_error: OnError::Swallow, statement: None });
    q.push(client(Reply::Query));
    let fx = q.on(msg(b'E', b"SERROR\0C42601\0Msyntax error\0\0"), &mut out);
    assert!(fx.injected_failed && !fx.client_error);
    assert!(!q.on(msg(b'Z', b"I"), &mut out).injected_failed);
    assert!(out.is_empty(), "the client never sees it");
    assert!(!q.on(msg(b'E', b"SERROR\0C42P01\0Mno table\0\0"), &mut out).injected_failed);
}

#[test]
fn refused_session_settings_are_reported_without_closing_the_connection() {
    let mut q = ResponseQueue::default();
    let mut out = BytesMut::new();
    q.push(Pending::Injected { reply: Reply::Query, on_error: OnError::Report, statement: None });
    q.push(client(Reply::Query));
    let fx = q.on(msg(b'E', b"SERROR\0C22023\0Minvalid value\0\0"), &mut out);
    assert!(!fx.injected_failed && !fx.client_error);
    assert_eq!(
        fx.settings_failed.map(|f| (f.code, f.message)),
        Some(("22023".into(), "invalid value".into()))
    );
    assert!(q.on(msg(b'Z', b"I"), &mut out).settings_failed.is_none());
    assert!(out.is_empty(), "the session tells the client, not the queue");
    let fx = q.on(msg(b'E', b"SERROR\0C42P01\0Mno table\0\0"), &mut out);
    assert!(fx.client_error && fx.settings_failed.is_none(), "the client's own error passes");
}

#[test]
fn messages_sent_after_an_error_and_before_the_sync_wait_for_nothing() {
    let mut q = ResponseQueue::default();
    let mut out = BytesMut::new();
    for reply in [Reply::Bind, Reply::Execute] {
        q.push(client(reply));
    }
    let fx = q.on(msg(b'2', b""), &mut out);
    assert!(!fx.client_error);
    let fx = q.on(msg(b'E', b"SERROR\0C22012\0Mdivision by zero\0\0"), &mut out);
    assert!(fx.client_error && q.is_empty());
    // The client sends on (a pipeline): the server skips all of it but the Sync.
    let stmt = crate::backend::StatementRegistry::new(1, 1 << 20).intern(b"SELECT 2", b"\0\0");
    q.push(Pending::Client { reply: Reply::Parse, statement: Some(stmt.clone()), changes: 0 });
    q.push(synthetic(protocol::parse_complete));
    for reply in [Reply::Bind, Reply::Describe, Reply::Execute, Reply::Sync] {
        q.push(client(reply));
    }
    let fx = q.on(msg(b'Z', b"I"), &mut out);
    assert!(!fx.desync, "{fx:?}");
    assert_eq!(fx.ready, Some(TxStatus::Idle));
    assert_eq!(fx.unprepared, [stmt.id], "the skipped Parse prepared nothing");
    assert!(q.is_empty());
    // And the next request is waited for as usual.
    q.push(client(Reply::Bind));
    assert!(!q.is_empty());
}

#[test]
fn unexpected_message_is_a_desync() {
    let mut q = ResponseQueue::default();
    let mut out = BytesMut::new();
    assert!(q.on(msg(b'D', b""), &mut out).desync);
}
