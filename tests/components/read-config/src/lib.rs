//! A placer that reports its config file, to prove the host's read-only config directory
//! works: it reads `/config/config.json` (the host mounts a plugin's config directory at
//! `/config`, see `placer_fixture::CONFIG_DIR`) and answers `err("CONFIG: <contents>")`, or
//! `err("CONFIG UNREADABLE: <error>")` when it cannot. It also tries to write beside it and
//! answers `err("CONFIG WRITABLE")` if that works, since the directory must be read-only.

use placer_fixture::{CONFIG_DIR, Candidates, Placement, Placer, Request};

struct ReadConfig;

impl Placer for ReadConfig {
    fn place(_req: Request, _candidates: Candidates) -> Result<Placement, String> {
        if std::fs::write(format!("{CONFIG_DIR}/written-by-plugin"), b"x").is_ok() {
            return Err("CONFIG WRITABLE".to_string());
        }
        match std::fs::read_to_string(format!("{CONFIG_DIR}/config.json")) {
            Ok(contents) => Err(format!("CONFIG: {contents}")),
            Err(err) => Err(format!("CONFIG UNREADABLE: {err}")),
        }
    }
}

placer_fixture::export_placer!(ReadConfig);
