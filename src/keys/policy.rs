//! A client key's policy — which models, how many requests at once, how many a minute, how many
//! tokens per window, until when — and why a request may be refused by it. The checks run
//! before scheduling (`KeyRing::admit`), so a refused request touches no account and waits in
//! no account's queue.

use crate::base::glob::glob_match;
use crate::base::names::named;
use crate::store::records::KeyPolicyRow;

/// Longest note kept with a key.
const MAX_NOTE_LEN: usize = 200;
/// Most model globs a key may have.
const MAX_MODELS: usize = 64;

named! {
    /// A token budget's rolling window.
    pub enum Window {
        FiveHours => "5h",
        Day => "day",
        Week => "week",
    }
}

impl Window {
    pub fn secs(self) -> u64 {
        match self {
            Window::FiveHours => 5 * 3600,
            Window::Day => 24 * 3600,
            Window::Week => 7 * 24 * 3600,
        }
    }
}

/// What a key may do. `None` limits do not apply; no models means every model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub models: Vec<String>,
    pub max_concurrency: Option<u32>,
    pub rpm: Option<u32>,
    pub tokens_per_5h: Option<u64>,
    pub tokens_per_day: Option<u64>,
    pub tokens_per_week: Option<u64>,
    /// Unix seconds.
    pub expires_at: Option<u64>,
    pub note: Option<String>,
    /// Service tiers a request may ask for; empty allows every one.
    pub tiers: Vec<String>,
}

/// Most service tiers a key may list.
const MAX_TIERS: usize = 8;

/// The tier of a request that asks for none.
pub const DEFAULT_TIER: &str = "default";

impl Policy {
    pub fn from_row(r: &KeyPolicyRow) -> Policy {
        Policy {
            models: r.models.clone(),
            max_concurrency: r.max_concurrency,
            rpm: r.rpm,
            tokens_per_5h: r.tokens_per_5h,
            tokens_per_day: r.tokens_per_day,
            tokens_per_week: r.tokens_per_week,
            expires_at: r.expires_at,
            note: r.note.clone(),
            tiers: r.tiers.clone(),
        }
    }

    pub fn to_row(&self) -> KeyPolicyRow {
        KeyPolicyRow {
            models: self.models.clone(),
            max_concurrency: self.max_concurrency,
            rpm: self.rpm,
            tokens_per_5h: self.tokens_per_5h,
            tokens_per_day: self.tokens_per_day,
            tokens_per_week: self.tokens_per_week,
            expires_at: self.expires_at,
            note: self.note.clone(),
            tiers: self.tiers.clone(),
        }
    }

    /// Whether the key may ask for `tier` (`service_tier` as the request sent it; none is
    /// [`DEFAULT_TIER`]).
    pub fn allows_tier(&self, tier: Option<&str>) -> bool {
        let tier = tier.unwrap_or(DEFAULT_TIER);
        self.tiers.is_empty() || self.tiers.iter().any(|t| t == tier)
    }

