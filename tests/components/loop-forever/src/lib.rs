//! A placer that never returns: `place` spins forever without allocating or calling the
//! host. Only the host's per-call deadline (epoch interruption) stops it.

use placer_fixture::{Candidates, Placement, Placer, Request};

struct LoopForever;

impl Placer for LoopForever {
    fn place(_req: Request, _candidates: Candidates) -> Result<Placement, String> {
        let mut spins: u64 = 0;
        loop {
            spins = std::hint::black_box(spins.wrapping_add(1));
        }
    }
}

placer_fixture::export_placer!(LoopForever);
