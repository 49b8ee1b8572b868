//! Scheduling (DESIGN §6): which accounts may serve a request and in what order (frozen per
//! request), concurrency slots with an adaptive limit (AIMD), and the wait queues — per
//! account for sticky sessions, pool-wide otherwise — woken by slot releases.
//!
//! A released slot is handed straight to the first waiter that can use it (FIFO), so a
//! newcomer cannot overtake a request that has been waiting. Every path that ends an attempt
//! drops its [`Lease`], and the drop releases the slot.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::health::Effective;
use super::settings::{Settings, Strategy};
use super::table::Hot;
use super::{Entry, Fleet, Inner};
use crate::base::names::named;

named! {
    /// Why an account was not a candidate, or not taken.
    pub enum SkipReason {
        Disabled => "disabled",
        NeedsReauth => "needs_reauth",
        Cooling => "cooling",
        /// Half-open with its one probe already running.
        Probing => "half_open_probe",
        /// Not known to be healthy yet: a background probe decides first.
        Unproven => "probing",
        ModelUnsupported => "model_unsupported",
        NoTokens => "no_tokens",
        /// Above the quota ceiling while another account has headroom.
        QuotaCeiling => "quota_ceiling",
        /// It broke one of this session's streams recently.
        SessionExcluded => "session_excluded",
        /// It refused one of this key's session's prompts for policy in the last hour.
        PolicyExcluded => "policy_excluded",
        /// Every slot is taken.
        Full => "full",
        /// Draining: it serves only the sessions already bound to it.
        Draining => "draining",
    }
}

/// A request's frozen candidate list.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Account ids in the order they will be tried (shared with the pool's table: a plan hands
    /// over up to 32 of them).
    pub order: Vec<Arc<str>>,
    /// Accounts left out, and why.
    pub skipped: Vec<(String, SkipReason)>,
    /// The session's bound account, when it is eligible (it is first in `order`).
    pub sticky: Option<String>,
    /// The account the session was bound to, eligible or not.
    pub bound: Option<String>,
    /// Set when only one account may serve (a continuation of one of its responses).
    pub owner_only: bool,
}

named! {
    /// How a wait for a slot ended.
    pub enum QueueOutcome {
        Acquired => "acquired",
        Timeout => "timeout",
        QueueFull => "queue_full",
        ClientLeft => "client_left",
        /// Every account it waited for became unusable (it cooled, or needs a login).
        Withdrawn => "withdrawn",
    }
}

named! {
    /// Which queue a request waited in.
    pub enum QueueKind {
        /// A sticky session waiting for its own account.
        Account => "account",
        /// Waiting for any of its candidates.
        Pool => "pool",
    }
}

/// A finished wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub kind: QueueKind,
    pub outcome: QueueOutcome,
    pub waited: Duration,
}

/// A running attempt's hold on one slot of an account. Dropping it releases the slot, on every
/// path (success, error, panic, client gone), and hands it to the next waiter.
#[derive(Debug)]
pub struct Lease {
    fleet: Fleet,
    pub id: Arc<str>,
    pub chatgpt_account_id: Arc<str>,
    probe: bool,
    /// False once the slot has been accounted for by hand (a hand-off nobody took).
    armed: bool,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.armed {
            self.fleet.release(&self.id, self.probe);
        }
    }
}

/// A request waiting for a slot.
pub(crate) struct Waiter {
    id: u64,
    model: String,
    /// For pool waiters: the accounts it may take.
    accepts: Option<Arc<HashSet<String>>>,
    tx: oneshot::Sender<Lease>,
    /// When it started waiting (clock ms).
    pub(crate) since_ms: u64,
}

/// Removes a waiter from its queue when the wait ends for any reason, and gives back a slot
/// that was handed to it but never taken.
struct WaitGuard<'a> {
    fleet: &'a Fleet,
    waiter: u64,
    account: Option<String>,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let mut inner = self.fleet.write();
        match &self.account {
            Some(a) => {
                if let Some(waiters) = inner.accounts.waiters_mut(a) {
                    waiters.retain(|w| w.id != self.waiter);
                }
            }
            None => inner.pool.retain(|w| w.id != self.waiter),
        }
    }
}

