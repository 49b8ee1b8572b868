//! Notifications to the operator: `[[notify]]` targets (a webhook, an ntfy topic, a Telegram
//! chat), each with the events it wants.
//!
//! Producers never wait: [`Notifier::emit`] puts an event on a bounded queue (`try_send`; a
//! full queue drops it and counts it). One task reads the queue, keeps the incidents open
//! (one message per incident: an account's dead login until it is back, a dry pool or model
//! until it serves again, low headroom until it rises above the target's threshold) and hands
//! each message to its targets, each delivery in its own task with its retries
//! ([`deliver`]).

pub mod deliver;
pub mod watch;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::base::duration::text as duration;
use crate::store::secrets::Secret;

/// Events a queue holds before new ones are dropped.
const QUEUE: usize = 1024;

/// What a target can be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// An account's login is dead (refresh refused, token revoked): it needs a new login.
    AccountNeedsLogin,
    /// The ChatGPT account behind a login was deactivated.
    AccountDeactivated,
    /// An account that needed a login (or was deactivated) serves again.
    AccountRecovered,
    /// A request found no usable account (for its model).
    PoolExhausted,
    /// The pool (or that model) serves again.
    PoolRecovered,
    /// The pool's remaining quota fell under the target's `headroom_below`.
    PoolHeadroomLow,
    /// A rate-limit reset credit was spent.
    CreditSpent,
    /// `switchyard notify test`: always delivered, whatever `events` says.
    Test,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::AccountNeedsLogin => "account_needs_login",
            EventKind::AccountDeactivated => "account_deactivated",
            EventKind::AccountRecovered => "account_recovered",
            EventKind::PoolExhausted => "pool_exhausted",
            EventKind::PoolRecovered => "pool_recovered",
            EventKind::PoolHeadroomLow => "pool_headroom_low",
            EventKind::CreditSpent => "credit_spent",
            EventKind::Test => "test",
        }
    }

    /// Every event a target gets when it names none.
    pub const ALL: [EventKind; 7] = [
        EventKind::AccountNeedsLogin,
        EventKind::AccountDeactivated,
        EventKind::AccountRecovered,
        EventKind::PoolExhausted,
        EventKind::PoolRecovered,
        EventKind::PoolHeadroomLow,
        EventKind::CreditSpent,
    ];
}

/// One thing to tell.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: EventKind,
    /// Unix ms.
    pub at_ms: u64,
    /// The account concerned (its email, else its id).
    pub account: Option<String>,
    /// The model concerned.
    pub model: Option<String>,
    /// One human sentence.
    pub message: String,
    /// More fields for the webhook's JSON (the headroom's percent, a spend's outcome, …).
    pub details: Map<String, Value>,
}

impl Event {
    pub fn new(kind: EventKind, at_ms: u64, message: impl Into<String>) -> Event {
        Event {
            kind,
            at_ms,
            account: None,
            model: None,
            message: message.into(),
            details: Map::new(),
        }
    }

    pub fn account(mut self, account: impl Into<String>) -> Event {
        self.account = Some(account.into());
        self
    }

    pub fn model(mut self, model: impl Into<String>) -> Event {
        self.model = Some(model.into()).filter(|m: &String| !m.is_empty());
        self
    }

    pub fn detail(mut self, key: &str, value: impl Into<Value>) -> Event {
        self.details.insert(key.into(), value.into());
        self
    }
}

/// Where a target's messages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// A JSON POST to `url`, signed with HMAC-SHA256 when `secret` is set.
    Webhook,
    /// A POST of the message to an ntfy topic URL (`url`), with `token` as bearer if set.
    Ntfy,
    /// A Telegram bot's `sendMessage` (`bot_token`, `chat_id`, `api_base`).
    Telegram,
}

impl TargetKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Webhook => "webhook",
            TargetKind::Ntfy => "ntfy",
            TargetKind::Telegram => "telegram",
        }
    }
}

pub const TELEGRAM_API: &str = "https://api.telegram.org";

/// One `[[notify]]` target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyTarget {
    /// How it is named in logs, `/metrics` and `notify test` (default: its kind and position,
    /// `webhook-1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub kind: TargetKind,
    /// The webhook's URL, or the ntfy topic's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The webhook's HMAC-SHA256 key: the body's signature goes in `x-switchyard-signature`
    /// (`sha256=<hex>`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "crate::store::secrets::masked"
    )]
    pub secret: Option<Secret>,
    /// The ntfy access token.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "crate::store::secrets::masked"
    )]
    pub token: Option<Secret>,
    /// The Telegram bot's token.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "crate::store::secrets::masked"
    )]
    pub bot_token: Option<Secret>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<String>,
    /// The Telegram Bot API's base URL.
    #[serde(default = "telegram_api")]
    pub api_base: String,
    /// The events it wants (default: all).
    #[serde(default = "all_events")]
    pub events: Vec<EventKind>,
    /// `pool_headroom_low` when the pool's remaining quota (the mean over its accounts of what
    /// is left of their fuller window) falls under this percent.
    #[serde(default = "default_headroom")]
    pub headroom_below: f64,
    /// Tries per message, and the wait before the second (doubling, at most 5 minutes).
    #[serde(default = "default_attempts")]
    pub attempts: u32,
    #[serde(default = "default_backoff", with = "duration")]
    pub backoff: Duration,
}

