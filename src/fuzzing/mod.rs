//! Entry points of the fuzz targets (`fuzz/`, libFuzzer through `cargo fuzz`), and of
//! the replay of their corpora that the tests run on stable: each takes bytes as a
//! client (or the network) could send them, and must return without panicking, without
//! hanging and without allocating beyond what its input and the configured limits
//! allow. Every reader pgtenant applies to untrusted bytes is reached from one of them.

mod fake_server;
mod session;

use bytes::BytesMut;

pub use session::session;

use crate::config::{Config, TenantKey};
use crate::protocol::*;

/// The largest message a client may send (the shipped `max_client_message_bytes`).
const MAX_MESSAGE: usize = 1 << 20;

/// A target: arbitrary bytes in, nothing out.
pub type Target = fn(&[u8]);

/// The targets by name, as `fuzz/fuzz_targets/` and the corpus replay call them.
pub const TARGETS: &[(&str, Target)] = &[
    ("frames", frames),
    ("startup", startup),
    ("sql", sql),
    ("config", config),
    ("scatter_plan", scatter_plan),
    ("scram", scram),
    ("session", session),
];

/// A client's byte stream after startup: framed as the session frames it, every
/// message read by each view pgtenant has (Query, Parse, Bind and its parameters and
/// formats, Describe/Close/Execute, and the server messages it inspects).
pub fn frames(data: &[u8]) {
    let mut buf = BytesMut::from(data);
    let _ = frame_header(data, MAX_MESSAGE);
    while let Ok(Some(frame)) = try_parse_frame(&mut buf, MAX_MESSAGE) {
        let body = frame.body();
        let _ = (query_text(body), parse_view(body), target_view(body), command_tag(body));
        let _ = (parameter_status(body), error_fields(body), row_description_columns(body));
        let _ = (parameter_types(body), row_description_with_formats(body, &[0, 1]));
        if let Some(bind) = bind_view(body) {
            let _ = (bind_parameters(bind.rest), bind_result_formats(bind.rest));
            for n in 0..4 {
                if let Some((_, Some(value))) = bind_param(bind.rest, n) {
                    let _ = binary_int(value);
                }
            }
        }
    }
}

/// A startup-phase packet body: StartupMessage, SSLRequest, GSSENCRequest or
/// CancelRequest, then the startup parameters as the session reads them.
pub fn startup(data: &[u8]) {
    if let Ok(StartupPacket::Startup { params, .. }) = read_startup_frame(data) {
        let _ =
            crate::frontend::params::parse_startup(params.clone(), "pgtenant.tenant_id", TenantKey::Bigint);
        let _ = crate::frontend::params::parse_startup(params, "pgtenant.tenant_id", TenantKey::Text);
    }
}

/// A statement's text: the lexer and the analysis that routes it, for both key types.
pub fn sql(data: &[u8]) {
    let _ = crate::router::lexer::tokenize(data);
    for key in [TenantKey::Bigint, TenantKey::Text] {
        let analysis = crate::router::analyze_statement(data, "pgtenant.tenant_id", key);
        let _ = analysis.shape();
    }
}

/// A configuration file: `${NAME}` expansion, TOML, validation.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(text) = crate::config::expand_env(text, |name| (name.len() < 8).then(|| "x".repeat(name.len())))
    else {
        return;
    };
    if let Ok(config) = Config::from_toml(&text, std::path::Path::new("fuzz.toml")) {
        let _ = crate::config::validate(&config);
    }
}

/// A scatter-gather statement, through the planner.
pub fn scatter_plan(data: &[u8]) {
    if let Ok(sql) = std::str::from_utf8(data) {
        let _ = crate::admin::scatter::plan::parse(sql);
    }
}

/// SASL messages: a client-first message, then (after a 0 byte) a client-final one.
pub fn scram(data: &[u8]) {
    use crate::frontend::auth::scram::{Binding, ScramExchange, ScramVerifier};
    let (first, last) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    // Few iterations: the target is the parsing, not the key derivation.
    let verifier = ScramVerifier::from_password("secret", b"saltsalt".to_vec(), 2);
    for binding in [Binding::NotOffered, Binding::Declined, Binding::Required(b"cert-hash")] {
        if let Ok((exchange, _)) = ScramExchange::start(verifier.clone(), binding, first, "server-nonce") {
            let _ = exchange.finish(last);
        }
    }
}

#[cfg(test)]
mod tests;