/// The most candidates a request walks (its failover budget).
pub const MAX_CANDIDATES: usize = 32;

/// Where an account ranks, lower first: its priority in the top 32 bits, then the strategy's
/// key in the 96 below (one number, so ranking compares once).
type Rank = u128;

/// An account's [`Rank`] from its priority and the strategy's `key` (at most 96 bits).
#[inline]
fn rank(h: &Hot, key: u128) -> Rank {
    // Priority as a sort key: lower goes first, whatever the strategy.
    let priority = (i64::from(h.priority) - i64::from(i32::MIN)) as u128;
    priority << 96 | key
}

/// The best [`MAX_CANDIDATES`] of `eligible` (indices into `rows`) walked in rotation order
/// from `start`, ranked by `rank`, ties going to the earlier in that order; each with its
/// turn (its place in the walk). One pass keeps a bounded heap of the best so far: equals
/// after the first few cost one comparison each.
fn best_ranked(
    rows: &[Hot],
    eligible: &[u32],
    start: usize,
    rank: impl Fn(&Hot) -> Rank,
) -> Vec<(Rank, u32)> {
    let (before, from) = eligible.split_at(start);
    let mut keyed = from
        .iter()
        .chain(before)
        .enumerate()
        .map(|(turn, &i)| (rank(&rows[i as usize]), turn as u32));
    let mut best: std::collections::BinaryHeap<(Rank, u32)> =
        keyed.by_ref().take(MAX_CANDIDATES).collect();
    // Turns only grow along the walk, so a later account beats the worst kept one only by a
    // lower rank.
    let mut worst = best.peek().map(|w| w.0);
    for item in keyed {
        if worst.is_some_and(|w| item.0 < w) {
            if let Some(mut top) = best.peek_mut() {
                *top = item;
            }
            worst = best.peek().map(|w| w.0);
        }
    }
    let mut best = best.into_vec();
    best.sort_unstable();
    best
}

fn over_ceiling(h: &Hot, ceiling: f64) -> bool {
    h.most_used_percent >= ceiling
}

/// Why an account with row `h` cannot serve `model` now (slots aside); `unsupported` looks
/// up the account's marks for the model, asked only when it has any.
#[inline]
fn gate_reason(
    h: &Hot,
    model: &str,
    now_ms: u64,
    unsupported: impl FnOnce() -> bool,
) -> Option<SkipReason> {
    if !h.enabled() {
        return Some(SkipReason::Disabled);
    }
    if !h.has_tokens() {
        return Some(SkipReason::NoTokens);
    }
    match h.gate.effective(now_ms) {
        Effective::NeedsReauth => return Some(SkipReason::NeedsReauth),
        Effective::Cooling { .. } => return Some(SkipReason::Cooling),
        // A half-open account whose probe runs, and an account its background probe has
        // yet to prove, are candidates that are busy (see `try_lease`): requests wait for
        // the verdict instead of being turned away.
        Effective::HalfOpen | Effective::Probing | Effective::Ready => {}
    }
    if !model.is_empty() && h.any_unsupported() && unsupported() {
        return Some(SkipReason::ModelUnsupported);
    }
    None
}

/// What a plan needs to judge an account that is not plainly eligible.
struct CloserLook<'a> {
    inner: &'a Inner,
    model: &'a str,
    now: u64,
    /// Accounts that broke one of this session's streams recently.
    excluded: &'a [String],
    /// Accounts that refused this key's session for policy.
    refused: &'a [String],
    /// The session's bound account.
    bound: Option<&'a str>,
}