fn telegram_api() -> String {
    TELEGRAM_API.into()
}

fn all_events() -> Vec<EventKind> {
    EventKind::ALL.to_vec()
}

fn default_headroom() -> f64 {
    10.0
}

fn default_attempts() -> u32 {
    6
}

fn default_backoff() -> Duration {
    Duration::from_secs(2)
}

impl NotifyTarget {
    /// A target of this kind with the defaults.
    pub fn new(kind: TargetKind) -> NotifyTarget {
        NotifyTarget {
            name: None,
            kind,
            url: None,
            secret: None,
            token: None,
            bot_token: None,
            chat_id: None,
            api_base: telegram_api(),
            events: all_events(),
            headroom_below: default_headroom(),
            attempts: default_attempts(),
            backoff: default_backoff(),
        }
    }

    /// What is missing or wrong in it, for `config check`.
    pub fn problem(&self) -> Option<String> {
        let url_ok = |u: &str| u.starts_with("http://") || u.starts_with("https://");
        match self.kind {
            TargetKind::Webhook | TargetKind::Ntfy => match self.url.as_deref() {
                None => Some(format!("a {} target needs `url`", self.kind.as_str())),
                Some(u) if !url_ok(u) => Some(format!("`url` {u:?} is not an http(s) URL")),
                _ => None,
            },
            TargetKind::Telegram => {
                if self.bot_token.as_ref().is_none_or(Secret::is_empty) {
                    Some("a telegram target needs `bot_token`".into())
                } else if self.chat_id.as_deref().is_none_or(str::is_empty) {
                    Some("a telegram target needs `chat_id`".into())
                } else if !url_ok(&self.api_base) {
                    Some(format!(
                        "`api_base` {:?} is not an http(s) URL",
                        self.api_base
                    ))
                } else {
                    None
                }
            }
        }
        .or_else(|| (self.attempts == 0).then(|| "`attempts` must be at least 1".into()))
        .or_else(|| {
            (!(0.0..=100.0).contains(&self.headroom_below))
                .then(|| "`headroom_below` is a percent, 0 to 100".into())
        })
    }

    fn wants(&self, kind: EventKind) -> bool {
        kind == EventKind::Test || self.events.contains(&kind)
    }
}

/// `[[notify]]` as read: each target checked, names unique.
pub fn checked_targets<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<NotifyTarget>, D::Error> {
    let targets = Vec::<NotifyTarget>::deserialize(d)?;
    let names = names(&targets);
    for (i, t) in targets.iter().enumerate() {
        if let Some(p) = t.problem() {
            return Err(serde::de::Error::custom(format!(
                "target {}: {p}",
                names[i]
            )));
        }
        if names[..i].contains(&names[i]) {
            return Err(serde::de::Error::custom(format!(
                "two targets are named {:?}",
                names[i]
            )));
        }
    }
    Ok(targets)
}

/// What a sealed secret in the config starts with.
pub const SEALED: &str = "sealed:";
/// The associated data secrets of notification targets are sealed with.
const SEAL_AAD: &str = "notify";

/// Seals a secret for a target's `secret`, `token` or `bot_token`, as `switchyard notify
/// seal` prints it.
pub fn seal(sealer: &crate::store::secrets::Sealer, plain: &str) -> Result<String, String> {
    use base64::Engine;
    let sealed = sealer
        .seal(SEAL_AAD, plain.as_bytes())
        .map_err(|e| e.to_string())?;
    Ok(format!(
        "{SEALED}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sealed)
    ))
}

/// Opens the sealed secrets of the targets in place; a plain one stays as it is.
pub fn open_sealed(
    targets: &mut [NotifyTarget],
    sealer: &crate::store::secrets::Sealer,
) -> Result<(), String> {
    use base64::Engine;
    let names = names(targets);
    for (t, name) in targets.iter_mut().zip(names) {
        for (field, value) in [
            ("secret", &mut t.secret),
            ("token", &mut t.token),
            ("bot_token", &mut t.bot_token),
        ] {
            let Some(rest) = value.as_ref().and_then(|v| v.expose().strip_prefix(SEALED)) else {
                continue;
            };
            let opened = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(rest.trim())
                .ok()
                .and_then(|b| sealer.open(SEAL_AAD, &b))
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| {
                    format!(
                        "notify target {name}: `{field}` was not sealed with this state \
                         directory's key (seal it again with `switchyard notify seal`)"
                    )
                })?;
            *value = Some(Secret::new(opened));
        }
    }
    Ok(())
}

