//! A placer that traps on every call: `place` panics, which on wasm32-wasip2 writes the
//! panic message to stderr and aborts with an `unreachable` trap.

use placer_fixture::{Candidates, Placement, Placer, Request};

struct Trap;

impl Placer for Trap {
    fn place(_req: Request, candidates: Candidates) -> Result<Placement, String> {
        panic!(
            "trap fixture: refusing to place over {} nodes",
            candidates.nodes.id.len()
        )
    }
}

placer_fixture::export_placer!(Trap);
