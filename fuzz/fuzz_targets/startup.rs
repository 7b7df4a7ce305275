//! Fuzz target: see `pgtenant::fuzzing::startup`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pgtenant::fuzzing::startup(data));
