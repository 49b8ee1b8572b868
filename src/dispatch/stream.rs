//! The commit boundary of an attempt. Before the first event a client would render or act on,
//! events are held and any failure (a transport error, or a `response.failed`/`error` event
//! inside the 200) fails over invisibly. After it, events are forwarded as they arrive and
//! nothing is replayed; the terminal outcome is still judged, and a stream that dies without
//! one gets a synthetic `response.failed` (`upstream_stream_error`).
//!
//! Non-streaming clients never see a partial answer, so for them the commit is the terminal
//! event itself: a failure anywhere before it fails over.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;

use super::attempt::{Attempt, End, ms_between, ms_since};
use super::{ErrorReply, Frame, Mode};
use crate::base::json_scan::{Scan, Seen};
use crate::fleet::health::Class;
use crate::telemetry::records::{Outcome, TerminalSource, Usage};
use crate::upstream::event::Event;
use crate::upstream::failure::{Facts, Phase};
use crate::upstream::stream::{EventStream, Item, StreamError};

/// Events a batch has room for when it is started.
const BATCH_ROOM: usize = 16;

/// Events that carry nothing a client renders or acts on: held before the commit. Compared
/// as bytes; a type that is not UTF-8 reads as none, as [`Event::kind`] gives it.
pub fn is_precommit(kind: &[u8]) -> bool {
    matches!(
        kind,
        b"" | b"response.created"
            | b"response.in_progress"
            | b"response.queued"
            | b"codex.rate_limits"
            | b"response.output_item.added"
            | b"response.content_part.added"
            | b"response.reasoning_summary_part.added"
    ) || (!kind.is_ascii() && std::str::from_utf8(kind).is_err())
}

/// What the gateway reads from an event's `response` object: its id, tier and usage. A
/// `response.completed` carries the whole answer; this reads past the rest of it without
/// building any of it, and reads a field of an odd type as a tree would (`as_str`, `as_u64`).
#[derive(serde::Deserialize, Default, Debug, PartialEq)]
pub struct ResponsePeek {
    #[serde(default)]
    response: Option<ResponseFields>,
}

#[derive(serde::Deserialize, Debug, PartialEq)]
struct ResponseFields {
    #[serde(default)]
    id: Lenient<Text>,
    #[serde(default)]
    service_tier: Lenient<Text>,
    /// There, whatever its value (`null` included): a usage that is there counts.
    #[serde(default, deserialize_with = "present")]
    usage: Option<Lenient<UsageFields>>,
}

#[derive(serde::Deserialize, Default, Debug, PartialEq)]
struct UsageFields {
    #[serde(default)]
    input_tokens: Lenient<Count>,
    #[serde(default)]
    input_tokens_details: Lenient<CachedDetails>,
    #[serde(default)]
    output_tokens: Lenient<Count>,
    #[serde(default)]
    output_tokens_details: Lenient<ReasoningDetails>,
}

#[derive(serde::Deserialize, Default, Debug, PartialEq)]
struct CachedDetails {
    #[serde(default)]
    cached_tokens: Lenient<Count>,
}

#[derive(serde::Deserialize, Default, Debug, PartialEq)]
struct ReasoningDetails {
    #[serde(default)]
    reasoning_tokens: Lenient<Count>,
}

/// A text value; any other value is none.
#[derive(Default, Debug, PartialEq)]
struct Text(Option<String>);

/// A count; a value that is not a non-negative integer is 0.
#[derive(Default, Debug, PartialEq)]
struct Count(u64);

/// `T` read from a value of the shape it expects; a value of any other shape is read past and
/// gives `T::default()`.
#[derive(Default, Debug, PartialEq)]
struct Lenient<T>(T);

/// How `T` reads each kind of value; every kind it does not take is read past.
trait Shape: Default {
    fn of_str(_: &str) -> Self {
        Self::default()
    }
    fn of_u64(_: u64) -> Self {
        Self::default()
    }
    fn of_map<'de, A: serde::de::MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        skip_map(map).map(|()| Self::default())
    }
    /// An object, read by a scan as `of_map` reads it (`None`: left to that).
    fn scan_map(s: &mut Scan<'_>) -> Option<Self> {
        s.value().map(|()| Self::default())
    }
}

