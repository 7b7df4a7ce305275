//! Fuzz target: see `pgtenant::fuzzing::session`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pgtenant::fuzzing::session(data));
