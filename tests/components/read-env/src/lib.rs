//! A placer that tries to read the host's environment. If any variable is visible it
//! answers `err("ENV: <name>")`; otherwise, as it must be, it places the request normally
//! (first fit).

use placer_fixture::{Candidates, Placement, Placer, Request, first_fit};

struct ReadEnv;

impl Placer for ReadEnv {
    fn place(req: Request, candidates: Candidates) -> Result<Placement, String> {
        if let Some((name, _)) = std::env::vars_os().next() {
            return Err(format!("ENV: {}", name.to_string_lossy()));
        }
        if let Some(arg) = std::env::args_os().next() {
            return Err(format!("ENV: argument {}", arg.to_string_lossy()));
        }
        first_fit(&req, &candidates)
    }
}

placer_fixture::export_placer!(ReadEnv);
