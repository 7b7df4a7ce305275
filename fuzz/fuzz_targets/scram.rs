//! Fuzz target: see `pgtenant::fuzzing::scram`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pgtenant::fuzzing::scram(data));
