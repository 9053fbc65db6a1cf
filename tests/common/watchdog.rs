//! A deadline for a test process that runs GPU kernels. A kernel that deadlocks blocks its test
//! in a synchronisation forever, and libtest has no time limit of its own: without this, a GPU
//! suite that hits one holds the GPU until something outside kills it (docs/HOPPER.md, round 67:
//! one hang took a whole 600 s device call).

use std::sync::Once;
use std::time::Duration;

/// The variable that sets the deadline, in seconds.
pub const DEADLINE_VAR: &str = "FLASHCORE_TEST_DEADLINE_S";
/// The deadline when the variable is unset: far above the suites' own run times (the GPU suite
/// takes about 2 minutes on an H200).
pub const DEFAULT_DEADLINE_S: u64 = 1200;
/// The exit status at the deadline: `timeout`'s, which the bundle's scripts report as TIMED OUT.
pub const EXIT_STATUS: i32 = 124;

/// Starts, once per process, a thread that ends the process with [`EXIT_STATUS`] once
/// [`DEADLINE_VAR`] seconds (default [`DEFAULT_DEADLINE_S`]) have passed since the first call.
/// Every GPU test helper calls it before its first CUDA call.
pub fn arm() {
    static ARMED: Once = Once::new();
    ARMED.call_once(|| {
        let seconds = std::env::var(DEADLINE_VAR)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(DEFAULT_DEADLINE_S);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(seconds));
            eprintln!(
                "watchdog: this test process still runs after {seconds} s ({DEADLINE_VAR}); \
                 a kernel may have deadlocked. Exiting with status {EXIT_STATUS}."
            );
            std::process::exit(EXIT_STATUS);
        });
    });
}