impl CloserLook<'_> {
    /// Whether the `i`-th account (row `h`) is left out; if so, it is added to `skipped` with
    /// the reason. Kept out of line: the plan's loop over plainly eligible accounts stays small.
    #[cold]
    #[inline(never)]
    fn skipped(&self, i: usize, h: &Hot, skipped: &mut Vec<(String, SkipReason)>) -> bool {
        let id = self.inner.accounts.id(i);
        let unsupported = || {
            self.inner
                .accounts
                .get(id)
                .is_some_and(|e| e.is_unsupported(self.model, self.now))
        };
        let reason = gate_reason(h, self.model, self.now, unsupported)
            .or_else(|| {
                self.excluded
                    .iter()
                    .any(|x| x == id)
                    .then_some(SkipReason::SessionExcluded)
            })
            .or_else(|| {
                self.refused
                    .iter()
                    .any(|x| x == id)
                    .then_some(SkipReason::PolicyExcluded)
            })
            .or_else(|| {
                // A draining account keeps the sessions bound to it and takes no others.
                (h.draining() && self.bound != Some(id)).then_some(SkipReason::Draining)
            });
        match reason {
            Some(r) => {
                skipped.push((id.to_string(), r));
                true
            }
            None => false,
        }
    }
}

impl Fleet {
    pub fn settings(&self) -> Settings {
        self.settings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .effective
            .clone()
    }

    /// Why `e` cannot serve `model` now (slots aside).
    pub(crate) fn skip_reason(&self, e: &Entry, model: &str, now_ms: u64) -> Option<SkipReason> {
        gate_reason(&Hot::of(e), model, now_ms, || {
            e.is_unsupported(model, now_ms)
        })
    }

    /// Freezes a request's candidates (without a key's policy refusals: see [`Fleet::plan_for`]).
    pub fn plan(&self, model: &str, session: Option<&str>) -> Plan {
        self.plan_for(model, session, None)
    }

    /// Freezes a request's candidates: eligibility, the quota ceiling, session exclusions, the
    /// accounts that refused this key's session (`refusal_scope`) for policy, the strategy's
    /// order, and the session's bound account first when it is eligible.
    pub fn plan_for(
        &self,
        model: &str,
        session: Option<&str>,
        refusal_scope: Option<&str>,
    ) -> Plan {
        let now = self.clock.now_ms();
        let settings = self.settings();
        let bound = session.and_then(|s| self.affinity.bound(s));
        let inner = self.read();
        let mut plan = Plan {
            bound: bound.clone(),
            ..Plan::default()
        };
        let excluded = session
            .map(|s| self.affinity.excluded(s))
            .unwrap_or_default();
        let refused = refusal_scope
            .map(|s| self.affinity.refused(s))
            .unwrap_or_default();
        // The accounts' rows (see `table`) hold what this reads; an entry itself is read only
        // for an account with unsupported-model marks.
        inner.accounts.check_rows();
        let rows = inner.accounts.rows();
        let ceiling = settings.quota_ceiling_percent;
        // Eligible accounts as indices into the rows: a plan writes little per account.
        let mut eligible: Vec<u32> = Vec::with_capacity(rows.len());
        let mut over = 0;
        // Most accounts are plainly eligible: only the others get a closer look.
        let closer_look = !excluded.is_empty() || !refused.is_empty();
        let look = CloserLook {
            inner: &inner,
            model,
            now,
            excluded: &excluded,
            refused: &refused,
            bound: bound.as_deref(),
        };
        for (i, h) in rows.iter().enumerate() {
            if (closer_look || !h.plainly_eligible()) && look.skipped(i, h, &mut plan.skipped) {
                continue;
            }
            over += usize::from(over_ceiling(h, ceiling));
            eligible.push(i as u32);
        }
        // Accounts above the quota ceiling wait while others have headroom.
        if over > 0 && over < eligible.len() {
            eligible.retain(|&i| {
                let over = over_ceiling(&rows[i as usize], ceiling);
                if over {
                    plan.skipped.push((
                        inner.accounts.id(i as usize).to_string(),
                        SkipReason::QuotaCeiling,
                    ));
                }
                !over
            });
        }
        // Rank by the strategy, ties broken by a rotation that moves on every plan (so
        // accounts the strategy ranks equal take turns).
        let n = eligible.len();
        let start = if n == 0 {
            0
        } else {
            self.rr.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % n
        };
        let best = match settings.strategy {
            Strategy::RoundRobin => best_ranked(rows, &eligible, start, |h| rank(h, 0)),
            Strategy::QuotaAware => best_ranked(rows, &eligible, start, |h| rank(h, h.headroom)),
            // The least loaded first.
            Strategy::LeastLoaded => best_ranked(rows, &eligible, start, |h| {
                let load = f64::from(h.in_flight) / f64::from(h.slots) * 1_000_000.0;
                rank(h, u128::from(load as u64))
            }),
            // Priority is already the first key: fill the oldest account first.
            Strategy::FillFirst => best_ranked(rows, &eligible, start, |h| {
                rank(h, u128::from(h.created_at))
            }),
        };
        let row_of = |turn: u32| eligible[(start + turn as usize) % n] as usize;
        plan.order = best
            .iter()
            .map(|&(_, turn)| Arc::clone(inner.accounts.shared_id(row_of(turn))))
            .collect();
        if let Some(b) = &bound
            && let Some(&i) = eligible
                .iter()
                .find(|&&i| inner.accounts.id(i as usize) == b)
        {
            plan.order.retain(|id| **id != **b);
            plan.order
                .insert(0, Arc::clone(inner.accounts.shared_id(i as usize)));
            plan.sticky = Some(b.clone());
        }
        plan
    }

