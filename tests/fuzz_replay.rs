//! The fuzz driver (fuzz/driver.rs) on stable Rust, in CI: the committed corpus
//! (fuzz/corpus/api/) and 20,000 inputs from a seeded generator. A panic fails the test; an
//! abort or a hang fails the run.

#[path = "../fuzz/driver.rs"]
mod driver;

#[test]
fn corpus_and_seeded_inputs_run_clean() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/api");
    let mut files = 0;
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            driver::run(&std::fs::read(entry.path()).unwrap());
            files += 1;
        }
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..20_000 {
        let len = 16 + i % 200;
        let data: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        driver::run(&data);
    }
    println!("{files} corpus files and 20000 seeded inputs");
}
