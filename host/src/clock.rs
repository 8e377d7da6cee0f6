//! The one clock. Everything that reads "now" (expiry, terms, audit timestamps, ids) asks
//! [`Clock::now_ms`], so tests move time instead of sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, SecondsFormat, Utc};

/// Wall-clock time, or a manual clock that only moves when told to.
#[derive(Clone, Debug)]
pub enum Clock {
    System,
    Manual(Arc<AtomicI64>),
}

impl Clock {
    /// A manual clock that starts at `start_ms` (epoch milliseconds).
    pub fn manual(start_ms: i64) -> Self {
        Clock::Manual(Arc::new(AtomicI64::new(start_ms)))
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        match self {
            Clock::System => Utc::now().timestamp_millis(),
            Clock::Manual(now) => now.load(Ordering::SeqCst),
        }
    }

    /// Moves a manual clock; a system clock cannot be moved and answers `false`.
    pub fn set_ms(&self, ms: i64) -> bool {
        match self {
            Clock::System => false,
            Clock::Manual(now) => {
                now.store(ms, Ordering::SeqCst);
                true
            }
        }
    }

    pub fn is_manual(&self) -> bool {
        matches!(self, Clock::Manual(_))
    }
}

/// Formats epoch milliseconds as RFC 3339 in UTC with millisecond precision.
pub fn format_ms(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Parses an RFC 3339 timestamp into epoch milliseconds.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_set() {
        let clock = Clock::manual(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        assert!(clock.set_ms(5_000));
        assert_eq!(clock.now_ms(), 5_000);
        assert!(!Clock::System.set_ms(1));
    }

    #[test]
    fn rfc3339_round_trips_at_millisecond_precision() {
        let ms = 1_764_417_000_123;
        assert_eq!(parse_rfc3339(&format_ms(ms)), Some(ms));
        assert_eq!(
            parse_rfc3339("2026-11-29T12:00:00+01:00"),
            Some(1_795_950_000_000)
        );
        assert_eq!(parse_rfc3339("tomorrow"), None);
    }
}
