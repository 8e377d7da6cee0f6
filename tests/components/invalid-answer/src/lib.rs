//! A placer that answers with placements the host must refuse. It computes a valid
//! first-fit placement and then breaks it; `request.duration-seconds` picks how:
//!
//! | duration-seconds | answer |
//! |---|---|
//! | 1 | the right number of ids, the last one never offered on any node |
//! | 2 | the right number of ids, the last one a duplicate of the first |
//! | 3 | valid ids, but `placement.node` names another candidate node (needs two nodes) |
//! | 4 | one id fewer than the request asks for |
//! | 5 | valid ids on a node id that is not a candidate |
//! | 6 | the first id replaced by an offered unit of another class or model, if there is one |
//! | anything else | an id never offered and duplicates at once: `[first, first, unknown]` |
//!
//! With no valid placement to break it answers `err`.

use placer_fixture::{Candidates, Placement, Placer, Request, first_fit, free};

struct InvalidAnswer;

impl Placer for InvalidAnswer {
    fn place(req: Request, candidates: Candidates) -> Result<Placement, String> {
        let valid = first_fit(&req, &candidates)
            .map_err(|_| "invalid-answer fixture: no valid placement to break".to_string())?;
        let never_offered = (candidates.units.class.len() as u32).wrapping_add(1000);
        let mut units = valid.units.clone();
        let first = units.first().copied().unwrap_or(0);
        let node = match req.duration_seconds {
            1 => {
                if let Some(last) = units.last_mut() {
                    *last = never_offered;
                }
                valid.node
            }
            2 => {
                if let Some(last) = units.last_mut() {
                    *last = first;
                }
                valid.node
            }
            3 => candidates
                .nodes
                .id
                .iter()
                .copied()
                .find(|&id| id != valid.node)
                .unwrap_or(valid.node),
            4 => {
                units.pop();
                valid.node
            }
            5 => candidates
                .nodes
                .id
                .iter()
                .copied()
                .max()
                .unwrap_or(0)
                .wrapping_add(1000),
            6 => {
                let entry = req.devices.iter().find(|d| d.count > 0);
                let home = candidates.nodes.id.iter().position(|&id| id == valid.node);
                let home_units = home.map(|j| free(&candidates, j)).unwrap_or_default();
                let mismatch = entry.and_then(|entry| {
                    home_units.iter().find(|u| {
                        u.class != entry.class || entry.model.is_some_and(|m| m != u.model)
                    })
                });
                if let (Some(unit), Some(slot)) = (mismatch, units.first_mut()) {
                    *slot = unit.id;
                }
                valid.node
            }
            _ => {
                units = vec![first, first, never_offered];
                valid.node
            }
        };
        Ok(Placement { node, units })
    }
}

placer_fixture::export_placer!(InvalidAnswer);