impl<T: Shape> Lenient<T> {
    /// Read by a scan as its reader reads it; `None` for what the scan leaves to that reader
    /// (a number other than a plain count, for one).
    fn scan(s: &mut Scan<'_>) -> Option<Self> {
        match s.peek()? {
            b'"' => Some(Lenient(T::of_str(&s.string()?.text()?))),
            b'0'..=b'9' => Some(Lenient(T::of_u64(s.count()?))),
            b'{' => T::scan_map(s).map(Lenient),
            b'-' => None,
            _ => s.value().map(|()| Lenient(T::default())),
        }
    }
}

impl ResponseFields {
    fn scan(s: &mut Scan<'_>) -> Option<ResponseFields> {
        let mut r = ResponseFields {
            id: Lenient::default(),
            service_tier: Lenient::default(),
            usage: None,
        };
        let mut seen = Seen::default();
        s.members(|s, key| match key {
            b"id" => seen.set(0, &mut r.id, Lenient::scan(s)),
            b"service_tier" => seen.set(1, &mut r.service_tier, Lenient::scan(s)),
            b"usage" => seen.set(2, &mut r.usage, Lenient::scan(s).map(Some)),
            _ => s.value(),
        })?;
        Some(r)
    }
}

fn skip_map<'de, A: serde::de::MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    use serde::de::IgnoredAny;
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

impl Shape for Text {
    fn of_str(v: &str) -> Self {
        Text(Some(v.to_string()))
    }
}

impl Shape for Count {
    fn of_u64(v: u64) -> Self {
        Count(v)
    }
}

/// A struct read by its derived reader when the value is a map.
macro_rules! map_shape {
    ($($t:ty => $scan:expr),*) => {$(
        impl Shape for $t {
            fn of_map<'de, A: serde::de::MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
                serde::Deserialize::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
            fn scan_map(s: &mut Scan<'_>) -> Option<Self> {
                $scan(s)
            }
        }
    )*};
}
map_shape!(
    UsageFields => UsageFields::scan_fields,
    CachedDetails => |s| Some(CachedDetails { cached_tokens: scan_one_count(s, "cached_tokens")? }),
    ReasoningDetails => |s| Some(ReasoningDetails {
        reasoning_tokens: scan_one_count(s, "reasoning_tokens")?,
    })
);

impl UsageFields {
    fn scan_fields(s: &mut Scan<'_>) -> Option<Self> {
        let mut u = UsageFields::default();
        let mut seen = Seen::default();
        s.members(|s, key| match key {
            b"input_tokens" => seen.set(0, &mut u.input_tokens, Lenient::scan(s)),
            b"input_tokens_details" => seen.set(1, &mut u.input_tokens_details, Lenient::scan(s)),
            b"output_tokens" => seen.set(2, &mut u.output_tokens, Lenient::scan(s)),
            b"output_tokens_details" => seen.set(3, &mut u.output_tokens_details, Lenient::scan(s)),
            _ => s.value(),
        })?;
        Some(u)
    }
}

/// A struct of one count, by the name of that count.
fn scan_one_count(s: &mut Scan<'_>, name: &str) -> Option<Lenient<Count>> {
    let mut count = Lenient::default();
    let mut seen = Seen::default();
    s.members(|s, key| match key {
        k if k == name.as_bytes() => seen.set(0, &mut count, Lenient::scan(s)),
        _ => s.value(),
    })?;
    Some(count)
}

impl<'de, T: Shape> serde::Deserialize<'de> for Lenient<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: Shape> serde::de::Visitor<'de> for Visit<T> {
            type Value = Lenient<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any value")
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Lenient(T::of_str(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Lenient(T::of_u64(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Lenient(
                    u64::try_from(v).map_or_else(|_| T::default(), T::of_u64),
                ))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Lenient(T::default()))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Lenient(T::default()))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Lenient(T::default()))
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(Lenient(T::default()))
            }
            fn visit_some<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Self::Value, D::Error> {
                d.deserialize_any(self)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Lenient(T::default()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                T::of_map(map).map(Lenient)
            }
        }
        d.deserialize_any(Visit(std::marker::PhantomData))
    }
}

/// A field that is there, whatever its value (`null` included).
fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Lenient<UsageFields>>, D::Error> {
    serde::Deserialize::deserialize(d).map(Some)
}

