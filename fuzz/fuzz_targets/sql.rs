//! Fuzz target: see `pgtenant::fuzzing::sql`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pgtenant::fuzzing::sql(data));
