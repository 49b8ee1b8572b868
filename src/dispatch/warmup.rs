//! Quota-window warm-up: at the configured local times, one minimal request to each chosen
//! account whose 5-hour window is not running, so that window starts (and resets) early —
//! before the working day's peak. Never on an account that is not ready (cooling, unproven,
//! needing a login) or whose weekly window is near its ceiling.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::Dispatcher;
use crate::fleet::health::{AccountState, Class};

/// How long after its time a warm-up may still start (a daemon started later skips it).
const GRACE_SECS: u64 = 30 * 60;
/// A weekly window this full is left alone.
const NEAR_CEILING_PERCENT: f64 = 90.0;

/// `[warmup]`, off while `at` is empty.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WarmupConfig {
    /// Local times, `HH:MM`.
    #[serde(deserialize_with = "times")]
    pub at: Vec<String>,
    /// The accounts (id, email, label or `chatgpt_account_id`); empty: all.
    pub accounts: Vec<String>,
    /// The local time's offset from UTC (`+02:00`); default: the system's (`/etc/localtime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utc_offset: Option<String>,
}

/// Minutes after midnight of `HH:MM`.
pub fn minute_of_day(s: &str) -> Option<u64> {
    let (h, m) = s.trim().split_once(':')?;
    let (h, m): (u64, u64) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60 && s.trim().len() == 5).then_some(h * 60 + m)
}

/// `+HH:MM` / `-HH:MM` in seconds.
pub fn parse_offset(s: &str) -> Option<i64> {
    let s = s.trim();
    let (sign, rest) = match s.as_bytes().first()? {
        b'+' => (1, &s[1..]),
        b'-' => (-1, &s[1..]),
        _ => return None,
    };
    let m = i64::try_from(minute_of_day(rest)?).ok()?;
    (m <= 14 * 60).then_some(sign * m * 60)
}

fn times<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    for t in &v {
        if minute_of_day(t).is_none() {
            return Err(serde::de::Error::custom(format!(
                "{t:?} is not a time of day as HH:MM"
            )));
        }
    }
    Ok(v)
}

impl WarmupConfig {
    /// The UTC offset in seconds: the configured one, else the system's, else 0.
    pub fn offset_secs(&self, now_s: u64) -> i64 {
        match &self.utc_offset {
            Some(o) => parse_offset(o).unwrap_or(0),
            None => std::fs::read("/etc/localtime")
                .ok()
                .and_then(|b| tzif_offset(&b, now_s))
                .unwrap_or(0),
        }
    }
}