    /// A plan for a continuation: only the account that produced `response_id` may serve it.
    /// `Err` carries why it cannot (unknown response, or the owner is unusable now).
    pub fn plan_owner(&self, model: &str, response_id: &str) -> Result<Plan, String> {
        let owner = self
            .affinity
            .owner(response_id)
            .ok_or_else(|| format!("Previous response with id '{response_id}' not found."))?;
        let now = self.clock.now_ms();
        let inner = self.read();
        let e = inner
            .accounts
            .get(&owner)
            .ok_or_else(|| format!("Previous response with id '{response_id}' not found."))?;
        if let Some(r) = self.skip_reason(e, model, now) {
            return Err(format!(
                "Previous response with id '{response_id}' not found (its account is {}).",
                r.as_str()
            ));
        }
        Ok(Plan {
            order: vec![Arc::clone(&owner)],
            sticky: Some(owner.to_string()),
            bound: Some(owner.to_string()),
            owner_only: true,
            ..Plan::default()
        })
    }

    /// Takes a slot on `id` now, if it is still eligible and has one free.
    pub fn try_lease(&self, id: &str, model: &str) -> Result<Lease, SkipReason> {
        let now = self.clock.now_ms();
        let mut inner = self.write();
        let mut e = inner.accounts.get_mut(id).ok_or(SkipReason::Disabled)?;
        // Judged by its row, which is not built again for it (as `skip_reason` would).
        if let Some(r) = gate_reason(e.row(), model, now, || e.is_unsupported(model, now)) {
            return Err(r);
        }
        // One probe at a time decides a half-open account; others wait for its verdict. A
        // request is never the probe of an account not known to be healthy.
        if e.probing {
            return Err(SkipReason::Probing);
        }
        if e.health.effective(now) == Effective::Probing {
            return Err(SkipReason::Unproven);
        }
        // Waiters go first: a free slot with a queue in front of it is not ours.
        if e.in_flight >= e.limit.floor() as u32 || !e.waiters.is_empty() {
            return Err(SkipReason::Full);
        }
        let lease = self.grant(&mut e, now);
        e.slots_changed();
        Ok(lease)
    }

    /// Marks a slot taken on `e` and returns its lease (the caller holds the lock).
    fn grant(&self, e: &mut Entry, now: u64) -> Lease {
        let probe = e.health.effective(now) == Effective::HalfOpen;
        if probe {
            e.probing = true;
        }
        e.in_flight += 1;
        Lease {
            fleet: self.clone(),
            id: Arc::clone(&e.shared_id),
            chatgpt_account_id: Arc::clone(&e.chatgpt_id),
            probe,
            armed: true,
        }
    }

