//! Background work on accounts: polling each account's `wham/usage` (jittered) so quota-aware
//! scheduling and the ceiling see fresh numbers, probing accounts whose quota cooldown has
//! ended (half-open) so they come back without a user's request paying for the check, and
//! proving accounts not known to be healthy — new, logged in again, or back from a long
//! cooldown — with their usage and one minimal request before they take any (probe before
//! bind).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Dispatcher;
use crate::base::job::Ticker;
use crate::fleet::Origin;
use crate::fleet::health::{AccountState, Blame, Class};
use crate::fleet::refresh::TokenError;
use crate::upstream::event::is_terminal;
use crate::upstream::failure::{Facts, Phase};
use crate::upstream::quota::QuotaSnapshot;
use crate::upstream::stream::{EventStream, Item};
use crate::upstream::{MAX_ERROR_BODY, Overflow};

/// Why a usage poll failed.
#[derive(Debug)]
pub enum PollError {
    /// No usable token (the refresh failure was already applied to the account).
    Token(TokenError),
    /// The usage endpoint's answer, or the transport's failure (boxed: facts are large, and a
    /// failed poll is rare).
    Upstream(Box<Facts>),
}

impl PollError {
    pub fn summary(&self) -> String {
        match self {
            PollError::Token(e) => e.summary(),
            PollError::Upstream(f) => f.summary(),
        }
    }
}

/// How often the poller looks for work.
const TICK: Duration = Duration::from_secs(5);
/// How often it looks for credits that would lapse unspent.
const EXPIRY_CHECK: Duration = Duration::from_secs(60);

fn jittered(base: Duration) -> Duration {
    // ±20 %, so accounts added together do not poll together.
    let r = getrandom::u32().unwrap_or(0) % 41;
    base.mul_f64(0.8 + f64::from(r) / 100.0)
}

impl Dispatcher {
    /// Fetches an account's usage and records it.
    pub async fn poll_usage(&self, id: &str) -> Result<QuotaSnapshot, PollError> {
        let mut identity = self
            .fleet
            .ensure_fresh(id, None, self.upstream.as_ref())
            .await
            .map_err(PollError::Token)?;
        // Where the account's requests go, first, while that is not known: after a start, an
        // import, a login or a refresh.
        if self.fleet.routing_unknown(id) {
            self.discover_route(id, &identity).await;
            if let Some(routed) = self.fleet.identity(id) {
                identity = routed;
            }
        }
        let v = self
            .upstream
            .usage(&identity)
            .await
            .map_err(|f| PollError::Upstream(Box::new(f)))?;
        let snap = QuotaSnapshot::from_usage(&v, self.fleet.clock().now_ms());
        self.fleet.update_quota(id, snap.clone());
        Ok(snap)
    }

