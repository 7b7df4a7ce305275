//! Fuzz target: see `pgtenant::fuzzing::scatter_plan`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pgtenant::fuzzing::scatter_plan(data));
