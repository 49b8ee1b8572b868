//! Session and response affinity.
//!
//! Soft affinity (prompt cache): a session key is bound to the account that last served it,
//! so its next turns reuse the backend's prompt cache; the binding moves when that account
//! cannot serve. Hard affinity (continuations): a `previous_response_id` can only be served by
//! the account that produced it. Both are TTL maps, snapshotted to the store so an upgrade does
//! not scatter every session.

use std::sync::Arc;
use std::time::Duration;

use super::health::Class;
use super::scheduler::SkipReason;
use crate::base::clock::SharedClock;
use crate::store::{Store, StoreError};
use crate::ttl::{TtlConfig, TtlMap};

pub const SESSIONS_SNAPSHOT: &str = "affinity.sessions";
pub const RESPONSES_SNAPSHOT: &str = "affinity.responses";
/// How long a response id stays bound to its account.
pub const RESPONSE_TTL: Duration = Duration::from_secs(4 * 3600);
/// How long a session avoids an account that broke one of its streams.
pub const EXCLUSION_TTL: Duration = Duration::from_secs(600);
/// How long a client key's session avoids an account that refused one of its prompts for
/// policy (`cyber_policy`).
pub const REFUSAL_TTL: Duration = Duration::from_secs(3600);

/// The scope of a policy refusal: one client key's session.
pub fn refusal_scope(key_id: &str, session: &str) -> String {
    format!("{key_id}/{session}")
}

/// What the affinity did for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The session's bound account served it.
    Reused,
    /// The session had no account; it is now bound to the one that served it.
    NewBind,
    /// The session moved to another account, and why.
    Rebound(Rebound),
    /// No session key.
    None,
}

/// Why a session left its bound account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebound {
    /// The bound account was not a candidate.
    Skipped(SkipReason),
    /// An attempt on it failed.
    Failed(Class),
    /// It stayed busy for the whole sticky wait.
    Busy,
    /// Another account served, for no recorded reason.
    Failover,
    /// The bound account is gone.
    Gone,
}

impl Rebound {
    pub fn as_str(self) -> &'static str {
        match self {
            Rebound::Skipped(r) => r.as_str(),
            Rebound::Failed(c) => c.as_str(),
            Rebound::Busy => "busy",
            Rebound::Failover => "failover",
            Rebound::Gone => "gone",
        }
    }

    pub fn from_name(name: &str) -> Option<Rebound> {
        match name {
            "busy" => Some(Rebound::Busy),
            "failover" => Some(Rebound::Failover),
            "gone" => Some(Rebound::Gone),
            _ => SkipReason::from_name(name)
                .map(Rebound::Skipped)
                .or_else(|| Class::from_name(name).map(Rebound::Failed)),
        }
    }
}

impl Decision {
    /// `reused`, `new_bind`, `rebound(<why>)` or `none`.
    pub fn label(&self) -> String {
        match self {
            Decision::Rebound(why) => format!("rebound({})", why.as_str()),
            other => other.kind().into(),
        }
    }

    /// Reads a label back.
    pub fn from_label(label: &str) -> Option<Decision> {
        match label {
            "reused" => Some(Decision::Reused),
            "new_bind" => Some(Decision::NewBind),
            "none" => Some(Decision::None),
            _ => label
                .strip_prefix("rebound(")
                .and_then(|r| r.strip_suffix(')'))
                .and_then(Rebound::from_name)
                .map(Decision::Rebound),
        }
    }

    /// The metric label (without the reason).
    pub fn kind(&self) -> &'static str {
        Self::KINDS[self.kind_index()]
    }

    /// Every [`Decision::kind`], at its [`Decision::kind_index`].
    pub const KINDS: [&'static str; 4] = ["reused", "new_bind", "rebound", "none"];

    pub fn kind_index(&self) -> usize {
        match self {
            Decision::Reused => 0,
            Decision::NewBind => 1,
            Decision::Rebound(_) => 2,
            Decision::None => 3,
        }
    }
}

/// The affinity maps. Cloning shares them.
#[derive(Clone)]
pub struct Affinity {
    pub sessions: TtlMap<String, String>,
    pub responses: TtlMap<Arc<str>, Arc<str>>,
    /// Session -> accounts it avoids (each exclusion ends with the entry's TTL).
    exclusions: TtlMap<String, Vec<String>>,
    /// Key + session -> accounts that refused one of its prompts, and until when (unix ms).
    refusals: TtlMap<String, Vec<(String, u64)>>,
    clock: SharedClock,
}

impl Affinity {
    pub fn new(clock: SharedClock, idle_ttl: Duration) -> Self {
        Affinity {
            sessions: TtlMap::new(
                TtlConfig {
                    idle: Some(idle_ttl),
                    absolute: None,
                    max_entries: 100_000,
                },
                std::sync::Arc::clone(&clock),
            ),
            responses: TtlMap::new(
                TtlConfig {
                    idle: None,
                    absolute: Some(RESPONSE_TTL),
                    max_entries: 200_000,
                },
                std::sync::Arc::clone(&clock),
            ),
            exclusions: TtlMap::new(
                TtlConfig {
                    idle: None,
                    absolute: Some(EXCLUSION_TTL),
                    max_entries: 100_000,
                },
                std::sync::Arc::clone(&clock),
            ),
            refusals: TtlMap::new(
                TtlConfig {
                    idle: None,
                    absolute: Some(REFUSAL_TTL),
                    max_entries: 100_000,
                },
                std::sync::Arc::clone(&clock),
            ),
            clock,
        }
    }