    /// Kept for callers that do not queue (tests, probes): same as [`try_lease`](Self::try_lease).
    pub fn lease(&self, id: &str, model: &str) -> Result<Lease, SkipReason> {
        self.try_lease(id, model)
    }

    /// Waits for a slot on `account` (a sticky session), at most `wait`. `cancel` resolving
    /// means the client left.
    pub async fn wait_for_account(
        &self,
        account: &str,
        model: &str,
        wait: Duration,
        max_waiting: usize,
        cancel: impl Future<Output = ()>,
    ) -> (Option<Lease>, Wait) {
        self.wait(Some(account), None, model, wait, max_waiting, cancel)
            .await
    }

    /// Waits for a slot on any of `accounts`, at most `wait`.
    pub async fn wait_for_pool(
        &self,
        accounts: &[impl AsRef<str>],
        model: &str,
        wait: Duration,
        max_waiting: usize,
        cancel: impl Future<Output = ()>,
    ) -> (Option<Lease>, Wait) {
        let accepts = Arc::new(
            accounts
                .iter()
                .map(|a| a.as_ref().to_string())
                .collect::<HashSet<_>>(),
        );
        self.wait(None, Some(accepts), model, wait, max_waiting, cancel)
            .await
    }

    async fn wait(
        &self,
        account: Option<&str>,
        accepts: Option<Arc<HashSet<String>>>,
        model: &str,
        wait: Duration,
        max_waiting: usize,
        cancel: impl Future<Output = ()>,
    ) -> (Option<Lease>, Wait) {
        let started = Instant::now();
        let kind = if account.is_some() {
            QueueKind::Account
        } else {
            QueueKind::Pool
        };
        let done = |outcome| Wait {
            kind,
            outcome,
            waited: started.elapsed(),
        };
        let (tx, rx) = oneshot::channel();
        let waiter_id = {
            let mut inner = self.write();
            inner.next_waiter += 1;
            let id = inner.next_waiter;
            let waiter = Waiter {
                id,
                model: model.to_string(),
                accepts: accepts.clone(),
                tx,
                since_ms: self.clock.now_ms(),
            };
            let queue = match account {
                Some(a) => match inner.accounts.waiters_mut(a) {
                    Some(waiters) => waiters,
                    None => return (None, done(QueueOutcome::QueueFull)),
                },
                None => &mut inner.pool,
            };
            if queue.len() >= max_waiting {
                return (None, done(QueueOutcome::QueueFull));
            }
            queue.push_back(waiter);
            id
        };
        let guard = WaitGuard {
            fleet: self,
            waiter: waiter_id,
            account: account.map(str::to_string),
        };
        // A slot may have freed up between the caller's attempt and joining the queue.
        match account {
            Some(a) => self.hand_off(a),
            None => {
                for a in accepts.iter().flat_map(|s| s.iter()) {
                    self.hand_off(a);
                }
            }
        }
        let mut rx = rx;
        let outcome = tokio::select! {
            r = &mut rx => match r {
                Ok(lease) => return (Some(lease), done(QueueOutcome::Acquired)),
                // Taken off the queue without a slot: what it waited for became unusable.
                Err(_) => QueueOutcome::Withdrawn,
            },
            _ = tokio::time::sleep(wait) => QueueOutcome::Timeout,
            _ = cancel => QueueOutcome::ClientLeft,
        };
        drop(guard);
        // A lease handed over in the last instant is given back (its drop releases it).
        if let Ok(lease) = rx.try_recv() {
            if outcome == QueueOutcome::ClientLeft {
                drop(lease);
            } else {
                return (Some(lease), done(QueueOutcome::Acquired));
            }
        }
        (None, done(outcome))
    }

