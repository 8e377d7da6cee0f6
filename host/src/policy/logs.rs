//! The last log lines of each plugin, kept in memory by this process.
//!
//! A plugin's `log` calls (WIT `orl:policy/log`) go to the server's own log and, once
//! admitted by the per-call cap, into a ring of the last [`LINES_PER_PLUGIN`] lines of that
//! plugin, which `GET /v1/plugins/{id}/logs` and `orl plugins logs` read. The ring is per
//! process (each replica keeps the lines of the decisions it ran) and is lost on restart.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use serde::Serialize;

use crate::clock::{Clock, format_ms};

/// Lines kept per plugin; an older line is dropped when a newer one arrives.
pub const LINES_PER_PLUGIN: usize = 200;

/// The level a plugin logged a line at (WIT `log.level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// One line a plugin logged, as this process received it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogLine {
    /// The line's number on this replica: larger is newer. A page's `cursor` is the id of
    /// its last line.
    pub id: String,
    /// When the host received it (RFC 3339, UTC, the server's clock).
    pub at: String,
    pub level: Level,
    /// The message, cut to the per-message cap.
    pub message: String,
    /// The replica that ran the decision and keeps the line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

/// A line as kept: its number, time and text.
struct Kept {
    seq: u64,
    at_ms: i64,
    level: Level,
    message: String,
}

/// The rings of every plugin this process has run, by plugin id.
#[derive(Default)]
pub struct PluginLogs {
    rings: Mutex<HashMap<String, VecDeque<Kept>>>,
    /// The number of the next line, over all plugins (so a line's number orders it).
    next: AtomicU64,
    /// The server's clock and this replica's id, once the server has them; until then
    /// (and in a process that is not a server) the wall clock and no replica.
    clock: OnceLock<Clock>,
    replica: OnceLock<String>,
}

impl PluginLogs {
    /// Stamps lines from now on with `clock` and this process's replica id.
    pub fn attach(&self, clock: Clock, replica: &str) {
        let _ = self.clock.set(clock);
        let _ = self.replica.set(replica.to_owned());
    }

    fn now_ms(&self) -> i64 {
        self.clock.get().unwrap_or(&Clock::System).now_ms()
    }

    /// Keeps one line of plugin `plugin_id`, dropping its oldest past [`LINES_PER_PLUGIN`].
    pub fn push(&self, plugin_id: &str, level: Level, message: &str) {
        let at_ms = self.now_ms();
        let mut rings = self.rings.lock().expect("plugin logs");
        let seq = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let kept = Kept {
            seq,
            at_ms,
            level,
            message: message.to_owned(),
        };
        let ring = match rings.get_mut(plugin_id) {
            Some(ring) => ring,
            None => rings
                .entry(plugin_id.to_owned())
                .or_insert_with(|| VecDeque::with_capacity(16)),
        };
        if ring.len() >= LINES_PER_PLUGIN {
            ring.pop_front();
        }
        ring.push_back(kept);
    }

    /// The lines of plugin `plugin_id`, newest first: at most `limit` of those older than
    /// line `before` (all of them without it).
    pub fn newest(&self, plugin_id: &str, before: Option<u64>, limit: usize) -> Vec<LogLine> {
        let rings = self.rings.lock().expect("plugin logs");
        let Some(ring) = rings.get(plugin_id) else {
            return Vec::new();
        };
        let replica = self.replica.get();
        ring.iter()
            .rev()
            .filter(|k| before.is_none_or(|b| k.seq < b))
            .take(limit)
            .map(|k| LogLine {
                id: k.seq.to_string(),
                at: format_ms(k.at_ms),
                level: k.level,
                message: k.message.clone(),
                replica: replica.cloned(),
            })
            .collect()
    }

    /// Forgets the lines of plugin `plugin_id` (a deleted plugin).
    pub fn forget(&self, plugin_id: &str) {
        self.rings.lock().expect("plugin logs").remove(plugin_id);
    }
}

#[cfg(test)]
mod tests {
    use super::{LINES_PER_PLUGIN, Level, PluginLogs};
    use crate::clock::Clock;

    #[test]
    fn a_plugin_keeps_its_last_lines_newest_first() {
        let logs = PluginLogs::default();
        logs.attach(Clock::manual(1_796_083_200_000), "rep_1");
        for i in 0..LINES_PER_PLUGIN + 5 {
            logs.push("sha256:a", Level::Info, &format!("line {i}"));
        }
        logs.push("sha256:b", Level::Error, "other");
        let lines = logs.newest("sha256:a", None, 1_000);
        assert_eq!(lines.len(), LINES_PER_PLUGIN);
        assert_eq!(lines[0].message, format!("line {}", LINES_PER_PLUGIN + 4));
        assert_eq!(lines.last().unwrap().message, "line 5");
        assert_eq!(lines[0].at, "2026-12-01T00:00:00.000Z");
        assert_eq!(lines[0].replica.as_deref(), Some("rep_1"));
        let other = logs.newest("sha256:b", None, 10);
        assert_eq!(other.len(), 1);
        assert_eq!(
            (other[0].level, &*other[0].message),
            (Level::Error, "other")
        );
        assert!(logs.newest("sha256:c", None, 10).is_empty());
    }

    #[test]
    fn lines_page_by_their_number() {
        let logs = PluginLogs::default();
        for i in 0..7 {
            logs.push("p", Level::Debug, &i.to_string());
        }
        let first = logs.newest("p", None, 3);
        let messages = |lines: &[super::LogLine]| -> Vec<String> {
            lines.iter().map(|l| l.message.clone()).collect()
        };
        assert_eq!(messages(&first), ["6", "5", "4"]);
        let cursor: u64 = first.last().unwrap().id.parse().unwrap();
        let second = logs.newest("p", Some(cursor), 3);
        assert_eq!(messages(&second), ["3", "2", "1"]);
        let cursor: u64 = second.last().unwrap().id.parse().unwrap();
        assert_eq!(messages(&logs.newest("p", Some(cursor), 3)), ["0"]);
        assert!(logs.newest("p", Some(1), 3).is_empty());
        // Without a server's clock: the wall clock, and no replica.
        assert!(first[0].replica.is_none());
        logs.forget("p");
        assert!(logs.newest("p", None, 3).is_empty());
    }
}
