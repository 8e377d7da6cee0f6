//! The host side of `wit/`: one generated module per world of the newest package
//! (`orl:policy@0.2.0`), one per world of each older package the host still serves
//! ([`v0_1`]), and the `log` interface the host provides. Kept private to the policy
//! module; callers use its small API.
//!
//! The host decides on the newest records; an older plugin gets them converted down (a
//! 0.1 placer is handed the same columns without `node-facts`), and its `log` is the
//! newest one's. Records that did not change between versions are the same shape, so the
//! host lowers its own values into either.
//!
//! Exports are called with `call_async` (see the deadline in [`super`]): a call is a future
//! that the host can stop at its deadline wherever the plugin is, in its own code or blocked
//! in a host call. `log` is synchronous and never traps.

#![allow(clippy::too_many_arguments)]

pub mod placer {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "placer",
        exports: { default: async },
    });
}

/// The other worlds share the placer's `types` and `log`, so one set of records and one
/// log implementation serve every world.
pub mod preemptor {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "preemptor",
        exports: { default: async },
        with: {
            "orl:policy/types": super::placer::orl::policy::types,
            "orl:policy/log": super::placer::orl::policy::log,
        },
    });
}

pub mod spend_guard {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "spend-guard",
        exports: { default: async },
        with: {
            "orl:policy/types": super::placer::orl::policy::types,
            "orl:policy/log": super::placer::orl::policy::log,
        },
    });
}

/// `orl:policy@0.1.0`, served beside the newest package: its worlds, and its `log` as the
/// newest one's.
pub mod v0_1 {
    pub mod placer {
        wasmtime::component::bindgen!({
            path: "../wit/v0.1",
            world: "placer",
            exports: { default: async },
        });
    }

    pub mod preemptor {
        wasmtime::component::bindgen!({
            path: "../wit/v0.1",
            world: "preemptor",
            exports: { default: async },
            with: {
                "orl:policy/types": super::placer::orl::policy::types,
                "orl:policy/log": super::placer::orl::policy::log,
            },
        });
    }

    pub mod spend_guard {
        wasmtime::component::bindgen!({
            path: "../wit/v0.1",
            world: "spend-guard",
            exports: { default: async },
            with: {
                "orl:policy/types": super::placer::orl::policy::types,
                "orl:policy/log": super::placer::orl::policy::log,
            },
        });
    }

    use placer::orl::policy::log::{self, Level};

    impl log::Host for super::super::PluginState {
        fn log(&mut self, level: Level, message: String) {
            let level = match level {
                Level::Debug => super::Level::Debug,
                Level::Info => super::Level::Info,
                Level::Warn => super::Level::Warn,
                Level::Error => super::Level::Error,
            };
            super::log::Host::log(self, level, message);
        }
    }
}

use placer::orl::policy::log::{self, Level};

/// Log lines one call may write; the rest are counted and reported once after the call.
pub const LOG_LINES_PER_CALL: u32 = 64;
/// Bytes of log messages one call may write, after each message is cut to
/// [`LOG_MESSAGE_BYTES`].
pub const LOG_BYTES_PER_CALL: usize = 16 << 10;
/// A longer message is cut to this many bytes (at a character boundary).
pub const LOG_MESSAGE_BYTES: usize = 1024;

/// What one call has logged so far, against the per-call caps the WIT's `log` promises.
#[derive(Default)]
pub struct LogBudget {
    lines: u32,
    bytes: usize,
    dropped: u32,
}

impl LogBudget {
    /// `message` cut to [`LOG_MESSAGE_BYTES`], or `None` when the call has used its lines or
    /// bytes (the message is then counted as dropped).
    fn admit<'m>(&mut self, message: &'m str) -> Option<&'m str> {
        let mut end = message.len().min(LOG_MESSAGE_BYTES);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let message = &message[..end];
        if self.lines >= LOG_LINES_PER_CALL || self.bytes + message.len() > LOG_BYTES_PER_CALL {
            self.dropped += 1;
            return None;
        }
        self.lines += 1;
        self.bytes += message.len();
        Some(message)
    }

    /// Starts a new call's budget; returns how many lines the previous call dropped.
    pub fn reset(&mut self) -> u32 {
        std::mem::take(self).dropped
    }
}

impl log::Host for super::PluginState {
    fn log(&mut self, level: Level, message: String) {
        let Some(message) = self.log.admit(&message) else {
            return;
        };
        let (plugin, plugin_id) = (&*self.plugin_name, &*self.plugin_id);
        let kept = match level {
            Level::Debug => {
                tracing::debug!(plugin, plugin_id, "{message}");
                super::logs::Level::Debug
            }
            Level::Info => {
                tracing::info!(plugin, plugin_id, "{message}");
                super::logs::Level::Info
            }
            Level::Warn => {
                tracing::warn!(plugin, plugin_id, "{message}");
                super::logs::Level::Warn
            }
            Level::Error => {
                tracing::error!(plugin, plugin_id, "{message}");
                super::logs::Level::Error
            }
        };
        self.logs.push(plugin_id, kept, message);
    }
}

#[cfg(test)]
mod tests {
    use super::{LOG_BYTES_PER_CALL, LOG_LINES_PER_CALL, LOG_MESSAGE_BYTES, LogBudget};

    #[test]
    fn a_call_logs_at_most_its_lines_and_bytes() {
        let mut budget = LogBudget::default();
        for _ in 0..LOG_LINES_PER_CALL {
            assert_eq!(budget.admit("x"), Some("x"));
        }
        assert_eq!(budget.admit("x"), None);
        assert_eq!(budget.reset(), 1);
        let long = "é".repeat(LOG_MESSAGE_BYTES);
        let mut written = 0;
        while let Some(cut) = budget.admit(&long) {
            assert!(cut.len() <= LOG_MESSAGE_BYTES && long.starts_with(cut));
            written += cut.len();
        }
        assert!(written <= LOG_BYTES_PER_CALL && written + LOG_MESSAGE_BYTES > LOG_BYTES_PER_CALL);
        assert_eq!(budget.reset(), 1);
        assert_eq!(budget.reset(), 0);
    }
}
