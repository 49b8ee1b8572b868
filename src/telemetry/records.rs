//! Request records: one per `/v1` request, with its attempt chain, in typed form. The newest are
//! kept in memory for the admin API and the console (converted to their wire shape at that
//! edge); all are offered to the store as telemetry in the store's own shape (dropped, and
//! counted, when the writer is behind) and pruned by age.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::base::clock::SharedClock;
use crate::base::names::named;
use crate::fleet::affinity::Decision;
use crate::fleet::health::Class;
use crate::fleet::scheduler::{QueueKind, QueueOutcome, SkipReason};
use crate::store::Store;
use crate::store::records::{
    AttemptRow, AttemptRowOut, CreditRow, CreditRowOut, MapSeq, QueueRow, QueueRowOut, RequestRow,
    RequestRowOut, SkipRow, SkipRowOut, UsageRow,
};
use crate::store::schema::Table;
use crate::store::writer::Mutation;
use crate::upstream::Transport;
use crate::upstream::failure::Phase;

/// Records kept in memory.
pub const RING: usize = 2000;

named! {
    /// How a request ended, for its client.
    pub enum Outcome {
        Success => "success",
        /// `response.incomplete`: forwarded, neutral for the account.
        Incomplete => "incomplete",
        /// `response.failed` after the commit.
        Failed => "failed",
        /// The upstream stream broke after the commit.
        StreamError => "stream_error",
        CallerError => "caller_error",
        /// Every usable account cools on quota.
        QuotaExhausted => "quota_exhausted",
        NoAccount => "no_account",
        ModelNotFound => "model_not_found",
        ClientCancelled => "client_cancelled",
        /// The client stopped reading its answer for the write timeout: cut, slot freed.
        ClientStalled => "client_stalled",
        /// Every candidate stayed busy for the whole wait.
        PoolBusy => "pool_busy",
        PreviousResponseNotFound => "previous_response_not_found",
        /// Every account it was tried on refused the prompt for policy.
        PolicyRefused => "policy_refused",
        /// No account answered within the request's deadline.
        DeadlineExceeded => "deadline_exceeded",
        /// Accounts showed nothing within the first-output timeout, as often as a request may
        /// switch for it.
        FirstOutputTimeout => "first_output_timeout",
        /// Cut by shutdown when its grace period ran out.
        ShuttingDown => "shutting_down",
        /// Refused by its key's policy before scheduling (the error code of each).
        KeyRevoked => "key_revoked",
        KeyExpired => "key_expired",
        ModelNotAllowed => "model_not_allowed",
        TierNotAllowed => "tier_not_allowed",
        KeyRateLimited => "key_rate_limited",
        KeyBudgetExhausted => "key_budget_exhausted",
        KeyConcurrencyExceeded => "key_concurrency_exceeded",
    }
}

named! {
    /// Where the answer that ended a request came from: its last event (`response.completed`,
    /// `response.failed`, …) or its error answer.
    pub enum TerminalSource {
        /// The backend's own: forwarded, or reframed for a JSON client without changing what
        /// it says (a completed response, a caller error, a policy refusal).
        Upstream => "upstream",
        /// Made by the gateway: a `response.failed` it wrote (`upstream_stream_error`,
        /// `server_shutting_down`), an exhaustion or deadline answer, a key's refusal.
        Synthetic => "synthetic",
        /// Nothing ended it for the client: it left or stopped reading first.
        Nothing => "none",
    }
}

impl Outcome {
    /// Whether its client got an error (a client that left or stopped reading got nothing).
    pub fn is_error(self) -> bool {
        !matches!(
            self,
            Outcome::Success
                | Outcome::Incomplete
                | Outcome::ClientCancelled
                | Outcome::ClientStalled
        )
    }
}

/// Token counts of a response, as the upstream reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
}

impl Usage {
    /// The stored shape.
    fn row(self) -> UsageRow {
        UsageRow {
            input_tokens: self.input_tokens,
            cached_tokens: self.cached_tokens,
            output_tokens: self.output_tokens,
            reasoning_tokens: self.reasoning_tokens,
        }
    }
}