/// The targets' names: their own, else their kind and position among all (`webhook-1`).
pub fn names(targets: &[NotifyTarget]) -> Vec<String> {
    targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.name
                .clone()
                .unwrap_or_else(|| format!("{}-{}", t.kind.as_str(), i + 1))
        })
        .collect()
}

/// What is told of each delivery's end: `(target, "delivered" | "failed")`.
pub type OnOutcome = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// The producers' end. Cloning shares it; one made with [`Notifier::off`] drops everything.
#[derive(Clone, Default)]
pub struct Notifier {
    inner: Arc<NotifierInner>,
}

#[derive(Default)]
struct NotifierInner {
    tx: Option<mpsc::Sender<Event>>,
    dropped: AtomicU64,
    /// Models (`""`: any) for which a request found the pool dry, until one is served.
    dry: Mutex<HashSet<String>>,
    any_dry: AtomicBool,
}

impl Notifier {
    /// A notifier that tells no one.
    pub fn off() -> Notifier {
        Notifier::default()
    }

    /// Starts the task that delivers to `targets`; it ends when every notifier is dropped.
    pub fn start(targets: Vec<NotifyTarget>, on_outcome: OnOutcome) -> Notifier {
        if targets.is_empty() {
            return Notifier::off();
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(rx, targets, on_outcome));
        Notifier {
            inner: Arc::new(NotifierInner {
                tx: Some(tx),
                ..NotifierInner::default()
            }),
        }
    }

    pub fn enabled(&self) -> bool {
        self.inner.tx.is_some()
    }

