//! Reasons for unschedulable requests, written for the person who made the request.

use crate::{Candidates, DeviceRequest, Request, fit};

/// Why no node holds `req`: the first entry that no node holds even on its own, or, when
/// each entry fits somewhere, all of them together.
pub(crate) fn no_node_fits(req: &Request, candidates: &Candidates) -> String {
    let wanted: Vec<&DeviceRequest> = req.devices.iter().filter(|d| d.count > 0).collect();
    if candidates.nodes.is_empty() {
        return format!("no node has {}: no candidate nodes", all_of(req));
    }
    if wanted.len() > 1 {
        for entry in &wanted {
            let alone = Request {
                devices: vec![(*entry).clone()],
                ..req.clone()
            };
            let mut scratch = fit::Scratch::new(&alone);
            if candidates
                .views()
                .all(|n| fit::best_on(&alone, &n, &mut scratch).is_none())
            {
                return format!("no node has {}", describe(req, entry));
            }
        }
        return format!("no node has, at the same time, {}", all_of(req));
    }
    format!("no node has {}", all_of(req))
}

/// Every entry that asks for something, described and joined: `a, b and c`.
pub(crate) fn all_of(req: &Request) -> String {
    let parts: Vec<String> = (req.devices.iter())
        .filter(|d| d.count > 0)
        .map(|d| describe(req, d))
        .collect();
    match parts.split_last() {
        None => "the requested devices".to_string(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// `8 free gpu units of model H100 in one NVLink domain`.
fn describe(req: &Request, entry: &DeviceRequest) -> String {
    let mut text = format!(
        "{} free {} unit{}",
        entry.count,
        entry.class,
        if entry.count == 1 { "" } else { "s" }
    );
    if let Some(model) = entry.model {
        text.push_str(" of model ");
        text.push_str(&req.model_name(model));
    }
    if entry.nvlink_all {
        text.push_str(" in one NVLink domain");
    }
    text
}