/// One attempt of a request on one account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    /// The account's `chatgpt_account_id`.
    pub account: String,
    pub class: Class,
    pub status: Option<u16>,
    pub phase: Option<Phase>,
    pub ms: u64,
    pub error: Option<String>,
    /// The operator's rule that judged it.
    pub rule: Option<String>,
}

/// A request's wait for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRecord {
    pub kind: QueueKind,
    pub outcome: QueueOutcome,
    /// Total wait of the request (it may have waited twice: sticky, then pool).
    pub wait_ms: u64,
}

/// One `/v1` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// Time-ordered key: unix ms << 16 | a sequence number. The id is derived from it.
    pub key: u64,
    pub started_ms: u64,
    /// The client key's name.
    pub key_name: String,
    pub model: String,
    /// A request's path is one the gateway names (no copy); a stored one is read back.
    pub path: Cow<'static, str>,
    pub stream: bool,
    /// A turn of a downstream WebSocket connection.
    pub ws: bool,
    pub outcome: Outcome,
    /// The HTTP status the client got (200 for a stream that later failed).
    pub status: u16,
    /// The `chatgpt_account_id` that served it.
    pub account: Option<String>,
    pub attempts: Vec<AttemptRecord>,
    pub ttft_ms: Option<u64>,
    pub duration_ms: u64,
    pub usage: Option<Usage>,
    /// A short hash of the session key.
    pub session: Option<String>,
    /// The candidates in the order they were to be tried (`chatgpt_account_id`s, shared
    /// with the pool's entries: a plan can name 32).
    pub candidate_pool: Vec<Arc<str>>,
    pub skipped: Vec<(String, SkipReason)>,
    pub affinity: Decision,
    pub queue: Option<QueueRecord>,
    pub transport: Transport,
    pub ws_connect_ms: Option<u64>,
    /// Where its terminal answer came from; `None` in records written before it was kept.
    pub terminal_source: Option<TerminalSource>,
    /// The `service_tier` asked for, and the one the answer claimed (a claim: it does not
    /// prove what ran).
    pub service_tier: Option<String>,
    pub served_tier: Option<String>,
    /// The reset-credit spend this request's need made.
    pub credit: Option<CreditSpend>,
}

/// How a spend ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreditSpend {
    pub account: String,
    pub redeem_id: String,
    /// `reset`, `already_redeemed`, `nothing_to_reset`, `no_credit`, `failed`, or `unsettled`
    /// (no answer yet: it is asked again before any other spend).
    pub outcome: String,
    pub windows_reset: u64,
    pub error: Option<String>,
}

impl CreditSpend {
    /// The account's windows were reset (by this call or, before, by the same redeem id).
    pub fn reset(&self) -> bool {
        matches!(self.outcome.as_str(), "reset" | "already_redeemed")
    }
}

impl RequestRecord {
    pub fn id(&self) -> String {
        RequestLog::id_of(self.key)
    }