    /// A probe asks for no model and begins now.
    fn origin(&self) -> Origin<'static> {
        Origin {
            model: "",
            started_ms: self.fleet.clock().now_ms(),
        }
    }

    /// Probes a half-open account with a usage call: it holds the account's one probe slot, so
    /// no request probes it at the same time. Returns the class the probe was judged as.
    pub async fn probe(&self, id: &str) -> Option<Class> {
        let lease = self.fleet.try_lease(id, "").ok()?;
        let class = match self.poll_usage(id).await {
            // A window still used up: the quota stays exhausted until it resets.
            Ok(snap) => match snap.exhaustion() {
                Some(facts) => {
                    self.fleet
                        .report_failure(id, &facts, self.origin(), &mut Blame::default())
                }
                None => {
                    self.fleet.report(id, Class::Success, None, "");
                    Class::Success
                }
            },
            Err(PollError::Upstream(facts)) => {
                self.fleet
                    .report_failure(id, &facts, self.origin(), &mut Blame::default())
            }
            Err(PollError::Token(TokenError::Failed { class, .. })) => class,
            Err(PollError::Token(TokenError::Missing)) => return None,
        };
        drop(lease);
        tracing::info!(account = %id, class = class.as_str(), "half-open probe");
        Some(class)
    }

    /// Proves an account not known to be healthy: its usage (a window used up cools it until
    /// the reset), then one minimal streamed request, read to its first output. Any answer from
    /// the backend that shows the login works — output, or a refusal of the request itself
    /// (the probe's model or a parameter) — proves it; any other failure is classified like a
    /// request's and applied, and the account stays unproven. Returns the verdict's class.
    pub async fn prove(&self, id: &str) -> Option<Class> {
        if self.fleet.get(id)?.state != AccountState::Probing {
            return None;
        }
        // One proof of an account at a time (the poller's, or an operator's).
        let _running = Proving::start(&self.proving, id)?;
        let class = match self.poll_usage(id).await {
            Ok(snap) => match snap.exhaustion() {
                Some(facts) => {
                    self.fleet
                        .report_failure(id, &facts, self.origin(), &mut Blame::default())
                }
                None => self.probe_request(id).await,
            },
            Err(PollError::Upstream(facts)) => {
                self.fleet
                    .report_failure(id, &facts, self.origin(), &mut Blame::default())
            }
            Err(PollError::Token(TokenError::Failed { class, .. })) => class,
            Err(PollError::Token(TokenError::Missing)) => return None,
        };
        let proven = matches!(
            class,
            Class::Success | Class::Caller | Class::ModelUnsupported | Class::Policy
        );
        if proven {
            self.fleet.proven(id);
            if class == Class::Success {
                // It counts towards clearing an escalated ladder, as a request's would.
                self.fleet.report(id, Class::Success, None, "");
            }
        }
        tracing::info!(account = %id, class = class.as_str(), proven, "probe before bind");
        Some(class)
    }

    /// One minimal request on the account, judged at its first output.
    pub(super) async fn probe_request(&self, id: &str) -> Class {
        let identity = match self
            .fleet
            .ensure_fresh(id, None, self.upstream.as_ref())
            .await
        {
            Ok(i) => i,
            Err(TokenError::Failed { class, .. }) => return class,
            Err(TokenError::Missing) => return Class::Abandoned,
        };
        let config = self.current();
        let model = config.probe_model.as_str();
        let body = json!({
            "model": model,
            "instructions": "Reply with one word.",
            "input": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "ping"}]}],
            "tools": [],
            "tool_choice": "auto",
            "parallel_tool_calls": false,
            "store": false,
            "stream": true,
        });
        let origin = crate::fleet::Origin {
            model,
            started_ms: self.fleet.clock().now_ms(),
        };
        let judged = async {
            let resp = self
                .upstream
                .post(
                    "/responses",
                    &identity,
                    &[],
                    Bytes::from(body.to_string()),
                    true,
                )
                .await?;
            let status = resp.status().as_u16();
            if !(200..300).contains(&status) {
                let headers = resp.headers().clone();
                let bytes = self
                    .upstream
                    .read_body(resp, MAX_ERROR_BODY, Overflow::Truncate)
                    .await
                    .unwrap_or_default();
                return Err(Facts::from_response(status, &headers, bytes));
            }
            let mut events = EventStream::sse(resp, self.current().max_event_bytes);
            loop {
                match events.next().await {
                    None => {
                        return Err(Facts::transport(
                            Phase::PreCommit,
                            "the probe's stream ended before any output",
                        ));
                    }
                    Some(Err(e)) => return Err(Facts::transport(Phase::PreCommit, e)),
                    // (Nothing is moved: no buffer is given for it.)
                    Some(Ok(Item::KeepAlive | Item::Moved)) => {}
                    Some(Ok(Item::Event(ev))) => {
                        let kind = ev.kind();
                        if kind == "response.completed" {
                            return Ok(());
                        }
                        if is_terminal(kind) || kind == "error" {
                            let v = ev.json().unwrap_or_default();
                            return Err(Facts::from_event(Phase::PreCommit, &v));
                        }
                        if !super::stream::is_precommit(kind.as_bytes()) {
                            return Ok(());
                        }
                    }
                }
            }
        };
        let within = self.upstream.config().header_timeout;
        let verdict = match tokio::time::timeout(within, judged).await {
            Ok(v) => v,
            Err(_) => Err(Facts::transport(
                Phase::PreCommit,
                format!("the probe showed no output within {within:?}"),
            )),
        };
        match verdict {
            Ok(()) => Class::Success,
            Err(facts) => self
                .fleet
                .report_failure(id, &facts, origin, &mut Blame::default()),
        }
    }

    /// Starts proving `id` in its own task (the poller does not wait for it).
    fn spawn_prove(&self, id: &str) {
        if self
            .proving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(id)
        {
            return;
        }
        let (d, id) = (self.clone(), id.to_string());
        tokio::spawn(async move { d.prove(&id).await });
    }

    /// Asks where the account's requests go (workspace routing) and keeps the answer. An
    /// answer that refuses or cannot be followed is kept as such, shown on the account; a
    /// transport failure leaves it unknown, asked again at the next poll (the account's own
    /// failures say the backend is unreachable).
    async fn discover_route(&self, id: &str, identity: &crate::upstream::Identity) {
        match self.upstream.discover_route(identity).await {
            Err(f) if f.transport.is_some() => {
                tracing::debug!(account = %id, error = %f.summary(), "workspace routing not asked: the backend is unreachable");
            }
            found => self.fleet.set_route(id, found.map_err(|f| f.summary())),
        }
    }

    /// Wakes the poller now (an account was added or logged in again: prove it at once).
    pub fn wake_prober(&self) {
        self.prober.notify_one();
    }

    /// The poller: every account's usage at the configured interval, half-open accounts at
    /// once, and unproven accounts proved as soon as they are seen.
    pub fn spawn_usage_poller(&self, stop: CancellationToken) -> JoinHandle<()> {
        let d = self.clone();
        tokio::spawn(async move {
            let mut next: HashMap<String, tokio::time::Instant> = HashMap::new();
            let mut expiry_due = tokio::time::Instant::now();
            let mut warmups = super::warmup::WarmupState::default();
            let mut ticker = Ticker::new(TICK, stop);
            while ticker.tick_or(d.prober.notified()).await {
                // A spend left without an answer (a crash, a timeout) is settled first.
                d.settle_spends().await;
                let interval = d.fleet.settings().usage_poll_interval;
                for a in d.fleet.list() {
                    if !a.enabled || a.state == AccountState::NeedsReauth {
                        continue;
                    }
                    if a.state == AccountState::Probing {
                        d.spawn_prove(&a.id);
                        continue;
                    }
                    // A quota cooldown is judged by the usage document itself; other cooldowns
                    // (5xx, resets, challenges) by the next real request, since the usage
                    // endpoint answering says little about the responses endpoint.
                    if a.state == AccountState::HalfOpen && a.reason == Some(Class::Quota) {
                        d.probe(&a.id).await;
                        continue;
                    }
                    let now = tokio::time::Instant::now();
                    let due = next
                        .entry(a.id.clone())
                        .or_insert_with(|| now + jittered(Duration::from_secs(3)));
                    if now >= *due {
                        *due = now + jittered(interval);
                        match d.poll_usage(&a.id).await {
                            Err(e) => {
                                tracing::debug!(account = %a.id, error = %e.summary(), "usage poll failed");
                            }
                            // Banked credits: when the soonest expires (and whether one
                            // would lapse unspent: looked at now).
                            Ok(snap) if snap.reset_credits.is_some_and(|n| n > 0) => {
                                match d.list_credits(&a.id).await {
                                    Ok(_) => expiry_due = tokio::time::Instant::now(),
                                    Err(e) => {
                                        tracing::debug!(account = %a.id, error = %e, "reset credits not listed");
                                    }
                                }
                            }
                            Ok(_) => {}
                        }
                    }
                }
                d.warm_up(&mut warmups).await;
                let now = tokio::time::Instant::now();
                if d.current().credits.auto.before_expiry() && now >= expiry_due {
                    expiry_due = now + EXPIRY_CHECK;
                    d.spend_before_expiry().await;
                }
            }
        })
    }
}

/// The accounts being proved; an entry lives as long as its proof.
pub(super) type ProvingSet = Arc<Mutex<HashSet<String>>>;

struct Proving {
    set: ProvingSet,
    id: String,
}

impl Proving {
    /// `None` when a proof of `id` already runs.
    fn start(set: &ProvingSet, id: &str) -> Option<Proving> {
        let fresh = set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string());
        fresh.then(|| Proving {
            set: Arc::clone(set),
            id: id.to_string(),
        })
    }
}

impl Drop for Proving {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}
