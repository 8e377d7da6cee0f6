//! A placer that blocks in a host call: `place` sleeps 10 s (`std::thread::sleep`, which
//! subscribes to `wasi:clocks/monotonic-clock` and blocks in `wasi:io/poll`), then places
//! first-fit. Epoch interruption alone cannot stop it: the plugin is in the host, not in
//! its own code, so only a deadline that covers host calls does.

use std::time::Duration;

use placer_fixture::{Candidates, Placement, Placer, Request, first_fit};

struct SleepForever;

impl Placer for SleepForever {
    fn place(req: Request, candidates: Candidates) -> Result<Placement, String> {
        std::thread::sleep(Duration::from_secs(10));
        first_fit(&req, &candidates)
    }
}

placer_fixture::export_placer!(SleepForever);