impl ResponsePeek {
    /// The peek of an event's data.
    pub fn of(ev: &Event) -> ResponsePeek {
        ResponsePeek::scan(ev.data())
            .unwrap_or_else(|| crate::base::raw_json::from_bytes(ev.data()).unwrap_or_default())
    }

    /// The same read by a scan of the text; `None` for what it leaves to the derived reader.
    fn scan(text: &[u8]) -> Option<ResponsePeek> {
        let mut response = None;
        let mut seen = Seen::default();
        let mut s = Scan::new(text);
        s.members(|s, key| match key {
            b"response" => {
                let fields = match s.peek()? {
                    b'n' => s.null().map(|()| None),
                    _ => ResponseFields::scan(s).map(Some),
                };
                seen.set(0, &mut response, fields)
            }
            _ => s.value(),
        })?;
        s.end()?;
        Some(ResponsePeek { response })
    }

    /// The same from an event already parsed.
    fn from_tree(event: &Value) -> ResponsePeek {
        serde::Deserialize::deserialize(event).unwrap_or_default()
    }

    pub fn id(&self) -> Option<String> {
        self.response.as_ref()?.id.0.0.clone()
    }

    /// The tier the answer says it ran on.
    fn service_tier(&self) -> Option<String> {
        self.response.as_ref()?.service_tier.0.0.clone()
    }

    /// Token counts as the backend reports them; a missing or non-integer count is 0.
    pub fn usage(&self) -> Option<Usage> {
        let u = &self.response.as_ref()?.usage.as_ref()?.0;
        Some(Usage {
            input_tokens: u.input_tokens.0.0,
            cached_tokens: u.input_tokens_details.0.cached_tokens.0.0,
            output_tokens: u.output_tokens.0.0,
            reasoning_tokens: u.output_tokens_details.0.reasoning_tokens.0.0,
        })
    }
}

/// The stream's position relative to the commit.
struct Boundary {
    /// Events held before the commit.
    held: Vec<Event>,
    held_bytes: usize,
    committed: bool,
    /// An event a client would render has arrived (for a JSON client, long before the commit
    /// at the terminal event): the first-output deadline no longer applies.
    output_seen: bool,
    response_id: Option<Arc<str>>,
    relay: Vec<(HeaderName, HeaderValue)>,
}

impl Boundary {
    fn phase(&self) -> Phase {
        if self.committed {
            Phase::MidStream
        } else {
            Phase::PreCommit
        }
    }
}

