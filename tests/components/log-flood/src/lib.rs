//! A placer that floods the host's log: `place` writes 10,000 lines of 200 bytes, each
//! starting `FLOOD`, then places first-fit. A host that keeps its per-call log cap writes
//! only the first few and says how many it dropped.

use placer_fixture::{Candidates, Level, Placement, Placer, Request, first_fit, log};

struct LogFlood;

impl Placer for LogFlood {
    fn place(req: Request, candidates: Candidates) -> Result<Placement, String> {
        let padding = "x".repeat(190);
        for i in 0..10_000 {
            log(Level::Info, &format!("FLOOD {i:05} {padding}"));
        }
        first_fit(&req, &candidates)
    }
}

placer_fixture::export_placer!(LogFlood);
