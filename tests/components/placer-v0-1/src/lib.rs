//! A placer of `orl:policy@0.1.0`, written as plugins were before 0.2.0: its own
//! `wit_bindgen::generate!` over `wit/v0.1`, no kit. It places each request on the
//! lowest-listed free units of the LAST candidate node where every entry fits (ignoring
//! `nvlink-all`, which it refuses), and logs one line per call.

wit_bindgen::generate!({
    path: "../../../wit/v0.1",
    world: "placer",
});

use orl::policy::log::{Level, log};


struct LastFit;

impl Guest for LastFit {
    fn place(req: Request, candidates: Candidates) -> Result<Placement, String> {
        if req.devices.iter().any(|d| d.nvlink_all) {
            return Err("last-fit 0.1 does not place nvlink-all entries".into());
        }
        let nodes = &candidates.nodes;
        let units = &candidates.units;
        for j in (0..nodes.id.len()).rev() {
            let start = nodes.free_start[j] as usize;
            let free: Vec<usize> = (start..start + nodes.free_len[j] as usize).collect();
            let mut taken: Vec<u32> = Vec::new();
            for entry in &req.devices {
                let picked: Vec<u32> = free
                    .iter()
                    .map(|&i| i as u32)
                    .filter(|i| !taken.contains(i))
                    .filter(|&i| units.class[i as usize] == entry.class as u8)
                    .filter(|&i| entry.model.is_none_or(|m| units.model[i as usize] == m))
                    .take(entry.count as usize)
                    .collect();
                if picked.len() < entry.count as usize {
                    taken.clear();
                    break;
                }
                taken.extend(picked);
            }
            let wanted: u32 = req.devices.iter().map(|d| d.count).sum();
            if wanted > 0 && taken.len() == wanted as usize {
                log(Level::Info, &format!("last-fit 0.1 placed on node {}", nodes.id[j]));
                return Ok(Placement {
                    node: nodes.id[j],
                    units: taken,
                });
            }
        }
        Err("last-fit 0.1: no node has room".into())
    }
}

export!(LastFit);