impl Attempt<'_> {
    /// Reads the answer's events to the end of the attempt.
    pub(super) async fn pump(
        &mut self,
        mut events: EventStream,
        relay: Vec<(HeaderName, HeaderValue)>,
    ) -> End {
        let streaming = self.ctx.mode == Mode::Stream;
        let mut b = Boundary {
            // The few events before the first output (created, in progress, the item added).
            held: Vec::with_capacity(4),
            held_bytes: 0,
            committed: false,
            output_seen: false,
            response_id: None,
            relay,
        };
        let first_output_deadline = self.d.config.first_output_timeout.map(|t| self.started + t);
        let idle = self.d.config.stream_idle_timeout;
        // One timer for the stream's waits, made at the first read that waits and moved only
        // when it fires with time left in the wait at hand (a wait never ends before the one
        // before it did). A timer made and dropped for each read was put into the timer wheel
        // and taken out again for every event of a streamed answer.
        let mut quiet: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        let mut batch = if streaming && self.ctx.sse_out {
            Batch::Sse(BytesMut::new())
        } else {
            Batch::Events(Vec::new())
        };
        loop {
            // After the commit, with the response's id known, the plain blocks that follow
            // need no look one by one: they go out as they came, up to the next block that
            // does (a terminal event's, or one of another form).
            let runs = b.committed && b.output_seen && b.response_id.is_some();
            if runs && let Batch::Sse(out) = &mut batch {
                events.take_plain_run(out);
            }
            let item = match events.buffered() {
                Some(item) => item,
                None => {
                    if !batch.is_empty() && !self.emit(batch.take()).await {
                        return self.client_gone(Some(200));
                    }
                    let shown = b.output_seen || b.committed;
                    let mut wait = idle;
                    // Once output is shown only the idle limit is left: no clock reading.
                    if !shown {
                        let now = std::time::Instant::now();
                        if let Some(deadline) = first_output_deadline {
                            wait = deadline.saturating_duration_since(now).min(idle);
                        }
                        let left = self.deadline().into_std().saturating_duration_since(now);
                        if left.is_zero() {
                            return self.abandon();
                        }
                        wait = wait.min(left);
                    }
                    let until = later(tokio::time::Instant::now(), wait);
                    let timer = match &mut quiet {
                        Some(timer) => {
                            if timer.deadline() > until {
                                timer.as_mut().reset(until);
                            }
                            timer
                        }
                        None => quiet.insert(Box::pin(tokio::time::sleep_until(until))),
                    };
                    let read = loop {
                        tokio::select! {
                            // The read first: one that is ready puts no timer in the wheel.
                            biased;
                            r = events.next_or_run(batch.run_room(runs)) => break Some(r),
                            _ = super::client_left(self.tx) => return self.client_gone(Some(200)),
                            _ = self.d.cut_off() => {
                                let committed = (b.committed && streaming).then(|| b.response_id.clone());
                                return with_batch(batch, self.shut_down(committed, Some(b.phase())));
                            }
                            () = timer.as_mut() => {
                                // Set for an earlier wait: this one has time left.
                                if tokio::time::Instant::now() < until {
                                    timer.as_mut().reset(until);
                                    continue;
                                }
                                break None;
                            }
                        }
                    };
                    match read {
                        None if !shown && tokio::time::Instant::now() >= self.deadline() => {
                            return self.abandon();
                        }
                        None if !b.output_seen
                            && first_output_deadline
                                .is_some_and(|d| std::time::Instant::now() >= d) =>
                        {
                            let why = format!(
                                "no output within {:?}",
                                self.d.config.first_output_timeout.unwrap_or_default()
                            );
                            return with_batch(batch, self.no_first_output(&b, why));
                        }
                        None => Err(format!("no upstream data for {}s", wait.as_secs())),
                        Some(None) => Err("stream closed before response.completed".to_string()),
                        Some(Some(r)) => r,
                    }
                }
            };
            let ev = match item {
                Ok(Item::Event(ev)) => ev,
                Ok(Item::Moved) => continue,
                Ok(Item::KeepAlive) => {
                    if b.committed && streaming {
                        let sent = (batch.is_empty() || self.emit(batch.take()).await)
                            && self.emit(Frame::KeepAlive).await;
                        if !sent {
                            return self.client_gone(Some(200));
                        }
                    }
                    continue;
                }
                Err(why) => return with_batch(batch, self.stream_broke(&b, why)),
            };
            if ev.is_terminal() {
                return with_batch(batch, self.terminal(ev, &mut b));
            }
            // Looked at only until the answer shows output and is committed.
            let precommit = (!b.output_seen || !b.committed) && is_precommit(ev.kind_bytes());
            if b.response_id.is_none() && ev.is_kind("response.created") {
                b.response_id = ev.response_id();
            }
            if !b.output_seen && !precommit {
                b.output_seen = true;
                // A half-open account's probe is judged by its first output, not its end.
                self.d.fleet.first_output(&mut self.lease);
            }
            if !streaming {
                continue; // a JSON client gets only the final response
            }
            if !b.committed
                && precommit
                && b.held_bytes + ev.len() <= self.d.config.max_precommit_bytes
            {
                b.held_bytes += ev.len();
                b.held.push(ev);
                continue;
            }
            if !b.committed {
                b.committed = true;
                let now = std::time::Instant::now();
                self.trace.ttft_ms = Some(ms_between(self.ctx.received, now));
                self.d.metrics.upstream_first_output(now - self.started);
                self.serve(b.response_id.clone());
                tracing::debug!(mode = ?self.ctx.mode, "commit");
                if !self
                    .emit(Frame::Head {
                        status: 200,
                        headers: sse_head(&b.relay),
                    })
                    .await
                {
                    return self.client_gone(Some(200));
                }
                // Room for what was received so far, held or not.
                let room = ev.sse_room() + events.pending();
                batch.start(std::mem::take(&mut b.held), room);
            }
            batch.push(ev);
        }
    }

    /// A terminal event: the end of a good answer, or a failure to judge.
    fn terminal(&mut self, ev: Event, b: &mut Boundary) -> End {
        let streaming = self.ctx.mode == Mode::Stream;
        let kind = ev.kind_bytes();
        let ok = matches!(kind, b"response.completed" | b"response.incomplete");
        // A good end needs only the peek (a JSON client is answered with the event's response
        // as it came); a failure is judged from the whole event, which then gives the peek too
        // (parsed once).
        let (peek, json) = if ok {
            (ResponsePeek::of(&ev), Value::Null)
        } else {
            let json = ev.json().unwrap_or(Value::Null);
            (ResponsePeek::from_tree(&json), json)
        };
        let facts = (!ok).then(|| Facts::from_event(b.phase(), &json).at(self.endpoint));
        let class = match &facts {
            Some(f) => self.verdict(f),
            None => Class::Success,
        };

        // A failure before anything was shown fails over, unless it is the caller's own; an
        // expired token is refreshed and the same account tried again.
        if let Some(f) = &facts
            && class != Class::Caller
            && (!b.committed || !streaming)
        {
            self.record_failure(class, f);
            self.token_refused = class == Class::AuthExpired;
            return End::Next;
        }

        let response_id = b.response_id.clone().or_else(|| peek.id().map(Arc::from));
        self.serve(response_id);
        let outcome = match (kind, class) {
            (b"response.completed", _) => Outcome::Success,
            (b"response.incomplete", _) => Outcome::Incomplete,
            (_, Class::Caller) => Outcome::CallerError,
            _ => Outcome::Failed,
        };
        match kind {
            b"response.completed" => {
                self.d
                    .fleet
                    .report(&self.lease.id, Class::Success, None, &self.ctx.model);
                self.trace.usage = peek.usage();
                self.trace.served_tier = peek.service_tier();
            }
            b"response.incomplete" => {
                self.trace.usage = peek.usage();
                self.trace.served_tier = peek.service_tier();
            }
            _ => {}
        }
        tracing::debug!(account = %self.lease.id, class = class.as_str(), outcome = outcome.as_str(), "attempt_result");
        self.record(
            class,
            Some(200),
            facts.as_ref().and_then(|f| f.phase),
            facts.as_ref().map(Facts::summary),
        );

        let status = 200;
        if !streaming {
            if class == Class::Caller
                && let Some(f) = &facts
            {
                let reply = ErrorReply::openai(
                    400,
                    "invalid_request_error",
                    f.error_code.as_deref().unwrap_or("invalid_request_error"),
                    f.message.clone().unwrap_or_default(),
                    serde_json::Map::new(),
                )
                .from_upstream();
                return End::Reply(reply, Outcome::CallerError);
            }
            let mut headers = b.relay.clone();
            headers.push((
                reqwest::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ));
            let body = response_text(&ev);
            return End::Done {
                outcome,
                status,
                tail: vec![Frame::Head { status, headers }, Frame::Body(body)],
                source: TerminalSource::Upstream,
            };
        }
        // Sized once: a head perhaps, and the events.
        let mut tail = Vec::with_capacity(2);
        let mut events = Vec::with_capacity(b.held.len() + 1);
        if !b.committed {
            // A terminal event arrived before anything else worth showing: commit with it.
            self.trace.ttft_ms = Some(ms_since(self.ctx.received));
            tail.push(Frame::Head {
                status,
                headers: sse_head(&b.relay),
            });
            events.append(&mut b.held);
        }
        events.push(ev);
        tail.push(Frame::Events(events));
        End::Done {
            outcome,
            status,
            tail,
            source: TerminalSource::Upstream,
        }
    }

    /// Nothing to show within the first-output timeout: the account is judged (transient) and
    /// the request fails over — at most `first_output_switches` times; after that the client
    /// gets the timeout.
    fn no_first_output(&mut self, b: &Boundary, why: StreamError) -> End {
        let facts = Facts::transport(b.phase(), why.clone()).at(self.endpoint);
        self.trace.first_output_timeouts += 1;
        if self.trace.first_output_timeouts <= self.d.config.first_output_switches {
            return self.fail_over(facts);
        }
        self.judge(&facts);
        let n = self.trace.first_output_timeouts;
        End::Reply(
            ErrorReply::openai(
                504,
                "server_error",
                "first_output_timeout",
                format!(
                    "{why} ({n} accounts tried; a request switches accounts for this at most {} times)",
                    self.d.config.first_output_switches
                ),
                serde_json::Map::new(),
            ),
            Outcome::FirstOutputTimeout,
        )
    }

    /// The upstream stream broke (EOF, reset, timeout, an oversized event).
    fn stream_broke(&mut self, b: &Boundary, why: StreamError) -> End {
        let facts = Facts::transport(b.phase(), why.clone()).at(self.endpoint);
        if !b.committed || self.ctx.mode != Mode::Stream {
            return self.fail_over(facts);
        }
        // After the commit nothing is replayed: the account is judged, the client is told.
        tracing::warn!(account = %self.lease.id, error = %why, "upstream stream broke after commit");
        let class = self.verdict(&facts);
        self.record(class, Some(200), facts.phase, Some(facts.summary()));
        let message = format!("the upstream stream broke before response.completed: {why}");
        End::Done {
            outcome: Outcome::StreamError,
            status: 200,
            tail: vec![Frame::Events(vec![Event::failed(
                b.response_id.as_deref(),
                "upstream_stream_error",
                &message,
            )])],
            source: TerminalSource::Synthetic,
        }
    }
}

