//! A placer that allocates without bound: `place` keeps 1 MiB blocks, each written to so
//! that its pages are really used, until the host's memory cap stops it. Growing past the
//! cap makes the allocator fail, which aborts the component (a trap).

use placer_fixture::{Candidates, Placement, Placer, Request};

const BLOCK: usize = 1 << 20;

struct MemoryBomb;

impl Placer for MemoryBomb {
    fn place(_req: Request, _candidates: Candidates) -> Result<Placement, String> {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            hoard.push(vec![0xA5; BLOCK]);
            std::hint::black_box(&hoard);
        }
    }
}

placer_fixture::export_placer!(MemoryBomb);