    /// Gives back a slot and hands it to the next waiter that can use it.
    fn release(&self, id: &str, probe: bool) {
        let awaited = {
            let mut inner = self.write();
            let pool_waits = !inner.pool.is_empty();
            match inner.accounts.get_mut(id) {
                Some(mut e) => {
                    e.in_flight = e.in_flight.saturating_sub(1);
                    if probe {
                        e.probing = false;
                    }
                    let awaited = pool_waits || !e.waiters.is_empty();
                    e.slots_changed();
                    awaited
                }
                None => false,
            }
        };
        // With no one waiting, for it or for the pool, there is no one to hand the slot to.
        if awaited {
            self.hand_off(id);
        }
    }

    /// While `id` has free slots and someone waits for it, hands slots over: its own sticky
    /// waiters first, then the first pool waiter that accepts it.
    pub(crate) fn hand_off(&self, id: &str) {
        let now = self.clock.now_ms();
        let mut undelivered: Vec<Lease> = Vec::new();
        {
            let mut guard = self.write();
            let inner: &mut Inner = &mut guard;
            while let Some(e) = inner.accounts.get(id) {
                if e.in_flight >= e.limit.floor() as u32
                    || e.probing
                    || e.health.effective(now) == Effective::Probing
                {
                    break;
                }
                let waiter = if let Some(w) = e.waiters.front() {
                    if self.skip_reason(e, &w.model, now).is_some() {
                        // The account went bad: its sticky waiters will time out and rebind.
                        break;
                    }
                    inner.accounts.waiters_mut(id).and_then(VecDeque::pop_front)
                } else {
                    let usable = |w: &Waiter| self.skip_reason(e, &w.model, now).is_none();
                    let pos = inner.pool.iter().position(|w| {
                        w.accepts.as_ref().is_some_and(|a| a.contains(id)) && usable(w)
                    });
                    match pos {
                        Some(p) => inner.pool.remove(p),
                        None => None,
                    }
                };
                let Some(w) = waiter else { break };
                let Some(mut e) = inner.accounts.get_mut(id) else {
                    break;
                };
                let lease = self.grant(&mut e, now);
                if let Err(mut lease) = w.tx.send(lease) {
                    // The waiter is gone: take the slot back by hand (we hold the lock).
                    lease.armed = false;
                    e.in_flight = e.in_flight.saturating_sub(1);
                    if lease.probe {
                        e.probing = false;
                    }
                    undelivered.push(lease);
                }
            }
        }
        drop(undelivered);
    }

    /// The first output of an attempt: when it is a half-open account's probe, that is the
    /// verdict — the account is ready again, and the requests waiting for it get its slots
    /// while the probe's own answer goes on.
    pub fn first_output(&self, lease: &mut Lease) {
        if !lease.probe {
            return;
        }
        lease.probe = false;
        let now = self.clock.now_ms();
        let health = {
            let mut inner = self.write();
            let Some(mut e) = inner.accounts.get_mut(&lease.id) else {
                return;
            };
            e.probing = false;
            e.health.probe_passed(now).then(|| e.health.clone())
        };
        if let Some(h) = health {
            tracing::info!(account = %lease.id, "half-open probe committed; account ready");
            self.persist_health(&lease.id, &h);
        }
        self.hand_off(&lease.id);
    }

    /// Takes off the queues every waiter that can no longer be served: the sticky waiters of
    /// `id` (it became unusable), and the pool waiters none of whose accounts is usable.
    /// Each learns at once (`withdrawn`) instead of waiting out its queue time.
    pub(crate) fn withdraw_waiters(&self, id: &str) {
        let now = self.clock.now_ms();
        let mut withdrawn = Vec::new();
        {
            let mut guard = self.write();
            let inner: &mut Inner = &mut guard;
            let Some(waiters) = inner.accounts.waiters_mut(id) else {
                return;
            };
            withdrawn.extend(waiters.drain(..));
            let accounts = &inner.accounts;
            let mut kept = std::collections::VecDeque::with_capacity(inner.pool.len());
            for w in inner.pool.drain(..) {
                let usable = w.accepts.as_ref().is_some_and(|set| {
                    set.iter().any(|a| {
                        accounts
                            .get(a)
                            .is_some_and(|e| self.skip_reason(e, &w.model, now).is_none())
                    })
                });
                if usable {
                    kept.push_back(w);
                } else {
                    withdrawn.push(w);
                }
            }
            inner.pool = kept;
        }
        if !withdrawn.is_empty() {
            tracing::debug!(account = %id, waiters = withdrawn.len(), "waiters withdrawn");
        }
        drop(withdrawn);
    }

