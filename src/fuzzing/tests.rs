//! The fuzz targets on stable, in CI: their corpora replayed, session programs drawn
//! from a fixed seed, and random bytes through every reader of network input (a
//! fixed-seed generator keeps failures reproducible): nothing may panic.

use bytes::BytesMut;

use crate::protocol::*;
use crate::router::analyze_for_tests as analyze;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Bytes drawn mostly from the ones parsers treat specially.
    fn bytes(&mut self, max: usize) -> Vec<u8> {
        const SPECIAL: &[u8] = b"'\"$/*-;\\\0 \nEeSsPQ=,()0123456789abcT\xc3\xa9\xff";
        let len = (self.next() % max as u64) as usize;
        (0..len)
            .map(|_| {
                let r = self.next();
                if r.is_multiple_of(4) { (r >> 8) as u8 } else { SPECIAL[(r >> 8) as usize % SPECIAL.len()] }
            })
            .collect()
    }
}

#[test]
fn random_bytes_never_panic_the_readers() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let data = rng.bytes(96);
        let mut buf = BytesMut::from(&data[..]);
        while let Ok(Some(frame)) = try_parse_frame(&mut buf, 1 << 16) {
            let body = frame.body();
            let _ = (parse_view(body), bind_view(body), target_view(body), query_text(body));
            let _ = (command_tag(body), parameter_status(body), error_fields(body));
        }
        let _ = frame_header(&data, 1 << 16);
        let _ = read_startup_frame(&data);
        let _ = analyze(&data);
    }
}

/// Every file of every target's corpus (`fuzz/corpus/<target>/`) goes through its
/// target: what libFuzzer found once stays fixed, on stable and in CI.
#[test]
fn the_fuzz_corpora_replay_without_a_panic() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut replayed = 0;
    for (name, target) in super::TARGETS {
        let Ok(entries) = std::fs::read_dir(root.join(name)) else {
            panic!("no corpus for fuzz target {name} in {}", root.display());
        };
        for entry in entries {
            let data = std::fs::read(entry.unwrap().path()).unwrap();
            target(&data);
            replayed += 1;
        }
    }
    assert!(replayed >= super::TARGETS.len(), "every target has inputs");
}

/// The seed of the programs CI runs (they passed).
const FIXED_SEED: u64 = 1795696715444168029;

/// Runs one session program; a failing one is printed in hex first, for
/// `PGTENANT_FUZZ_PROGRAM`. With `RUST_LOG` set, the proxy's logs go to stderr.
fn run_session_program(program: &[u8]) {
    if std::env::var("RUST_LOG").is_ok() {
        let logs = tracing_subscriber::EnvFilter::from_default_env();
        let _ = tracing_subscriber::fmt().with_env_filter(logs).try_init();
    }
    if let Err(panic) = std::panic::catch_unwind(|| super::session(program)) {
        let hex: String = program.iter().map(|b| format!("{b:02x}")).collect();
        println!("the failing program: PGTENANT_FUZZ_PROGRAM={hex}");
        std::panic::resume_unwind(panic);
    }
}

/// One program from `PGTENANT_FUZZ_PROGRAM` (hex), to look into a finding.
#[test]
fn session_program_from_the_environment() {
    if let Ok(hex) = std::env::var("PGTENANT_FUZZ_PROGRAM") {
        let program: Vec<u8> =
            (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect();
        run_session_program(&program);
    }
}

/// Programs the corpus does not hold, 200 of them, as libFuzzer would draw them with
/// no guidance: from a fixed seed in CI (these passed; the run takes seconds), from
/// `PGTENANT_FUZZ_SEED`, or from the clock with `PGTENANT_FUZZ_RANDOM` (the seed is
/// printed).
#[test]
fn random_session_programs_end_answered() {
    let from_clock = || {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        now.as_nanos() as u64 | 1
    };
    let mut seed = match std::env::var("PGTENANT_FUZZ_SEED") {
        Ok(seed) => seed.parse().expect("PGTENANT_FUZZ_SEED: a number"),
        Err(_) if std::env::var("PGTENANT_FUZZ_RANDOM").is_ok() => from_clock(),
        Err(_) => FIXED_SEED,
    };
    println!("session programs from seed {seed}");
    for _ in 0..200 {
        let len = (seed % 300) as usize;
        let program: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        run_session_program(&program);
    }
}
