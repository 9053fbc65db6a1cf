//! The GPU suites' watchdog (tests/common/watchdog.rs): a test process still running at its
//! deadline ends with status 124 instead of hanging. Runs without a GPU.

mod common;

use common::watchdog;
use std::process::Command;
use std::time::{Duration, Instant};

/// Set only in the process that [`a_process_past_its_deadline_exits_with_124`] starts.
const CHILD_VAR: &str = "FLASHCORE_WATCHDOG_CHILD";

/// The child process's test: arms the watchdog, then blocks far longer than the deadline, as a
/// test waiting on a deadlocked kernel would. Without [`CHILD_VAR`] (an `--include-ignored` run)
/// it returns at once.
#[test]
#[ignore = "the child process of a_process_past_its_deadline_exits_with_124"]
fn blocks_past_the_deadline() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return;
    }
    watchdog::arm();
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_process_past_its_deadline_exits_with_124() {
    let start = Instant::now();
    let out = Command::new(std::env::current_exe().expect("this test binary's path"))
        .args([
            "--exact",
            "blocks_past_the_deadline",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_VAR, "1")
        .env(watchdog::DEADLINE_VAR, "1")
        .output()
        .expect("start the child test process");
    let elapsed = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(watchdog::EXIT_STATUS),
        "the child's status; stderr: {stderr}"
    );
    assert!(
        elapsed < Duration::from_secs(60),
        "the child ran {elapsed:?}"
    );
    assert!(
        stderr.contains("watchdog: this test process still runs after 1 s"),
        "{stderr}"
    );
}
