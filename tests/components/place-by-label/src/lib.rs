//! A placer of `orl:policy@0.2.0` that reads the node facts: it places first-fit on the
//! first candidate node labelled `prefer=yes`, and otherwise refuses with every candidate
//! node described as `name@region{key=value,…}` (region `-` when none), so a test can see
//! exactly what the host told it.

use placer_fixture::{Candidates, Placement, Placer, Request, first_fit_on_node};

struct PlaceByLabel;

impl Placer for PlaceByLabel {
    fn place(req: Request, candidates: Candidates) -> Result<Placement, String> {
        let nodes = candidates.nodes.id.len();
        if let Some(placement) = (0..nodes)
            .filter(|&j| candidates.node_label(j, "prefer") == Some("yes"))
            .find_map(|j| first_fit_on_node(&req, &candidates, j))
        {
            return Ok(placement);
        }
        let described: Vec<String> = (0..nodes)
            .map(|j| {
                let labels: Vec<String> = (candidates.node_labels(j))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                format!(
                    "{}@{}{{{}}}",
                    candidates.node_name(j),
                    candidates.node_region(j).unwrap_or("-"),
                    labels.join(",")
                )
            })
            .collect();
        Err(format!("no node labelled prefer=yes among {}", described.join(" ")))
    }
}

placer_fixture::export_placer!(PlaceByLabel);