    /// The account a session is bound to (counts as a use).
    pub fn bound(&self, session: &str) -> Option<String> {
        self.sessions.get(session)
    }

    pub fn bind(&self, session: &str, account: &str) {
        self.sessions
            .insert(session.to_string(), account.to_string());
    }

    /// The account that produced a response.
    pub fn owner(&self, response_id: &str) -> Option<Arc<str>> {
        self.responses.peek(response_id)
    }

    /// Remembers the account that produced a response; a request's shared strings are kept as
    /// they are (the map's key, its order's copy of the key and the value are no copies).
    pub fn own(&self, response_id: impl Into<Arc<str>>, account: impl Into<Arc<str>>) {
        self.responses.insert(response_id.into(), account.into());
    }

    /// Keeps a session away from an account for a while (it broke one of its streams).
    pub fn exclude(&self, session: &str, account: &str) {
        let key = session.to_string();
        let mut list = self.exclusions.peek(&key).unwrap_or_default();
        if !list.iter().any(|a| a == account) {
            list.push(account.to_string());
        }
        self.exclusions.insert(key, list);
    }

    /// The accounts a session avoids now.
    pub fn excluded(&self, session: &str) -> Vec<String> {
        if self.exclusions.is_empty() {
            return Vec::new();
        }
        self.exclusions.peek(session).unwrap_or_default()
    }

    /// Keeps a key's session away from an account that refused one of its prompts.
    pub fn refuse(&self, scope: &str, account: &str) {
        self.refuse_for(scope, account, REFUSAL_TTL);
    }

    /// The same for `ttl` (an operator rule's cooldown), at most [`REFUSAL_TTL`].
    pub fn refuse_for(&self, scope: &str, account: &str, ttl: Duration) {
        let now = self.clock.now_ms();
        let ttl = ttl.min(REFUSAL_TTL);
        let until = now.saturating_add(crate::base::duration::whole_ms(ttl));
        let key = scope.to_string();
        let mut list = self.refusals.peek(&key).unwrap_or_default();
        list.retain(|(a, u)| a != account && *u > now);
        list.push((account.to_string(), until));
        self.refusals.insert(key, list);
    }

    /// The accounts that refused this key's session and are still avoided.
    pub fn refused(&self, scope: &str) -> Vec<String> {
        if self.refusals.is_empty() {
            return Vec::new();
        }
        let now = self.clock.now_ms();
        self.refusals
            .peek(scope)
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, until)| *until > now)
            .map(|(a, _)| a)
            .collect()
    }

    pub fn spawn_refusal_sweeper(
        &self,
        every: Duration,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        self.refusals.spawn_sweeper(every, stop)
    }

    pub fn spawn_exclusion_sweeper(
        &self,
        every: Duration,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        self.exclusions.spawn_sweeper(every, stop)
    }

    /// Sessions bound per account id.
    pub fn sessions_per_account(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for e in self.sessions.snapshot() {
            *m.entry(e.value).or_insert(0) += 1;
        }
        m
    }

    /// Forgets everything bound to an account (it was removed).
    pub fn forget_account(&self, account: &str) {
        self.sessions.retain(|_, a| a != account);
        self.responses.retain(|_, a| &**a != account);
    }

    pub async fn save(&self, store: &Store) -> Result<(usize, usize), StoreError> {
        let s = self.sessions.save_to(store, SESSIONS_SNAPSHOT).await?;
        let r = self.responses.save_to(store, RESPONSES_SNAPSHOT).await?;
        Ok((s, r))
    }

    pub fn load(&self, store: &Store) -> Result<(usize, usize), StoreError> {
        let s = self.sessions.load_from(store, SESSIONS_SNAPSHOT)?;
        let r = self.responses.load_from(store, RESPONSES_SNAPSHOT)?;
        Ok((s, r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_labels_read_back() {
        for d in [
            Decision::Reused,
            Decision::NewBind,
            Decision::None,
            Decision::Rebound(Rebound::Busy),
            Decision::Rebound(Rebound::Gone),
            Decision::Rebound(Rebound::Failover),
            Decision::Rebound(Rebound::Skipped(SkipReason::Cooling)),
            Decision::Rebound(Rebound::Failed(Class::Quota)),
        ] {
            assert_eq!(Decision::from_label(&d.label()), Some(d), "{}", d.label());
        }
        assert_eq!(
            Decision::Rebound(Rebound::Skipped(SkipReason::Probing)).label(),
            "rebound(half_open_probe)"
        );
        assert_eq!(Decision::from_label("rebound(nonsense)"), None);
    }
}
