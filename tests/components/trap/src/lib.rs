//! A placer that traps on every call: `place` panics, which on wasm32-wasip2 writes the
//! panic message to stderr and aborts with an `unreachable` trap.

use placer_fixture::{Guest, Node, Placement, Request};

struct Trap;

impl Guest for Trap {
    fn place(_req: Request, nodes: Vec<Node>) -> Result<Placement, String> {
        panic!("trap fixture: refusing to place over {} nodes", nodes.len())
    }
}

placer_fixture::export_placer!(Trap);
