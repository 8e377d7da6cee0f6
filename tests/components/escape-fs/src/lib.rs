//! A placer that tries to read files it must not see: `/etc/passwd`, the same through `..`
//! from its config directory (`/config`, see `placer_fixture::CONFIG_DIR`), relative paths,
//! and a listing of `/`.
//!
//! If any attempt succeeds it answers `err("ESCAPED: <what>: <first bytes>")`, so a host test
//! sees the leak in the decision's reason. If every attempt fails, as it must, it places the
//! request normally (first fit).

use placer_fixture::{CONFIG_DIR, Candidates, Level, Placement, Placer, Request, first_fit, log};

const FILES: &[&str] = &[
    "/etc/passwd",
    "/config/../etc/passwd",
    "/config/../../etc/passwd",
    "/config/../../../../../../etc/passwd",
    "../etc/passwd",
    "../../../../../../etc/passwd",
    "etc/passwd",
    "/proc/self/environ",
];

const DIRS: &[&str] = &["/", "/config/..", "..", "."];

struct EscapeFs;

impl Placer for EscapeFs {
    fn place(req: Request, candidates: Candidates) -> Result<Placement, String> {
        for path in FILES {
            match std::fs::read(path) {
                Ok(bytes) => {
                    let head = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned();
                    return Err(format!("ESCAPED: {path}: {head}"));
                }
                Err(err) => log(Level::Debug, &format!("escape-fs: {path}: {err}")),
            }
        }
        // Listing the config directory itself is allowed; any other name is a leak.
        let own = list(CONFIG_DIR);
        for dir in DIRS {
            let leaked: Vec<String> = list(dir)
                .into_iter()
                .filter(|name| !own.contains(name))
                .take(8)
                .collect();
            if !leaked.is_empty() {
                return Err(format!("ESCAPED: {dir}: {}", leaked.join(" ")));
            }
        }
        first_fit(&req, &candidates)
    }
}

placer_fixture::export_placer!(EscapeFs);

/// The names in `dir`, or none when it cannot be listed.
fn list(dir: &str) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}