    /// Whether the key may use `model` (the name sent upstream, after aliases).
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|g| glob_match(g, model))
    }

    /// The token budgets the key has, shortest window first.
    pub fn budgets(&self) -> impl Iterator<Item = (Window, u64)> + '_ {
        [
            (Window::FiveHours, self.tokens_per_5h),
            (Window::Day, self.tokens_per_day),
            (Window::Week, self.tokens_per_week),
        ]
        .into_iter()
        .filter_map(|(w, l)| l.map(|l| (w, l)))
    }

    /// The policy with `patch` applied; a value that makes no sense is an error naming it.
    pub fn patched(&self, patch: &PolicyPatch) -> Result<Policy, String> {
        fn positive<T: PartialOrd + Default + Copy + std::fmt::Display>(
            name: &str,
            v: Option<Option<T>>,
            old: Option<T>,
        ) -> Result<Option<T>, String> {
            match v {
                None => Ok(old),
                Some(None) => Ok(None),
                Some(Some(n)) if n > T::default() => Ok(Some(n)),
                Some(Some(n)) => Err(format!(
                    "{name} must be at least 1 (got {n}); to remove it, clear it"
                )),
            }
        }
        let mut p = self.clone();
        if let Some(models) = &patch.models {
            let models: Vec<String> = models
                .iter()
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty())
                .collect();
            if models.len() > MAX_MODELS {
                return Err(format!("at most {MAX_MODELS} model patterns"));
            }
            if let Some(bad) = models
                .iter()
                .find(|m| m.len() > 128 || m.chars().any(|c| c.is_control() || c == ','))
            {
                return Err(format!("invalid model pattern `{bad}`"));
            }
            p.models = models;
        }
        if let Some(tiers) = &patch.tiers {
            let tiers: Vec<String> = tiers
                .iter()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect();
            if tiers.len() > MAX_TIERS {
                return Err(format!("at most {MAX_TIERS} service tiers"));
            }
            if let Some(bad) = tiers
                .iter()
                .find(|t| t.len() > 32 || !t.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            {
                return Err(format!(
                    "invalid service tier `{bad}` (a word such as default, priority, flex)"
                ));
            }
            if tiers.iter().any(|t| t == "fast") {
                return Err(
                    "service tier `fast` never reaches the backend: Codex sends Fast mode as \
                     `priority`; list priority"
                        .into(),
                );
            }
            p.tiers = tiers;
        }
        p.max_concurrency = positive("max_concurrency", patch.max_concurrency, p.max_concurrency)?;
        p.rpm = positive("rpm", patch.rpm, p.rpm)?;
        p.tokens_per_5h = positive("tokens_per_5h", patch.tokens_per_5h, p.tokens_per_5h)?;
        p.tokens_per_day = positive("tokens_per_day", patch.tokens_per_day, p.tokens_per_day)?;
        p.tokens_per_week = positive("tokens_per_week", patch.tokens_per_week, p.tokens_per_week)?;
        match &patch.expires_at {
            None => {}
            Some(None) => p.expires_at = None,
            Some(Some(t)) => {
                let ms = crate::base::clock::parse_rfc3339_ms(t).ok_or_else(|| {
                    format!("expires_at `{t}` is not an RFC 3339 time (2027-01-31T00:00:00Z)")
                })?;
                p.expires_at = Some(ms / 1000);
            }
        }
        match &patch.note {
            None => {}
            Some(None) => p.note = None,
            Some(Some(n)) if n.chars().count() > MAX_NOTE_LEN => {
                return Err(format!("a note has at most {MAX_NOTE_LEN} characters"));
            }
            Some(Some(n)) => p.note = Some(n.trim().to_string()).filter(|n| !n.is_empty()),
        }
        Ok(p)
    }
}

/// A change to a policy: for each field, `None` keeps it, `Some(None)` removes the limit and
/// `Some(Some(v))` sets it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyPatch {
    pub models: Option<Vec<String>>,
    /// Service tiers (an empty list allows every one).
    pub tiers: Option<Vec<String>>,
    pub max_concurrency: Option<Option<u32>>,
    pub rpm: Option<Option<u32>>,
    pub tokens_per_5h: Option<Option<u64>>,
    pub tokens_per_day: Option<Option<u64>>,
    pub tokens_per_week: Option<Option<u64>>,
    /// RFC 3339, as given (checked when applied).
    pub expires_at: Option<Option<String>>,
    pub note: Option<Option<String>>,
}

impl PolicyPatch {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == PolicyPatch::default()
    }
}

/// Why a key's request was refused before scheduling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The key was revoked (a WebSocket connection opened before that asks again).
    Revoked,
    /// Past the key's expiry (unix seconds).
    Expired {
        at: u64,
    },
    ModelNotAllowed {
        model: String,
        allowed: Vec<String>,
    },
    /// The request asked for a service tier the key may not use.
    TierNotAllowed {
        tier: String,
        allowed: Vec<String>,
    },
    RateLimited {
        rpm: u32,
        retry_after_s: u64,
    },
    BudgetExhausted {
        window: Window,
        limit: u64,
        used: u64,
        /// Reserved by the key's requests in flight.
        reserved: u64,
        resets_in_s: u64,
    },
    /// The key's own queue did not give a slot within the wait (or was full).
    ConcurrencyExceeded {
        limit: u32,
        waited_ms: u64,
    },
}

