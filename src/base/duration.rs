//! Durations for people: the short form of messages and the console (`41m`), and the serde
//! form of the config file (`"30s"`, `"1h 30m"`).

/// A duration in whole milliseconds (past `u64`'s reach, the most it holds).
pub fn whole_ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `41m`, `2h05m`, `30s`.
pub fn human_duration(ms: u64) -> String {
    let s = ms.div_ceil(1000);
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s.div_ceil(60)),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// Durations as human strings: `"30s"`, `"10m"`, `"1h 30m"`.
pub mod text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| {
            serde::de::Error::custom(format!(
                "`{s}` is not a duration like \"30s\" or \"10m\": {e}"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        assert_eq!(human_duration(30_000), "30s");
        assert_eq!(human_duration(41 * 60_000), "41m");
        assert_eq!(human_duration(2 * 3_600_000 + 5 * 60_000), "2h05m");
    }
}