/// The `response` object of a terminal event, as it was received (`null` when it has none).
fn response_text(ev: &Event) -> Bytes {
    #[derive(serde::Deserialize)]
    struct Terminal<'a> {
        #[serde(borrow)]
        response: Option<&'a serde_json::value::RawValue>,
    }
    match crate::base::raw_json::from_bytes::<Terminal<'_>>(ev.data()) {
        Ok(Terminal {
            response: Some(raw),
        }) => ev.data_bytes().slice_ref(raw.get().as_bytes()),
        _ => Bytes::from_static(b"null"),
    }
}

/// Events read after the commit and not yet sent: those of one read go out together.
enum Batch {
    Events(Vec<Event>),
    /// Their SSE blocks, for an edge that takes them so (`RequestCtx::sse_out`).
    Sse(BytesMut),
}

impl Batch {
    fn is_empty(&self) -> bool {
        match self {
            Batch::Events(v) => v.is_empty(),
            Batch::Sse(out) => out.is_empty(),
        }
    }

    /// Begins with the events held until the commit (the batch is empty then), with room
    /// for `more` bytes of SSE after them.
    fn start(&mut self, held: Vec<Event>, more: usize) {
        match self {
            Batch::Events(v) if v.is_empty() => *v = held,
            Batch::Events(v) => v.extend(held),
            Batch::Sse(out) => {
                out.reserve(held.iter().map(Event::sse_room).sum::<usize>() + more);
                held.iter().for_each(|e| e.write_sse(out));
            }
        }
    }