impl Refusal {
    /// The error code, which is also the request's outcome.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Revoked => "invalid_api_key",
            Refusal::Expired { .. } => "key_expired",
            Refusal::ModelNotAllowed { .. } => "model_not_allowed",
            Refusal::TierNotAllowed { .. } => "tier_not_allowed",
            Refusal::RateLimited { .. } => "key_rate_limited",
            Refusal::BudgetExhausted { .. } => "key_budget_exhausted",
            Refusal::ConcurrencyExceeded { .. } => "key_concurrency_exceeded",
        }
    }

    pub fn status(&self) -> u16 {
        match self {
            Refusal::Revoked | Refusal::Expired { .. } => 401,
            Refusal::ModelNotAllowed { .. } | Refusal::TierNotAllowed { .. } => 403,
            _ => 429,
        }
    }

    /// The OpenAI error type.
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::Revoked
            | Refusal::Expired { .. }
            | Refusal::ModelNotAllowed { .. }
            | Refusal::TierNotAllowed { .. } => "invalid_request_error",
            _ => "rate_limit_error",
        }
    }

    /// Seconds after which the same request may succeed, when that is known.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            Refusal::RateLimited { retry_after_s, .. } => Some(*retry_after_s),
            Refusal::BudgetExhausted { resets_in_s, .. } => Some(*resets_in_s),
            Refusal::ConcurrencyExceeded { .. } => Some(1),
            _ => None,
        }
    }

    pub fn message(&self) -> String {
        match self {
            Refusal::Revoked => "This API key was revoked.".into(),
            Refusal::Expired { at } => format!(
                "This API key expired at {}. Ask the gateway's operator for a new one.",
                crate::base::clock::rfc3339(*at)
            ),
            Refusal::ModelNotAllowed { model, allowed } => format!(
                "This API key may not use the model '{model}' (allowed: {}).",
                allowed.join(", ")
            ),
            Refusal::TierNotAllowed { tier, allowed } => format!(
                "This API key may not use the service tier '{tier}' (allowed: {}).",
                allowed.join(", ")
            ),
            Refusal::RateLimited { rpm, retry_after_s } => format!(
                "This API key is limited to {rpm} requests per minute. Retry in {retry_after_s} s."
            ),
            Refusal::BudgetExhausted {
                window,
                limit,
                used,
                reserved,
                resets_in_s,
            } => {
                let per = match window {
                    Window::FiveHours => "5 hours",
                    Window::Day => "day",
                    Window::Week => "week",
                };
                if used >= limit {
                    format!(
                        "This API key used {used} of its {limit} tokens per {per}. It resets in {}.",
                        crate::base::duration::human_duration(resets_in_s.saturating_mul(1000))
                    )
                } else {
                    format!(
                        "This API key used {used} of its {limit} tokens per {per}, and its \
                         requests in flight hold {reserved} more. Retry when one of them ends."
                    )
                }
            }
            Refusal::ConcurrencyExceeded { limit, waited_ms } => format!(
                "This API key already has {limit} requests running; waited {waited_ms} ms for one \
                 to finish."
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_list_allows_its_tiers_and_a_request_without_one_is_default() {
        let any = Policy::default();
        assert!(any.allows_tier(Some("priority")) && any.allows_tier(None));
        let p = any
            .patched(&PolicyPatch {
                tiers: Some(vec!["default".into(), " priority ".into(), "".into()]),
                ..PolicyPatch::default()
            })
            .unwrap();
        assert_eq!(p.tiers, vec!["default".to_string(), "priority".to_string()]);
        assert!(p.allows_tier(None) && p.allows_tier(Some("priority")));
        assert!(!p.allows_tier(Some("flex")));
        let only = Policy {
            tiers: vec!["priority".into()],
            ..Policy::default()
        };
        assert!(!only.allows_tier(None), "no tier asked is the default tier");
        // Cleared with an empty list; `fast` and odd words refused.
        let cleared = p
            .patched(&PolicyPatch {
                tiers: Some(Vec::new()),
                ..PolicyPatch::default()
            })
            .unwrap();
        assert!(cleared.tiers.is_empty());
        for (bad, says) in [("fast", "priority"), ("Priority", "invalid service tier")] {
            let e = Policy::default()
                .patched(&PolicyPatch {
                    tiers: Some(vec![bad.into()]),
                    ..PolicyPatch::default()
                })
                .unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert_eq!(Policy::from_row(&p.to_row()), p);
    }

    #[test]
    fn a_patch_sets_clears_and_keeps_and_refuses_nonsense() {
        let p = Policy {
            rpm: Some(10),
            note: Some("ci".into()),
            ..Policy::default()
        };
        let patch = PolicyPatch {
            models: Some(vec!["gpt-5*".into(), " ".into()]),
            tokens_per_day: Some(Some(1000)),
            rpm: Some(None),
            expires_at: Some(Some("2027-01-31T00:00:00Z".into())),
            ..PolicyPatch::default()
        };
        let q = p.patched(&patch).unwrap();
        assert_eq!(q.models, vec!["gpt-5*".to_string()]);
        assert_eq!((q.rpm, q.tokens_per_day), (None, Some(1000)));
        assert_eq!(q.note.as_deref(), Some("ci"));
        assert_eq!(q.expires_at, Some(1_801_353_600));
        assert_eq!(q.budgets().collect::<Vec<_>>(), vec![(Window::Day, 1000)]);
        let zero = PolicyPatch {
            max_concurrency: Some(Some(0)),
            ..PolicyPatch::default()
        };
        assert!(p.patched(&zero).unwrap_err().contains("max_concurrency"));
        let bad_time = PolicyPatch {
            expires_at: Some(Some("tomorrow".into())),
            ..PolicyPatch::default()
        };
        assert!(p.patched(&bad_time).unwrap_err().contains("RFC 3339"));
    }
}
