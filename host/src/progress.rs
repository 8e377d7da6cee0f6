//! Progress of long operations on the terminal (bulk node registration, a plugin's upload
//! while the server compiles it, benchmarks). It is drawn on stderr only when stderr is a
//! terminal, so piped or captured output never holds a bar and stdout stays the answer.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of `len` steps, each step one `unit` (`nodes`, `decisions`), titled `what`.
pub fn bar(len: u64, what: impl Into<String>, unit: &str) -> ProgressBar {
    let template =
        format!("{{msg}} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{elapsed}}, {{eta}} left)");
    let bar = ProgressBar::with_draw_target(Some(len), target());
    bar.set_style(
        ProgressStyle::with_template(&template)
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.into());
    bar
}

/// A spinner for work of unknown length, titled `what`, that ticks on its own and shows
/// the time spent.
pub fn spinner(what: impl Into<String>) -> ProgressBar {
    let spinner = ProgressBar::with_draw_target(None, target());
    spinner.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("a valid template"),
    );
    spinner.set_message(what.into());
    spinner.enable_steady_tick(Duration::from_millis(120));
    spinner
}

/// Whether progress is drawn at all.
pub fn drawn() -> bool {
    std::io::stderr().is_terminal()
}

fn target() -> ProgressDrawTarget {
    if drawn() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}