    /// The stored shape, borrowed from the record: what is written (its bytes are
    /// [`RequestRecord::to_row`]'s).
    pub fn row_out(&self) -> RequestRowOut<'_, AttemptRecord, (String, SkipReason)> {
        RequestRowOut {
            started_ms: self.started_ms,
            key_name: &self.key_name,
            model: &self.model,
            path: &self.path,
            stream: self.stream,
            ws: self.ws,
            outcome: self.outcome.as_str(),
            status: self.status,
            account: self.account.as_deref(),
            attempts: MapSeq {
                items: &self.attempts,
                each: |a| AttemptRowOut {
                    account: &a.account,
                    class: a.class.as_str(),
                    status: a.status,
                    phase: a.phase.map(Phase::as_str),
                    ms: a.ms,
                    error: a.error.as_deref(),
                },
            },
            ttft_ms: self.ttft_ms,
            duration_ms: self.duration_ms,
            usage: self.usage.map(Usage::row),
            session: self.session.as_deref(),
            candidate_pool: MapSeq {
                items: &self.candidate_pool,
                each: |id| &**id,
            },
            skipped: MapSeq {
                items: &self.skipped,
                each: |(account, reason)| SkipRowOut {
                    account,
                    reason: reason.as_str(),
                },
            },
            affinity: match self.affinity {
                Decision::Rebound(_) => Cow::Owned(self.affinity.label()),
                other => Cow::Borrowed(other.kind()),
            },
            queue: self.queue.map(|q| QueueRowOut {
                queue: q.kind.as_str(),
                outcome: q.outcome.as_str(),
                wait_ms: q.wait_ms,
            }),
            transport: self.transport.as_str(),
            ws_connect_ms: self.ws_connect_ms,
            terminal_source: self.terminal_source.map(TerminalSource::as_str),
            attempt_rules: MapSeq {
                items: if self.attempts.iter().any(|a| a.rule.is_some()) {
                    &self.attempts
                } else {
                    &[]
                },
                each: |a| a.rule.as_deref(),
            },
            service_tier: self.service_tier.as_deref(),
            served_tier: self.served_tier.as_deref(),
            credit: self.credit.as_ref().map(|c| CreditRowOut {
                account: &c.account,
                redeem_id: &c.redeem_id,
                outcome: &c.outcome,
                windows_reset: c.windows_reset,
            }),
        }
    }

    /// The stored shape.
    pub fn to_row(&self) -> RequestRow {
        RequestRow {
            started_ms: self.started_ms,
            key_name: self.key_name.clone(),
            model: self.model.clone(),
            path: self.path.to_string(),
            stream: self.stream,
            ws: self.ws,
            outcome: self.outcome.as_str().into(),
            status: self.status,
            account: self.account.clone(),
            attempts: self
                .attempts
                .iter()
                .map(|a| AttemptRow {
                    account: a.account.clone(),
                    class: a.class.as_str().into(),
                    status: a.status,
                    phase: a.phase.map(|p| p.as_str().into()),
                    ms: a.ms,
                    error: a.error.clone(),
                })
                .collect(),
            ttft_ms: self.ttft_ms,
            duration_ms: self.duration_ms,
            usage: self.usage.map(Usage::row),
            session: self.session.clone(),
            candidate_pool: self
                .candidate_pool
                .iter()
                .map(|id| id.to_string())
                .collect(),
            skipped: self
                .skipped
                .iter()
                .map(|(account, reason)| SkipRow {
                    account: account.clone(),
                    reason: reason.as_str().into(),
                })
                .collect(),
            affinity: self.affinity.label(),
            queue: self.queue.map(|q| QueueRow {
                queue: q.kind.as_str().into(),
                outcome: q.outcome.as_str().into(),
                wait_ms: q.wait_ms,
            }),
            transport: self.transport.as_str().into(),
            ws_connect_ms: self.ws_connect_ms,
            terminal_source: self.terminal_source.map(|t| t.as_str().into()),
            attempt_rules: if self.attempts.iter().any(|a| a.rule.is_some()) {
                self.attempts.iter().map(|a| a.rule.clone()).collect()
            } else {
                Vec::new()
            },
            service_tier: self.service_tier.clone(),
            served_tier: self.served_tier.clone(),
            credit: self.credit.as_ref().map(|c| CreditRow {
                account: c.account.clone(),
                redeem_id: c.redeem_id.clone(),
                outcome: c.outcome.clone(),
                windows_reset: c.windows_reset,
            }),
        }
    }

    /// Reads the stored shape; a name this binary does not know is an error.
    pub fn from_row(key: u64, r: RequestRow) -> Result<RequestRecord, String> {
        fn name<T>(what: &str, n: &str, parse: impl Fn(&str) -> Option<T>) -> Result<T, String> {
            parse(n).ok_or_else(|| format!("{what} `{n}`"))
        }
        let mut rules = r.attempt_rules.into_iter();
        let attempts = r
            .attempts
            .into_iter()
            .map(|a| {
                Ok(AttemptRecord {
                    rule: rules.next().flatten(),
                    class: name("class", &a.class, Class::from_name)?,
                    phase: a
                        .phase
                        .map(|p| name("phase", &p, Phase::from_name))
                        .transpose()?,
                    account: a.account,
                    status: a.status,
                    ms: a.ms,
                    error: a.error,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let skipped = r
            .skipped
            .into_iter()
            .map(|s| {
                Ok((
                    s.account,
                    name("skip reason", &s.reason, SkipReason::from_name)?,
                ))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let queue = r
            .queue
            .map(|q| {
                Ok::<_, String>(QueueRecord {
                    kind: name("queue", &q.queue, QueueKind::from_name)?,
                    outcome: name("queue outcome", &q.outcome, QueueOutcome::from_name)?,
                    wait_ms: q.wait_ms,
                })
            })
            .transpose()?;
        Ok(RequestRecord {
            key,
            started_ms: r.started_ms,
            key_name: r.key_name,
            model: r.model,
            path: Cow::Owned(r.path),
            stream: r.stream,
            ws: r.ws,
            outcome: name("outcome", &r.outcome, Outcome::from_name)?,
            status: r.status,
            account: r.account,
            attempts,
            ttft_ms: r.ttft_ms,
            duration_ms: r.duration_ms,
            usage: r.usage.map(|u| Usage {
                input_tokens: u.input_tokens,
                cached_tokens: u.cached_tokens,
                output_tokens: u.output_tokens,
                reasoning_tokens: u.reasoning_tokens,
            }),
            session: r.session,
            candidate_pool: r.candidate_pool.into_iter().map(Arc::from).collect(),
            skipped,
            affinity: name("affinity", &r.affinity, Decision::from_label)?,
            queue,
            transport: name("transport", &r.transport, Transport::from_name)?,
            ws_connect_ms: r.ws_connect_ms,
            terminal_source: r
                .terminal_source
                .map(|t| name("terminal source", &t, TerminalSource::from_name))
                .transpose()?,
            service_tier: r.service_tier,
            served_tier: r.served_tier,
            credit: r.credit.map(|c| CreditSpend {
                account: c.account,
                redeem_id: c.redeem_id,
                outcome: c.outcome,
                windows_reset: c.windows_reset,
                error: None,
            }),
        })
    }
}

/// A record as the ring keeps it: its stored row, one allocation where the record is a dozen
/// or more, read back into a record when asked for. A record's parts were freed when it left
/// the ring, 2,000 answers later, from memory no cache held any more: measured at 32
/// connections, a few per cent of the gateway's CPU.
#[derive(Clone)]
struct Kept {
    key: u64,
    row: Arc<[u8]>,
    /// The one part of a record its row does not keep.
    credit_error: Option<String>,
}

impl Kept {
    fn of(r: &RequestRecord, row: &[u8]) -> Kept {
        Kept {
            key: r.key,
            row: Arc::from(row),
            credit_error: r.credit.as_ref().and_then(|c| c.error.clone()),
        }
    }

    fn record(&self) -> Option<RequestRecord> {
        let row = crate::store::codec::decode::<RequestRow>(&self.row).ok()?;
        let mut r = RequestRecord::from_row(self.key, row).ok()?;
        if let Some(c) = &mut r.credit {
            c.error.clone_from(&self.credit_error);
        }
        Some(r)
    }
}

/// The request log. Cloning shares it.
#[derive(Clone)]
pub struct RequestLog {
    ring: Arc<Mutex<VecDeque<Kept>>>,
    store: Store,
    clock: SharedClock,
    seq: Arc<AtomicU64>,
    /// Records pushed since start (for "what is new since").
    pushed: Arc<AtomicU64>,
    /// Error rates over the last 20 and 60 minutes.
    windows: Arc<Mutex<super::windows::ErrorWindows>>,
}

impl RequestLog {
    /// Loads the newest records from the store.
    pub fn load(store: Store, clock: SharedClock) -> RequestLog {
        let mut loaded = Vec::with_capacity(RING);
        match store.recent_requests(RING) {
            Ok(rows) => {
                for (key, row) in rows.into_iter().rev() {
                    match RequestRecord::from_row(key, row) {
                        Ok(r) => loaded.push(r),
                        Err(e) => store.note_undecodable("requests", &format!("{key:016x}"), &e),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read stored request records"),
        }
        // The error-rate windows carry on from the stored records across a restart.
        let mut windows = super::windows::ErrorWindows::default();
        let mut by_end: Vec<&RequestRecord> = loaded.iter().collect();
        by_end.sort_by_key(|r| super::windows::finished_ms(r));
        for r in by_end {
            windows.add(super::windows::finished_ms(r), r);
        }
        let ring = loaded
            .into_iter()
            .map(|r| Kept::of(&r, &r.row_out().encode()))
            .collect();
        RequestLog {
            ring: Arc::new(Mutex::new(ring)),
            store,
            clock,
            seq: Arc::new(AtomicU64::new(0)),
            pushed: Arc::new(AtomicU64::new(0)),
            windows: Arc::new(Mutex::new(windows)),
        }
    }

    /// The error-rate windows now (20 and 60 minutes).
    pub fn windows(&self) -> Vec<super::windows::Window> {
        let now = self.clock.now_ms();
        let w = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        super::windows::WINDOWS
            .iter()
            .map(|m| w.window(now, *m))
            .collect()
    }

    /// A new, time-ordered record key (also the record's id).
    pub fn next_key(&self) -> u64 {
        let ms = self.clock.now_ms();
        (ms << 16) | (self.seq.fetch_add(1, Ordering::Relaxed) & 0xffff)
    }

    pub fn id_of(key: u64) -> String {
        format!("req_{key:016x}")
    }

    /// Keeps a finished record: in memory at once, in the store when the writer has room.
    pub fn push(&self, record: RequestRecord) {
        let row = record.row_out().encode();
        let kept = Kept::of(&record, &row);
        self.store
            .try_write(vec![Store::request_put(record.key, row)]);
        self.windows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(self.clock.now_ms(), &record);
        // Dropped here, on the thread that made it and while its memory is warm.
        drop(record);
        let old = {
            let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
            let old = (ring.len() >= RING).then(|| ring.pop_front()).flatten();
            ring.push_back(kept);
            self.pushed.fetch_add(1, Ordering::Relaxed);
            old
        };
        drop(old);
    }

    /// Records pushed since start.
    pub fn total(&self) -> u64 {
        self.pushed.load(Ordering::Relaxed)
    }

    /// The records pushed after the first `seen` (newest first, at most `limit` and the ring),
    /// and how many had been pushed then: one moment, read under the ring's lock (a record is
    /// counted while its push holds it).
    pub fn newer_than(&self, seen: u64, limit: usize) -> (Vec<RequestRecord>, u64) {
        let (kept, total) = {
            let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
            let total = self.total();
            let new = usize::try_from(total.saturating_sub(seen)).unwrap_or(usize::MAX);
            let kept: Vec<Kept> = ring.iter().rev().take(new.min(limit)).cloned().collect();
            (kept, total)
        };
        // Read back outside the lock: pushes do not wait for it.
        (kept.iter().filter_map(Kept::record).collect(), total)
    }

    /// The newest `limit` records, newest first.
    pub fn recent(&self, limit: usize) -> Vec<RequestRecord> {
        let kept: Vec<Kept> = {
            let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
            ring.iter().rev().take(limit).cloned().collect()
        };
        kept.iter().filter_map(Kept::record).collect()
    }

    /// Deletes stored records older than `days`.
    pub fn prune(&self, days: u32) {
        let cutoff_ms = self
            .clock
            .now_ms()
            .saturating_sub(u64::from(days) * 24 * 3600 * 1000);
        self.store.try_write(vec![Mutation::DeleteIntBelow(
            Table::Requests,
            cutoff_ms << 16,
        )]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::affinity::Rebound;

    fn record() -> RequestRecord {
        RequestRecord {
            key: (1_767_225_600_123 << 16) | 7,
            started_ms: 1_767_225_600_123,
            key_name: "alice".into(),
            model: "gpt-5.5".into(),
            path: "/v1/responses".into(),
            stream: true,
            ws: false,
            outcome: Outcome::Success,
            status: 200,
            account: Some("acc-2".into()),
            attempts: vec![
                AttemptRecord {
                    account: "acc-1".into(),
                    class: Class::Quota,
                    status: Some(429),
                    phase: Some(Phase::PreCommit),
                    ms: 3,
                    error: Some("429 usage_limit_reached".into()),
                    rule: Some("quota-text".into()),
                },
                AttemptRecord {
                    account: "acc-2".into(),
                    class: Class::Success,
                    status: Some(200),
                    phase: None,
                    ms: 40,
                    error: None,
                    rule: None,
                },
            ],
            ttft_ms: Some(12),
            duration_ms: 45,
            usage: Some(Usage {
                input_tokens: 10,
                cached_tokens: 4,
                output_tokens: 5,
                reasoning_tokens: 1,
            }),
            session: Some("abcdef012345".into()),
            candidate_pool: vec!["acc-1".into(), "acc-2".into()],
            skipped: vec![("acc-3".into(), SkipReason::Probing)],
            affinity: Decision::Rebound(Rebound::Failed(Class::Quota)),
            queue: Some(QueueRecord {
                kind: QueueKind::Account,
                outcome: QueueOutcome::Acquired,
                wait_ms: 8,
            }),
            transport: Transport::HttpWsBudgetExhausted,
            ws_connect_ms: None,
            terminal_source: Some(TerminalSource::Upstream),
            service_tier: None,
            served_tier: None,
            credit: None,
        }
    }

    #[test]
    fn a_record_is_stored_by_name_and_read_back() {
        let r = record();
        let row = r.to_row();
        assert_eq!(row.outcome, "success");
        assert_eq!(row.affinity, "rebound(quota)");
        assert_eq!(row.skipped[0].reason, "half_open_probe");
        assert_eq!(row.terminal_source.as_deref(), Some("upstream"));
        assert_eq!(RequestRecord::from_row(r.key, row).unwrap(), r);
        assert_eq!(r.id(), "req_019b76daa87b0007");
    }

    /// What is written is the row, byte for byte: for a record with every part there (rules
    /// and a credit spend included), with none, with a plain affinity, and with numbers and
    /// strings whose lengths take varints of several bytes (postcard's encoding of the owned
    /// row is the reference).
    #[test]
    fn the_borrowed_row_is_written_as_the_row() {
        use crate::store::codec::encode;
        let full = record();
        let mut bare = record();
        bare.attempts.clear();
        bare.skipped.clear();
        bare.candidate_pool.clear();
        (bare.account, bare.session, bare.usage, bare.queue) = (None, None, None, None);
        bare.terminal_source = None;
        bare.affinity = Decision::Reused;
        let mut ruled = record();
        ruled.attempts[0].rule = Some("quota-words".into());
        ruled.service_tier = Some("priority".into());
        ruled.served_tier = Some("default".into());
        ruled.credit = Some(CreditSpend {
            account: "acc-1".into(),
            redeem_id: "r-1".into(),
            outcome: "reset".into(),
            windows_reset: 2,
            error: None,
        });
        let mut wide = record();
        wide.started_ms = u64::MAX >> 16;
        wide.key = u64::MAX;
        wide.key_name = "k".repeat(127);
        wide.model = "m".repeat(128);
        wide.path = "/v1/responses/compact".into();
        wide.status = u16::MAX;
        wide.attempts[0].error = Some("e".repeat(70_000));
        wide.attempts[0].ms = 0;
        wide.attempts[1].status = None;
        wide.attempts[1].ms = u64::MAX;
        wide.ttft_ms = Some(0);
        wide.duration_ms = 16_384;
        wide.usage = Some(Usage {
            input_tokens: u64::MAX,
            cached_tokens: 127,
            output_tokens: 128,
            reasoning_tokens: 1 << 35,
        });
        wide.candidate_pool = (0..300).map(|i| format!("acc-{i}").into()).collect();
        wide.ws = true;
        wide.ws_connect_ms = Some(300);
        wide.queue = Some(QueueRecord {
            kind: QueueKind::Pool,
            outcome: QueueOutcome::Timeout,
            wait_ms: u64::MAX - 1,
        });
        wide.credit = Some(CreditSpend {
            account: "é".repeat(100),
            redeem_id: String::new(),
            outcome: "failed".into(),
            windows_reset: 0,
            error: None,
        });
        for r in [full, bare, ruled, wide] {
            let row = encode(&r.to_row()).unwrap();
            assert_eq!(r.row_out().encode(), row);
            let back: RequestRow = crate::store::codec::decode(&row).unwrap();
            assert_eq!(RequestRecord::from_row(r.key, back).unwrap(), r);
        }
    }

    #[test]
    fn a_name_this_binary_does_not_know_is_an_error() {
        let mut row = record().to_row();
        row.outcome = "teleported".into();
        let e = RequestRecord::from_row(1, row).unwrap_err();
        assert!(e.contains("teleported"), "{e}");
        let mut row = record().to_row();
        row.terminal_source = Some("carrier_pigeon".into());
        let e = RequestRecord::from_row(1, row).unwrap_err();
        assert!(e.contains("terminal source `carrier_pigeon`"), "{e}");
    }

    #[test]
    fn a_record_written_before_the_terminal_source_reads_without_one() {
        let mut row = record().to_row();
        row.terminal_source = None;
        let r = RequestRecord::from_row(1, row).unwrap();
        assert_eq!(r.terminal_source, None);
    }

    /// The ring keeps a record's row, not the record: what it gives back is what was pushed,
    /// the credit spend's error (which the row does not keep) included, newest first, and no
    /// more than [`RING`].
    #[tokio::test]
    async fn the_ring_gives_back_each_record_as_pushed() {
        let store = Store::open_in_memory().unwrap();
        let clock: SharedClock = std::sync::Arc::new(crate::base::clock::ManualClock::new(0));
        let log = RequestLog::load(store, clock);
        let mut spent = record();
        spent.key += 1;
        spent.credit = Some(CreditSpend {
            account: "acc-1".into(),
            redeem_id: "r-1".into(),
            outcome: "failed".into(),
            windows_reset: 0,
            error: Some("timed out".into()),
        });
        log.push(record());
        log.push(spent.clone());
        assert_eq!(log.recent(10), vec![spent.clone(), record()]);
        assert_eq!(log.newer_than(1, 10), (vec![spent.clone()], 2));
        for i in 0..RING as u64 {
            let mut r = record();
            r.key += 2 + i;
            log.push(r);
        }
        let kept = log.recent(usize::MAX);
        assert_eq!(kept.len(), RING);
        assert_eq!(kept[RING - 1].key, record().key + 2, "the oldest two left");
    }

    #[tokio::test]
    async fn records_that_do_not_read_back_are_counted_and_the_rest_load() {
        let store = Store::open_in_memory().unwrap();
        let clock: SharedClock = std::sync::Arc::new(crate::base::clock::ManualClock::new(0));
        let log = RequestLog::load(store.clone(), clock.clone());
        log.push(record());
        let mut bad = record();
        bad.key += 1;
        let mut row = bad.to_row();
        row.transport = "pigeon".into();
        store.try_write(vec![Store::request_put(
            bad.key,
            crate::store::codec::encode(&row).unwrap(),
        )]);
        store.flush().await.unwrap();
        let again = RequestLog::load(store.clone(), clock);
        assert_eq!(again.recent(10), vec![record()]);
        assert_eq!(store.undecodable_rows(), 1);
    }
}
