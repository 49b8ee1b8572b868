//! Named, deterministic fault schedules for `switchyard demo` and `switchyard sim --profile`.
//!
//! A profile gives each account a [`Script`]: rules evaluated on every authenticated
//! `/responses*` request when no queued fault applies, plus starting usage, usage drift per
//! completed turn, and pacing between deltas. Rules count requests, so a profile replays the
//! same way every run.

use std::time::Duration;

use super::faults::FaultKind;
use super::state::Account;

/// A named schedule of failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// No faults at all; answers as fast as the machine allows.
    Healthy,
    /// What a newcomer sees first: account 1 runs out of quota after 5 requests (resets in
    /// 45 min), account 2 answers a burst 429 (Retry-After 7 s) to every 4th request,
    /// account 3 drops every 3rd stream after 3 deltas; the rest are healthy. Streams are
    /// paced (40 ms per delta) and usage grows with traffic, so the console has something to
    /// show.
    Demo,
    /// Every account fails now and then, at different offsets: 503 overloaded (every 5th),
    /// a mid-stream reset (every 7th), a Cloudflare challenge (every 11th), a
    /// `response.failed` `server_is_overloaded` (every 13th).
    Flaky,
    /// The pool runs dry: account N hits its quota after 2·N requests and stays out for
    /// 10·N minutes.
    Exhausted,
    /// Every request waits 1.5 s before its first delta and streams 100 ms per delta
    /// (exercises keep-alives and first-output timeouts).
    Slow,
}

impl Profile {
    pub const ALL: [Profile; 5] = [
        Profile::Healthy,
        Profile::Demo,
        Profile::Flaky,
        Profile::Exhausted,
        Profile::Slow,
    ];

    pub fn from_name(name: &str) -> Option<Profile> {
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name.trim()))
    }

    pub fn name(self) -> &'static str {
        match self {
            Profile::Healthy => "healthy",
            Profile::Demo => "demo",
            Profile::Flaky => "flaky",
            Profile::Exhausted => "exhausted",
            Profile::Slow => "slow",
        }
    }

    /// One line for `--help` and the startup banner.
    pub fn description(self) -> &'static str {
        match self {
            Profile::Healthy => "no faults",
            Profile::Demo => {
                "acct 1 hits its quota after 5 requests, acct 2 bursts 429 every 4th, \
                 acct 3 drops every 3rd stream; paced streams"
            }
            Profile::Flaky => {
                "every account fails now and then (503, resets, Cloudflare, failed events)"
            }
            Profile::Exhausted => "account N exhausts its quota after 2N requests, for 10N minutes",
            Profile::Slow => "1.5 s before the first token, 100 ms per delta",
        }
    }

    /// The script of account `n` (1-based).
    pub(crate) fn script(self, n: u32) -> Script {
        let n64 = u64::from(n);
        match self {
            Profile::Healthy => Script::default(),
            Profile::Demo => {
                let rules = match n {
                    1 => vec![Rule::QuotaAfter {
                        requests: 5,
                        resets_in_seconds: 45 * 60,
                    }],
                    2 => vec![Rule::every(
                        4,
                        0,
                        FaultKind::Burst429 {
                            retry_after_secs: 7,
                        },
                    )],
                    3 => vec![Rule::every(
                        3,
                        0,
                        FaultKind::ResetMidStream { after_deltas: 3 },
                    )],
                    _ => Vec::new(),
                };
                Script {
                    rules,
                    initial_usage: Some((
                        [62.0, 35.0, 18.0, 9.0][(n as usize - 1) % 4],
                        [30.0, 12.0, 40.0, 5.0][(n as usize - 1) % 4],
                    )),
                    drift: (0.4, 0.05),
                    delta_pause: Some(Duration::from_millis(40)),
                }
            }
            Profile::Flaky => Script {
                rules: vec![
                    Rule::every(5, n64, FaultKind::ServerError { status: 503 }),
                    Rule::every(7, n64, FaultKind::ResetMidStream { after_deltas: 2 }),
                    Rule::every(11, n64, FaultKind::Cloudflare403),
                    Rule::every(
                        13,
                        n64,
                        FaultKind::FailedEvent {
                            code: "server_is_overloaded".into(),
                        },
                    ),
                ],
                ..Script::default()
            },
            Profile::Exhausted => Script {
                rules: vec![Rule::QuotaAfter {
                    requests: 2 * n64,
                    resets_in_seconds: 600 * n64,
                }],
                drift: (5.0, 1.0),
                ..Script::default()
            },
            Profile::Slow => Script {
                rules: vec![Rule::every(1, 0, FaultKind::SlowFirstToken { ms: 1500 })],
                delta_pause: Some(Duration::from_millis(100)),
                ..Script::default()
            },
        }
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One account's schedule under a profile.
#[derive(Debug, Clone, Default)]
pub(crate) struct Script {
    pub rules: Vec<Rule>,
    /// (primary, secondary) used percent at start.
    pub initial_usage: Option<(f64, f64)>,
    /// (primary, secondary) percentage points added per completed turn (capped below 100).
    pub drift: (f64, f64),
    /// Pause between deltas.
    pub delta_pause: Option<Duration>,
}

#[derive(Debug, Clone)]
pub(crate) enum Rule {
    /// After `requests` requests the account is out of quota for `resets_in_seconds`; then
    /// its window resets and the count starts over.
    QuotaAfter {
        requests: u64,
        resets_in_seconds: u64,
    },
    /// Request number k (1-based) fails with `kind` when (k + offset) is a multiple of `n`.
    EveryNth {
        n: u64,
        offset: u64,
        kind: FaultKind,
    },
}

impl Rule {
    fn every(n: u64, offset: u64, kind: FaultKind) -> Rule {
        Rule::EveryNth { n, offset, kind }
    }
}

/// The scripted fault for the account's current request (`account.served` already counts
/// it), if any. A scripted quota answers with the time left until its reset.
pub(crate) fn scripted_fault(account: &mut Account, now: u64) -> Option<FaultKind> {
    let served = account.served;
    let rules = account.script.rules.clone();
    for rule in rules {
        match rule {
            Rule::QuotaAfter {
                requests,
                resets_in_seconds,
            } => {
                if let Some(until) = account.script_quota_until {
                    if now < until {
                        return Some(FaultKind::Quota {
                            resets_in_seconds: until - now,
                        });
                    }
                    account.script_quota_until = None;
                    account.script_since_reset = 0;
                }
                account.script_since_reset += 1;
                if account.script_since_reset > requests {
                    account.script_quota_until = Some(now + resets_in_seconds);
                    return Some(FaultKind::Quota { resets_in_seconds });
                }
            }
            Rule::EveryNth { n, offset, kind } => {
                if n > 0 && (served + offset).is_multiple_of(n) {
                    return Some(kind);
                }
            }
        }
    }
    None
}