/// The UTC offset in force at `now_s` by a TZif file's first (32-bit) table: the type of the
/// last transition at or before now, else its first type.
pub fn tzif_offset(b: &[u8], now_s: u64) -> Option<i64> {
    if b.get(..4)? != b"TZif" {
        return None;
    }
    let n = |at: usize| -> Option<usize> {
        Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let (isutc, isstd, leap, time, typ, chars) = (n(20)?, n(24)?, n(28)?, n(32)?, n(36)?, n(40)?);
    let _ = (isutc, isstd, leap, chars);
    let times_at = 44;
    let idx_at = times_at + time * 4;
    let types_at = idx_at + time;
    let now = i64::try_from(now_s).ok()?;
    let mut ty = 0usize;
    for i in 0..time {
        let t = i32::from_be_bytes(
            b.get(times_at + i * 4..times_at + i * 4 + 4)?
                .try_into()
                .ok()?,
        );
        if i64::from(t) <= now {
            ty = usize::from(*b.get(idx_at + i)?);
        }
    }
    if ty >= typ {
        return None;
    }
    let at = types_at + ty * 6;
    Some(i64::from(i32::from_be_bytes(
        b.get(at..at + 4)?.try_into().ok()?,
    )))
}

/// The slots fired so far: (local day, minute of day).
#[derive(Debug, Default)]
pub struct WarmupState {
    fired: HashSet<(u64, u64)>,
}

impl WarmupState {
    /// The configured times whose slot is open at `now_s` (unix seconds) and not fired yet;
    /// marks them fired.
    pub fn due(&mut self, config: &WarmupConfig, now_s: u64) -> Vec<String> {
        let offset = config.offset_secs(now_s);
        let local = u64::try_from(i64::try_from(now_s).unwrap_or(0) + offset).unwrap_or(0);
        let (day, secs) = (local / 86_400, local % 86_400);
        self.fired.retain(|(d, _)| *d + 1 >= day);
        let mut out = Vec::new();
        for t in &config.at {
            let Some(m) = minute_of_day(t) else { continue };
            let start = m * 60;
            if secs >= start && secs < start + GRACE_SECS && self.fired.insert((day, m)) {
                out.push(t.clone());
            }
        }
        out
    }
}

impl Dispatcher {
    /// One look: the warm-ups due now, each sent to every eligible account. Returns the
    /// accounts warmed.
    pub async fn warm_up(&self, state: &mut WarmupState) -> Vec<String> {
        let config = self.current().warmup.clone();
        if config.at.is_empty() {
            return Vec::new();
        }
        let now_s = self.fleet.clock().now_ms() / 1000;
        let due = state.due(&config, now_s);
        if due.is_empty() {
            return Vec::new();
        }
        let chosen: Option<HashSet<String>> = (!config.accounts.is_empty()).then(|| {
            config
                .accounts
                .iter()
                .filter_map(|s| self.fleet.resolve(s).ok())
                .collect()
        });
        let mut warmed = Vec::new();
        for a in self.fleet.list() {
            if !a.enabled || chosen.as_ref().is_some_and(|c| !c.contains(&a.id)) {
                continue;
            }
            let why_not = if a.state != AccountState::Ready {
                Some(format!("it is {}", a.state.as_str()))
            } else {
                match self.poll_usage(&a.id).await {
                    Err(e) => Some(format!("its usage is unknown ({})", e.summary())),
                    Ok(q) if q.primary_used_percent.is_some_and(|p| p > 0.0) => {
                        Some("its 5-hour window is already running".into())
                    }
                    Ok(q)
                        if q.secondary_used_percent.is_some_and(|p| {
                            p >= NEAR_CEILING_PERCENT
                                .min(self.fleet.settings().quota_ceiling_percent)
                        }) =>
                    {
                        Some("its weekly window is near its ceiling".into())
                    }
                    Ok(_) => None,
                }
            };
            if let Some(why) = why_not {
                tracing::info!(account = %a.id, why = %why, "warm-up skipped");
                continue;
            }
            let class = self.probe_request(&a.id).await;
            if class == Class::Success {
                self.fleet.report(&a.id, Class::Success, None, "");
            }
            self.metrics.warmup(class.as_str());
            tracing::info!(account = %a.id, at = ?due, class = class.as_str(), "warm-up");
            warmed.push(a.id);
        }
        warmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_offsets_parse() {
        assert_eq!(minute_of_day("07:00"), Some(420));
        assert_eq!(minute_of_day("23:59"), Some(1439));
        assert_eq!(minute_of_day("24:00"), None);
        assert_eq!(minute_of_day("7:00"), None);
        assert_eq!(parse_offset("+02:00"), Some(7200));
        assert_eq!(parse_offset("-05:30"), Some(-19_800));
        assert_eq!(parse_offset("02:00"), None);
        assert!(toml::from_str::<WarmupConfig>("at = [\"7am\"]").is_err());
    }

    #[test]
    fn a_slot_fires_once_within_its_grace_and_again_the_next_day() {
        let config = WarmupConfig {
            at: vec!["07:00".into()],
            utc_offset: Some("+02:00".into()),
            ..WarmupConfig::default()
        };
        let mut s = WarmupState::default();
        // 2026-01-01 05:00 UTC is 07:00 at +02:00.
        let seven = 1_767_225_600 + 5 * 3600;
        assert!(s.due(&config, seven - 1).is_empty());
        assert_eq!(s.due(&config, seven + 10), vec!["07:00".to_string()]);
        assert!(s.due(&config, seven + 60).is_empty(), "once per slot");
        assert!(s.due(&config, seven + 86_400 - 60).is_empty());
        assert_eq!(s.due(&config, seven + 86_400 + 5).len(), 1, "the next day");
        // A start long after the time skips that day's.
        let mut late = WarmupState::default();
        assert!(late.due(&config, seven + 3 * 3600).is_empty());
    }

    #[test]
    fn a_tzif_file_gives_the_offset_in_force() {
        // Two types (+01:00 standard, +02:00 summer), one transition at t = 1000 to summer.
        let mut b = b"TZif2".to_vec();
        b.resize(20, 0);
        for n in [0u32, 0, 0, 1, 2, 8] {
            b.extend_from_slice(&n.to_be_bytes());
        }
        b.extend_from_slice(&1000i32.to_be_bytes());
        b.push(1);
        b.extend_from_slice(&3600i32.to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&7200i32.to_be_bytes());
        b.extend_from_slice(&[1, 4]);
        b.extend_from_slice(b"CET\0CEST");
        assert_eq!(tzif_offset(&b, 999), Some(3600));
        assert_eq!(tzif_offset(&b, 1000), Some(7200));
        assert_eq!(tzif_offset(b"nope", 0), None);
    }
}
