//! Debug builds only, for the race tests: while the environment variable a gate is named
//! for names a file that does not exist yet, the operation waits where it calls
//! [`hold_at`], so that a test can send another request (or take a lock) into that window
//! and then let it go on by creating the file. On arriving it creates `<file>.reached`,
//! which the test can wait for.
//!
//! - `ORL_TEST_EXTEND_GATE`: an extend that has claimed its reservation, before it decides;
//! - `ORL_TEST_EXTEND_BOOK_GATE`: an extend that found no later booking in its way, before
//!   it moves its bookings;
//! - `ORL_TEST_END_GATE`: a terminal move (release, cancel, expiry) whose guarded update
//!   matched, before its effects (the refund, the bookings' end, the event);
//! - `ORL_TEST_RETRY_GATE`: a pending reservation's retry that decided on the capacity
//!   view, before its write transaction.

pub(crate) async fn hold_at(gate: &str) {
    let Some(file) = std::env::var_os(gate) else {
        return;
    };
    let file = std::path::PathBuf::from(file);
    let mut reached = file.clone().into_os_string();
    reached.push(".reached");
    let _ = std::fs::write(reached, b"");
    while !file.exists() {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