    /// Queues an event; never waits (a full queue drops it, counted).
    pub fn emit(&self, event: Event) {
        if let Some(tx) = &self.inner.tx
            && tx.try_send(event).is_err()
        {
            self.inner.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    fn dry(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.inner.dry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request for `model` found no usable account: told once until it is served again.
    pub fn pool_dry(&self, model: &str, at_ms: u64, why: &str) {
        if !self.enabled() || !self.dry().insert(model.to_string()) {
            return;
        }
        self.inner.any_dry.store(true, Ordering::SeqCst);
        self.emit(
            Event::new(
                EventKind::PoolExhausted,
                at_ms,
                format!("No account in the pool can serve {model} now: {why}."),
            )
            .model(model),
        );
    }

    /// A request for `model` was served: the dry pool (if it was) is back. Cheap when
    /// nothing is dry.
    pub fn served(&self, model: &str, at_ms: u64) {
        if !self.inner.any_dry.load(Ordering::SeqCst) {
            return;
        }
        let back = {
            let mut dry = self.dry();
            let back = dry.remove(model);
            if dry.is_empty() {
                self.inner.any_dry.store(false, Ordering::SeqCst);
            }
            back
        };
        if back {
            self.emit(
                Event::new(
                    EventKind::PoolRecovered,
                    at_ms,
                    format!("The pool serves {model} again."),
                )
                .model(model),
            );
        }
    }

    /// The models for which the pool was found dry and has not served since.
    pub fn dry_models(&self) -> Vec<String> {
        if !self.inner.any_dry.load(Ordering::SeqCst) {
            return Vec::new();
        }
        self.dry().iter().cloned().collect()
    }
}

/// The incidents open, by key, and each target's low-headroom state.
#[derive(Default)]
struct Incidents {
    open: HashSet<String>,
    headroom_low: HashMap<usize, bool>,
}

impl Incidents {
    /// The targets (by index) this event goes to, after the incident rules.
    fn route(&mut self, event: &Event, targets: &[NotifyTarget]) -> Vec<usize> {
        let subject = event
            .account
            .clone()
            .or_else(|| event.model.clone())
            .unwrap_or_default();
        let opens = |open: &mut HashSet<String>, key: String| open.insert(key);
        let new = match event.kind {
            EventKind::AccountNeedsLogin | EventKind::AccountDeactivated => {
                opens(&mut self.open, format!("reauth/{subject}"))
            }
            EventKind::AccountRecovered => self.open.remove(&format!("reauth/{subject}")),
            EventKind::PoolExhausted => opens(&mut self.open, format!("dry/{subject}")),
            EventKind::PoolRecovered => self.open.remove(&format!("dry/{subject}")),
            EventKind::CreditSpent | EventKind::Test | EventKind::PoolHeadroomLow => true,
        };
        if !new {
            return Vec::new();
        }
        let percent = event
            .details
            .get("headroom_percent")
            .and_then(Value::as_f64);
        (0..targets.len())
            .filter(|&i| targets[i].wants(event.kind))
            .filter(|&i| match (event.kind, percent) {
                (EventKind::PoolHeadroomLow, Some(p)) => {
                    let low = p < targets[i].headroom_below;
                    let was = self.headroom_low.insert(i, low).unwrap_or(false);
                    low && !was
                }
                (EventKind::PoolHeadroomLow, None) => false,
                _ => true,
            })
            .collect()
    }
}

async fn run(mut rx: mpsc::Receiver<Event>, targets: Vec<NotifyTarget>, on_outcome: OnOutcome) {
    let names = names(&targets);
    let client = deliver::client();
    let mut incidents = Incidents::default();
    while let Some(event) = rx.recv().await {
        for i in incidents.route(&event, &targets) {
            let (target, name) = (targets[i].clone(), names[i].clone());
            let (client, event, on_outcome) = (client.clone(), event.clone(), on_outcome.clone());
            tokio::spawn(async move {
                let outcome = deliver::with_retries(&client, &target, &name, &event).await;
                on_outcome(
                    &name,
                    if outcome.is_ok() {
                        "delivered"
                    } else {
                        "failed"
                    },
                );
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn webhook(events: Vec<EventKind>) -> NotifyTarget {
        NotifyTarget {
            url: Some("http://127.0.0.1:9/hook".into()),
            events,
            ..NotifyTarget::new(TargetKind::Webhook)
        }
    }

    #[test]
    fn one_message_per_incident() {
        let targets = vec![webhook(EventKind::ALL.to_vec())];
        let mut inc = Incidents::default();
        let dead = Event::new(EventKind::AccountNeedsLogin, 1, "x").account("a@x");
        assert_eq!(inc.route(&dead, &targets), vec![0]);
        assert!(inc.route(&dead, &targets).is_empty(), "the same incident");
        let back = Event::new(EventKind::AccountRecovered, 2, "y").account("a@x");
        assert_eq!(inc.route(&back, &targets), vec![0]);
        assert!(inc.route(&back, &targets).is_empty(), "nothing was open");
        assert_eq!(inc.route(&dead, &targets), vec![0], "a new incident");
        let other = Event::new(EventKind::AccountRecovered, 3, "z").account("b@x");
        assert!(inc.route(&other, &targets).is_empty());
    }

    #[test]
    fn a_target_gets_only_the_events_it_names() {
        let targets = vec![
            webhook(vec![EventKind::CreditSpent]),
            webhook(EventKind::ALL.to_vec()),
        ];
        let mut inc = Incidents::default();
        let dry = Event::new(EventKind::PoolExhausted, 1, "x").model("gpt-5.5");
        assert_eq!(inc.route(&dry, &targets), vec![1]);
        let spent = Event::new(EventKind::CreditSpent, 1, "x");
        assert_eq!(inc.route(&spent, &targets), vec![0, 1]);
        let test = Event::new(EventKind::Test, 1, "x");
        assert_eq!(inc.route(&test, &targets), vec![0, 1]);
    }

    #[test]
    fn low_headroom_is_told_once_per_target_until_it_rises_again() {
        let mut high = webhook(EventKind::ALL.to_vec());
        high.headroom_below = 50.0;
        let targets = vec![webhook(EventKind::ALL.to_vec()), high];
        let mut inc = Incidents::default();
        let at =
            |p: f64| Event::new(EventKind::PoolHeadroomLow, 1, "h").detail("headroom_percent", p);
        assert_eq!(inc.route(&at(40.0), &targets), vec![1]);
        assert_eq!(inc.route(&at(5.0), &targets), vec![0]);
        assert!(inc.route(&at(4.0), &targets).is_empty());
        assert!(inc.route(&at(60.0), &targets).is_empty());
        assert_eq!(inc.route(&at(8.0), &targets), vec![0, 1]);
    }

    #[test]
    fn targets_are_checked_and_named() {
        let mut t = NotifyTarget::new(TargetKind::Webhook);
        assert!(t.problem().unwrap().contains("needs `url`"));
        t.url = Some("ftp://x".into());
        assert!(t.problem().unwrap().contains("not an http(s) URL"));
        t.url = Some("http://127.0.0.1:1/x".into());
        assert_eq!(t.problem(), None);
        let tg = NotifyTarget::new(TargetKind::Telegram);
        assert!(tg.problem().unwrap().contains("bot_token"));
        let named = NotifyTarget {
            name: Some("ops".into()),
            ..t.clone()
        };
        assert_eq!(names(&[t, named]), vec!["webhook-1", "ops"]);
        let parsed: NotifyTarget =
            toml::from_str("kind = \"ntfy\"\nurl = \"http://x/t\"\nevents = [\"pool_exhausted\"]")
                .unwrap();
        assert_eq!(parsed.events, vec![EventKind::PoolExhausted]);
        assert!(toml::from_str::<NotifyTarget>("kind = \"email\"").is_err());
    }
}
