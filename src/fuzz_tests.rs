//! Randomized inputs for everything that reads network bytes: nothing may panic.
//! A fixed-seed generator keeps failures reproducible.

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