    /// AIMD: a burst rate limit halves the account's limit (never below 1).
    pub(crate) fn shrink_limit(e: &mut Entry) {
        e.limit = (e.limit / 2.0).max(1.0);
    }

    /// AIMD: a success grows the limit by 1/limit, up to the account's maximum.
    pub(crate) fn grow_limit(&self, e: &mut Entry) -> bool {
        let max = f64::from(
            e.record
                .max_concurrency
                .unwrap_or(self.settings().max_concurrency)
                .max(1),
        );
        let before = e.limit.floor();
        e.limit = (e.limit + 1.0 / e.limit).min(max);
        e.limit.floor() > before
    }

    /// The pool-wide queue now: how many wait, and for how long the oldest has (ms).
    pub fn pool_queue(&self) -> (usize, Option<u64>) {
        let now = self.clock.now_ms();
        let inner = self.read();
        (
            inner.pool.len(),
            inner.pool.front().map(|w| now.saturating_sub(w.since_ms)),
        )
    }

    /// Requests waiting now: pool-wide and on accounts.
    pub fn waiting(&self) -> (usize, usize) {
        let inner = self.read();
        (
            inner.pool.len(),
            inner.accounts.values().map(|e| e.waiters.len()).sum(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::health::Health;
    use crate::store::records::AccountRecord;
    use crate::upstream::quota::QuotaSnapshot;

    /// A row of priority `priority` whose windows are used `(primary, secondary)` percent, the
    /// primary resetting at `reset`.
    fn row(priority: i32, quota: Option<(f64, f64, u64)>) -> Hot {
        let mut e = Entry::new(AccountRecord::for_test("a"), Health::default(), None, 3.0);
        e.record.priority = priority;
        e.quota = quota.map(|(p, s, reset)| QuotaSnapshot {
            primary_used_percent: Some(p),
            secondary_used_percent: Some(s),
            primary_reset_at: Some(reset),
            ..QuotaSnapshot::default()
        });
        Hot::of(&e)
    }

    fn quota_aware(h: &Hot) -> Rank {
        rank(h, h.headroom)
    }

    #[test]
    fn a_rank_orders_by_priority_then_by_every_part_of_the_strategy_key() {
        // Priority comes first, whatever the key: the fullest account of a better priority
        // beats the emptiest of a worse one, at the ends of both ranges.
        let full = Some((100.0, 100.0, u64::MAX));
        assert!(quota_aware(&row(-1, full)) < quota_aware(&row(0, None)));
        assert!(quota_aware(&row(i32::MIN, full)) < quota_aware(&row(i32::MAX, None)));
        assert!(rank(&row(-1, None), u128::from(u64::MAX)) < rank(&row(0, None), 0));
        // Then the primary window's use, then the secondary's, then the sooner reset.
        let at = |p, s, reset| quota_aware(&row(0, Some((p, s, reset))));
        assert!(at(10.0, 100.0, u64::MAX) < at(10.01, 0.0, 1));
        assert!(at(10.0, 99.99, u64::MAX) < at(10.0, 100.0, 1));
        assert!(at(10.0, 10.0, 1) < at(10.0, 10.0, 2));
        // An unused primary window's reset says nothing: such accounts are equal.
        assert_eq!(at(0.0, 5.0, 1), at(0.0, 5.0, 9));
    }
}