    fn push(&mut self, ev: Event) {
        match self {
            Batch::Events(v) => {
                if v.len() == v.capacity() {
                    // A read brings several events at a time: room for them at once, not by
                    // doubling from one.
                    v.reserve(BATCH_ROOM);
                }
                v.push(ev);
            }
            Batch::Sse(out) => ev.write_sse(out),
        }
    }

    /// Where plain blocks may be moved as they came, when `runs` and the edge takes SSE.
    fn run_room(&mut self, runs: bool) -> Option<&mut BytesMut> {
        match self {
            Batch::Sse(out) if runs => Some(out),
            _ => None,
        }
    }

    /// The frame of what is batched, leaving the batch empty.
    fn take(&mut self) -> Frame {
        match self {
            Batch::Events(v) => Frame::Events(std::mem::take(v)),
            Batch::Sse(out) => Frame::Sse(out.split().freeze()),
        }
    }
}

/// Puts events already read (and not yet sent) in front of the final frames.
fn with_batch(batch: Batch, end: End) -> End {
    match end {
        End::Done {
            outcome,
            status,
            mut tail,
            source,
        } if !batch.is_empty() => {
            match (batch, tail.first_mut()) {
                // The end's own events go out in the same frame, after them.
                (Batch::Events(mut batch), Some(Frame::Events(last))) => {
                    batch.append(last);
                    *last = batch;
                }
                (Batch::Sse(mut out), Some(first @ Frame::Events(_))) => {
                    if let Frame::Events(last) = first {
                        last.iter().for_each(|e| e.write_sse(&mut out));
                    }
                    *first = Frame::Sse(out.freeze());
                }
                (mut batch, _) => tail.insert(0, batch.take()),
            }
            End::Done {
                outcome,
                status,
                tail,
                source,
            }
        }
        other => other,
    }
}

