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
//!   view, before its write transaction;
//! - `ORL_TEST_CREATE_GATE`: each placement attempt of a create that decided on the
//!   capacity view, before its writes, one file per attempt ([`hold_attempt`]).

use std::path::PathBuf;

pub(crate) async fn hold_at(gate: &str) {
    if let Some(file) = std::env::var_os(gate) {
        hold(PathBuf::from(file)).await;
    }
}

/// [`hold_at`] for attempt `attempt` of an operation tried again: held until
/// `<file>.<attempt>` exists, so that a test can hold every attempt.
pub(crate) async fn hold_attempt(gate: &str, attempt: u32) {
    if let Some(mut file) = std::env::var_os(gate) {
        file.push(format!(".{attempt}"));
        hold(PathBuf::from(file)).await;
    }
}

async fn hold(file: PathBuf) {
    let mut reached = file.clone().into_os_string();
    reached.push(".reached");
    let _ = std::fs::write(reached, b"");
    while !file.exists() {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
