//! Coverage-guided fuzzing of the public API on host tensors (see ../driver.rs).
#![no_main]

#[path = "../driver.rs"]
mod driver;

libfuzzer_sys::fuzz_target!(|data: &[u8]| driver::run(data));
