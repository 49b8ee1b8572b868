//! One clock for everything that expires: TTL maps, cooldowns, queues.
//!
//! Time is unix milliseconds so that a deadline can be persisted and survive a restart
//! (a 5-hour quota cooldown written before an upgrade is still valid after it). Tests use
//! [`ManualClock`] and move time by hand instead of sleeping.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

/// A source of "now" in unix milliseconds.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    fn now_ms(&self) -> u64;

    fn now_secs(&self) -> u64 {
        self.now_ms() / 1000
    }
}

/// Shared handle to the process clock.
pub type SharedClock = Arc<dyn Clock>;

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // Read as the kernel gives it, in whole seconds and nanoseconds: a request asks the
        // time a dozen times, and the checked subtraction from the epoch that `SystemTime`
        // makes cost more than the reading. A clock before 1970 is a broken host; treat it as
        // the epoch rather than panic.
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
        match (u64::try_from(t.tv_sec), u64::try_from(t.tv_nsec)) {
            (Ok(s), Ok(ns)) => s.saturating_mul(1000).saturating_add(ns / 1_000_000),
            _ => 0,
        }
    }
}

/// The production clock as a shared handle.
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

/// A clock that only moves when told to. Cloning shares the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start_ms)),
        }
    }

    pub fn advance_ms(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    pub fn advance(&self, d: std::time::Duration) {
        self.advance_ms(crate::base::duration::whole_ms(d));
    }

    pub fn set_ms(&self, ms: u64) {
        self.now.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// Formats unix seconds as RFC 3339 UTC (`2026-11-30T14:02:44Z`).
pub fn rfc3339(unix_secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + std::time::Duration::from_secs(unix_secs))
        .to_string()
}

/// Formats unix milliseconds as RFC 3339 UTC with milliseconds.
pub fn rfc3339_ms(unix_ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + std::time::Duration::from_millis(unix_ms))
        .to_string()
}

/// Reads an RFC 3339 time (as [`rfc3339`] and [`rfc3339_ms`] write it) as unix milliseconds.
pub fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339(s).ok()?;
    let d = t.duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(d.as_millis()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_time() {
        let c = ManualClock::new(1_000);
        let d = c.clone();
        assert_eq!(c.now_ms(), 1_000);
        d.advance_ms(500);
        assert_eq!(c.now_ms(), 1_500);
        assert_eq!(c.now_secs(), 1);
    }

    /// The wall clock read from the kernel is `SystemTime`'s, in milliseconds.
    #[test]
    fn the_system_clock_reads_the_wall_clock_in_milliseconds() {
        let ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        let before = ms(SystemTime::now());
        let now = SystemClock.now_ms();
        let after = ms(SystemTime::now());
        assert!(
            (before..=after).contains(&now),
            "{before} <= {now} <= {after}"
        );
    }

    #[test]
    fn rfc3339_formats_utc_seconds() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_767_225_600), "2026-01-01T00:00:00Z");
    }

    #[test]
    fn rfc3339_reads_back_what_it_writes() {
        let ms = 1_767_225_600_123;
        assert_eq!(parse_rfc3339_ms(&rfc3339_ms(ms)), Some(ms));
        assert_eq!(
            parse_rfc3339_ms(&rfc3339(1_767_225_600)),
            Some(1_767_225_600_000)
        );
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
    }
}
