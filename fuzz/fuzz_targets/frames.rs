//! Fuzz target: see `pgtenant::fuzzing::frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pgtenant::fuzzing::frames(data));