/// `wait` after `now`, or a time too far to come when that cannot be told.
fn later(now: tokio::time::Instant, wait: std::time::Duration) -> tokio::time::Instant {
    now.checked_add(wait)
        .unwrap_or_else(|| now + std::time::Duration::from_secs(30 * 365 * 86_400))
}

/// The head of an SSE answer: the relayed upstream headers and the stream's own.
fn sse_head(relay: &[(HeaderName, HeaderValue)]) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = Vec::with_capacity(relay.len() + 2);
    headers.extend_from_slice(relay);
    headers.push((
        reqwest::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    ));
    headers.push((
        reqwest::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    ));
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The held types are told apart as bytes; a type that is not UTF-8 is held as a missing
    /// one is, and anything that shows output is not held.
    #[test]
    fn precommit_types_are_compared_as_bytes() {
        for held in [
            "",
            "response.created",
            "codex.rate_limits",
            "response.in_progress",
        ] {
            assert!(is_precommit(held.as_bytes()), "{held}");
        }
        assert!(is_precommit(b"response.\xffcreated"));
        for shown in [
            "response.output_text.delta",
            "response.created ",
            "Response.created",
        ] {
            assert!(!is_precommit(shown.as_bytes()), "{shown}");
        }
    }

    /// The peek of `data`, checked to read the same from the parsed event and to read what the
    /// tree itself says, field by field (`as_str`, `as_u64`).
    fn peek(data: &str) -> ResponsePeek {
        let ev = Event::from_data(Bytes::from(data.to_string()));
        let json = ev.json().unwrap_or(Value::Null);
        let (p, tree) = (ResponsePeek::of(&ev), ResponsePeek::from_tree(&json));
        let read: ResponsePeek =
            crate::base::raw_json::from_bytes(data.as_bytes()).unwrap_or_default();
        assert_eq!(p, read, "{data}");
        if let Some(scanned) = ResponsePeek::scan(data.as_bytes()) {
            assert_eq!(scanned, read, "{data}");
        }
        assert_eq!((p.id(), p.usage()), (tree.id(), tree.usage()), "{data}");
        let r = json.get("response").filter(|r| r.is_object());
        let text = |name: &str| r.and_then(|r| r[name].as_str()).map(str::to_string);
        let n = |v: &Value| v.as_u64().unwrap_or(0);
        let usage = r.and_then(|r| r.get("usage")).map(|u| Usage {
            input_tokens: n(&u["input_tokens"]),
            cached_tokens: n(&u["input_tokens_details"]["cached_tokens"]),
            output_tokens: n(&u["output_tokens"]),
            reasoning_tokens: n(&u["output_tokens_details"]["reasoning_tokens"]),
        });
        assert_eq!(
            (p.id(), p.service_tier(), p.usage()),
            (text("id"), text("service_tier"), usage),
            "{data}"
        );
        p
    }

    /// A JSON client gets the terminal event's response as it came, not rebuilt.
    #[test]
    fn a_json_answer_is_the_response_as_received() {
        let text = |data: &str| response_text(&Event::from_data(Bytes::from(data.to_string())));
        let response = "{ \"id\": \"resp_1\",\n  \"output\": [{\"text\": \"a \\\"b\\\" \\u00e9\"}], \"usage\": null }";
        let data = format!("{{\"type\":\"response.completed\",\"response\": {response} }}");
        assert_eq!(text(&data), response.as_bytes());
        for none in [
            r#"{"type":"response.completed"}"#,
            r#"{"response":null}"#,
            "not json",
        ] {
            assert_eq!(text(none), "null".as_bytes(), "{none}");
        }
    }

    #[test]
    fn the_peek_reads_id_and_usage_past_the_whole_answer() {
        let p = peek(
            r#"{"type":"response.completed","response":{"id":"resp_1","output":[{"type":"message",
            "content":[{"type":"output_text","text":"a \"quoted\" {answer}"}]}],"usage":{
            "input_tokens":12,"input_tokens_details":{"cached_tokens":8},"output_tokens":5,
            "output_tokens_details":{"reasoning_tokens":2},"total_tokens":17}}}"#,
        );
        assert_eq!(p.id().as_deref(), Some("resp_1"));
        assert_eq!(
            p.usage(),
            Some(Usage {
                input_tokens: 12,
                cached_tokens: 8,
                output_tokens: 5,
                reasoning_tokens: 2,
            })
        );
    }

    /// The scan reads the forms an answer comes in, and leaves what its derived reader refuses
    /// or reads otherwise to that reader.
    #[test]
    fn the_scan_reads_answers_and_leaves_odd_forms_to_the_reader() {
        for data in [
            r#"{"type":"response.completed","response":{"id":"resp_1","status":"completed","output":[],"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":0},"output_tokens":15,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":27}}}"#,
            r#"{"response":{"id":"r\"1","service_tier":["x"],"usage":null}}"#,
            r#"{"response":{"usage":{"input_tokens":"3","input_tokens_details":7,"x":[{}]}}}"#,
            r#"{"response":null,"sequence_number":-4.5e1}"#,
        ] {
            assert!(ResponsePeek::scan(data.as_bytes()).is_some(), "{data}");
            peek(data);
        }
        for data in [
            r#"{"response":{"id":"a"},"response":{"id":"b"}}"#,
            r#"{"response":{"id":"a","id":"b"}}"#,
            r#"{"response":{"usage":{"output_tokens":1,"output_tokens":2}}}"#,
            r#"{"response":{"usage":{"input_tokens_details":{"cached_tokens":1,"cached_tokens":1}}}}"#,
            r#"{"response":{"usage":{"input_tokens":-1}}}"#,
            r#"{"response":{"usage":{"input_tokens":2.5}}}"#,
            r#"{"response":{"usage":{"input_tokens":1e400}}}"#,
            r#"{"response":{"usage":{"input_tokens":18446744073709551616}}}"#,
            r#"{"response":{"id":"\udc00"}}"#,
            r#"[{"id":"a"}]"#,
            r#"{"response":{"id":"a"}} {}"#,
        ] {
            assert_eq!(ResponsePeek::scan(data.as_bytes()), None, "{data}");
            let ev = Event::from_data(Bytes::from(data.to_string()));
            let read: ResponsePeek =
                crate::base::raw_json::from_bytes(data.as_bytes()).unwrap_or_default();
            assert_eq!(ResponsePeek::of(&ev), read, "{data}");
        }
    }

    #[test]
    fn odd_fields_read_as_a_tree_would() {
        // A usage that is there but null or partial counts as zeros; a non-text id is none,
        // and does not hide the usage.
        let p = peek(r#"{"response":{"id":7,"usage":null}}"#);
        assert_eq!(p.id(), None);
        assert_eq!(p.usage(), Some(Usage::default()));
        let p = peek(r#"{"response":{"usage":{"input_tokens":3,"output_tokens":"x"}}}"#);
        assert_eq!(
            p.usage().map(|u| (u.input_tokens, u.output_tokens)),
            Some((3, 0))
        );
        // Counts that are negative, fractional, text or nested read as 0; details of the wrong
        // shape count nothing; an escaped id reads unescaped; a tier that is not text is none.
        let p = peek(
            r#"{"response":{"id":"r\"1","service_tier":["x"],"usage":{"input_tokens":-1,
            "output_tokens":2.5,"input_tokens_details":[1],"output_tokens_details":{
            "reasoning_tokens":4,"more":{"a":[1,{"b":null}]}},"total_tokens":{"x":1}}}}"#,
        );
        assert_eq!(p.id().as_deref(), Some("r\"1"));
        assert_eq!(
            p.usage(),
            Some(Usage {
                reasoning_tokens: 4,
                ..Usage::default()
            })
        );
        peek(r#"{"response":{"usage":7,"service_tier":"priority"}}"#);
        // Escaped names are names; what is read past may hold any text.
        let p = peek(
            r#"{"response":{"instructions":"}]\"{","\u0069d":"r2","tools":[{"a":"\"}"}],
            "usage":{"input_tokens":1}}}"#,
        );
        assert_eq!(p.id().as_deref(), Some("r2"));
        // No response object, or no JSON at all: nothing.
        for data in [
            r#"{"response":null}"#,
            r#"{"type":"response.completed"}"#,
            "not json",
        ] {
            let p = peek(data);
            assert_eq!((p.id(), p.usage()), (None, None), "{data}");
        }
    }
}
