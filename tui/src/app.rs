//! The console's application state (what is selected and open, over the domain state) and its
//! event loop: one `select!` over keys, feed events, action results and a tick, then one draw.

use std::time::{Duration, Instant};

use crossterm::event::KeyEvent;
use switchyard_admin::AdminClient;
use switchyard_admin::wire::{self, AccountAction};
use tokio::sync::mpsc;

use crate::conn::{self, ConnEvent};
use crate::input::{self, Intent};
use crate::state::{Link, State};

/// The panes, in tab order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pane {
    #[default]
    Accounts,
    Affinity,
    Queues,
    Transport,
    Requests,
    Keys,
}

impl Pane {
    pub const ALL: [Pane; 6] = [
        Pane::Accounts,
        Pane::Affinity,
        Pane::Queues,
        Pane::Transport,
        Pane::Requests,
        Pane::Keys,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Pane::Accounts => "Accounts",
            Pane::Affinity => "Affinity",
            Pane::Queues => "Queues",
            Pane::Transport => "Transport",
            Pane::Requests => "Requests",
            Pane::Keys => "Keys",
        }
    }

    fn index(self) -> usize {
        Pane::ALL.iter().position(|p| *p == self).unwrap_or(0)
    }
}

/// How the console speaks of an operator action on an account.
pub trait ActionWords {
    /// How the confirmation asks, `"Disable"` in "Disable sim-acct-1?".
    fn verb(self) -> &'static str;
    /// What the footer says once it is done.
    fn done(self) -> &'static str;
}

impl ActionWords for AccountAction {
    fn verb(self) -> &'static str {
        match self {
            AccountAction::Enable => "Enable",
            AccountAction::Disable => "Disable",
            AccountAction::Drain => "Drain (no new sessions)",
            AccountAction::Undrain => "End draining of",
            AccountAction::ClearCooldown => "Clear the cooldown of",
            AccountAction::Refresh => "Refresh the token of",
            AccountAction::Probe => "Probe the quota of",
        }
    }

    fn done(self) -> &'static str {
        match self {
            AccountAction::Enable => "enabled",
            AccountAction::Disable => "disabled",
            AccountAction::Drain => "draining",
            AccountAction::Undrain => "no longer draining",
            AccountAction::ClearCooldown => "cooldown cleared",
            AccountAction::Refresh => "token refreshed",
            AccountAction::Probe => "quota probed",
        }
    }
}

/// An action waiting for the operator's yes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub action: AccountAction,
    /// The account's id.
    pub account: String,
    pub label: String,
}

/// What covers the panes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Overlay {
    #[default]
    None,
    Help,
    /// One request's full record, by id.
    Detail(String),
    Confirm(Pending),
    /// The error report: being fetched, its text (scrolled down by this many lines), or why
    /// it could not be had.
    Report(ReportView),
}

/// The error report as the overlay shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportView {
    Loading,
    Text { text: String, scroll: u16 },
    Failed(String),
}

/// What the event loop must do after a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Quit,
    Send(Pending),
    /// Fetch the error report.
    Report,
}

/// A line in the footer: the last action's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flash {
    pub text: String,
    pub error: bool,
}

#[derive(Debug, Default)]
pub struct App {
    pub state: State,
    pub focus: Pane,
    /// The selected account's id (the first one when `None`).
    pub account: Option<String>,
    /// The selected request's id; `None` follows the newest.
    pub request: Option<String>,
    /// The selected client key's id (the first one when `None`).
    pub client_key: Option<String>,
    pub overlay: Overlay,
    pub flash: Option<Flash>,
    /// Where the console is connected (`admin.sock` path or URL), for the header.
    pub target: String,
}

impl App {
    pub fn new(target: String) -> App {
        App {
            target,
            ..App::default()
        }
    }

    /// The selected account, if there are accounts.
    pub fn selected_account(&self) -> Option<&wire::Account> {
        let accounts = &self.state.accounts;
        self.account
            .as_ref()
            .and_then(|id| accounts.iter().find(|a| &a.id == id))
            .or_else(|| accounts.first())
    }

    pub fn selected_account_index(&self) -> usize {
        let accounts = &self.state.accounts;
        self.account
            .as_ref()
            .and_then(|id| accounts.iter().position(|a| &a.id == id))
            .unwrap_or(0)
    }

    /// Index of the selected client key in `state.keys`.
    pub fn selected_key_index(&self) -> usize {
        let keys = &self.state.keys;
        self.client_key
            .as_ref()
            .and_then(|id| keys.iter().position(|k| &k.id == id))
            .unwrap_or(0)
    }

    /// Index of the selected request in `state.requests` (newest first).
    pub fn selected_request_index(&self) -> usize {
        self.request
            .as_ref()
            .and_then(|id| self.state.requests.iter().position(|f| &f.record.id == id))
            .unwrap_or(0)
    }

    pub fn on_key(&mut self, key: KeyEvent) -> Option<Command> {
        let intent = input::intent(key)?;
        if intent == Intent::Quit {
            return Some(Command::Quit);
        }
        match &self.overlay {
            Overlay::Confirm(pending) => {
                match intent {
                    Intent::Yes => {
                        let pending = pending.clone();
                        self.overlay = Overlay::None;
                        return Some(Command::Send(pending));
                    }
                    Intent::No | Intent::ToggleDrain | Intent::Back => {
                        self.overlay = Overlay::None;
                        self.flash = Some(Flash {
                            text: "cancelled".into(),
                            error: false,
                        });
                    }
                    _ => {}
                }
                return None;
            }
            Overlay::Help | Overlay::Detail(_) => {
                if matches!(intent, Intent::Back | Intent::Help | Intent::Open) {
                    self.overlay = Overlay::None;
                }
                return None;
            }
            Overlay::Report(view) => {
                match (intent, view) {
                    (Intent::Back | Intent::Report | Intent::Open, _) => {
                        self.overlay = Overlay::None
                    }
                    (
                        Intent::Up | Intent::Down | Intent::Top,
                        ReportView::Text { text, scroll },
                    ) => {
                        let last = text.lines().count().saturating_sub(1) as u16;
                        let scroll = match intent {
                            Intent::Up => scroll.saturating_sub(1),
                            Intent::Down => (*scroll + 1).min(last),
                            _ => 0,
                        };
                        let text = text.clone();
                        self.overlay = Overlay::Report(ReportView::Text { text, scroll });
                    }
                    _ => {}
                }
                return None;
            }
            Overlay::None => {}
        }
        match intent {
            Intent::Help => self.overlay = Overlay::Help,
            Intent::Up => self.step(-1),
            Intent::Down => self.step(1),
            Intent::Top => self.step(i64::MIN / 2),
            Intent::Bottom => self.step(i64::MAX / 2),
            Intent::NextPane => self.focus = Pane::ALL[(self.focus.index() + 1) % Pane::ALL.len()],
            Intent::PrevPane => {
                self.focus = Pane::ALL[(self.focus.index() + Pane::ALL.len() - 1) % Pane::ALL.len()]
            }
            Intent::Pane(p) => self.focus = p,
            Intent::Open => {
                if self.focus == Pane::Requests
                    && let Some(f) = self.state.requests.get(self.selected_request_index())
                {
                    self.overlay = Overlay::Detail(f.record.id.clone());
                }
            }
            Intent::Act(action) => self.ask(action),
            Intent::ToggleDrain => {
                let draining = self.selected_account().is_some_and(|a| a.draining);
                self.ask(if draining {
                    AccountAction::Undrain
                } else {
                    AccountAction::Drain
                });
            }
            Intent::Report => {
                self.overlay = Overlay::Report(ReportView::Loading);
                return Some(Command::Report);
            }
            Intent::Back => self.flash = None,
            Intent::Quit | Intent::Yes | Intent::No => {}
        }
        None
    }

    fn ask(&mut self, action: AccountAction) {
        match self.selected_account() {
            Some(a) => {
                self.overlay = Overlay::Confirm(Pending {
                    action,
                    account: a.id.clone(),
                    label: a.label.clone(),
                })
            }
            None => {
                self.flash = Some(Flash {
                    text: "no account to act on".into(),
                    error: true,
                })
            }
        }
    }

    /// Moves the selection of the focused list (requests or keys when their pane has the
    /// focus, accounts otherwise).
    fn step(&mut self, by: i64) {
        let clamp = |i: usize, len: usize| -> usize {
            let j = (i as i64).saturating_add(by).max(0) as usize;
            j.min(len.saturating_sub(1))
        };
        if self.focus == Pane::Requests {
            let len = self.state.requests.len();
            let j = clamp(self.selected_request_index(), len);
            self.request = (j > 0)
                .then(|| self.state.requests.get(j).map(|f| f.record.id.clone()))
                .flatten();
        } else if self.focus == Pane::Keys {
            let len = self.state.keys.len();
            let j = clamp(self.selected_key_index(), len);
            self.client_key = self.state.keys.get(j).map(|k| k.id.clone());
        } else {
            let len = self.state.accounts.len();
            let j = clamp(self.selected_account_index(), len);
            self.account = self.state.accounts.get(j).map(|a| a.id.clone());
        }
    }

    pub fn on_conn(&mut self, event: ConnEvent) {
        match event {
            ConnEvent::Connecting => {
                if !matches!(self.state.link, Link::Reconnecting { .. }) {
                    self.state.link = Link::Connecting;
                }
            }
            ConnEvent::Connected => self.state.link = Link::Connected,
            ConnEvent::Reconnecting { delay, reason } => {
                self.state.link = Link::Reconnecting {
                    in_s: delay.as_secs_f64().ceil() as u64,
                    reason,
                };
            }
            ConnEvent::Refused(msg) => self.state.link = Link::Refused(msg),
            ConnEvent::Message(msg) => self.state.apply(*msg),
        }
    }

    pub fn on_result(&mut self, pending: &Pending, result: Result<wire::Account, String>) {
        self.flash = Some(match result {
            Ok(a) => Flash {
                text: format!(
                    "{}: {} · state {}",
                    pending.label,
                    pending.action.done(),
                    a.state
                ),
                error: false,
            },
            Err(e) => Flash {
                text: format!(
                    "{} failed for {}: {e}",
                    pending.action.segment(),
                    pending.label
                ),
                error: true,
            },
        });
    }
}

impl App {
    /// The report arrived (or could not be had): shown if its overlay is still open.
    pub fn on_report(&mut self, result: Result<switchyard_admin::report::Report, String>) {
        if !matches!(self.overlay, Overlay::Report(_)) {
            return;
        }
        self.overlay = Overlay::Report(match result {
            Ok(r) => ReportView::Text {
                text: switchyard_admin::report::render_text(&r),
                scroll: 0,
            },
            Err(e) => ReportView::Failed(e),
        });
    }
}

/// Why the console stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("terminal: {0}")]
    Terminal(#[from] std::io::Error),
    #[error("{0}")]
    Refused(String),
}

/// Runs the console until the operator quits.
pub async fn run(client: AdminClient) -> Result<(), Error> {
    let mut term = crate::term::Term::enter()?;
    let mut app = App::new(client.target().to_string());
    let (conn_tx, mut conn_rx) = mpsc::channel(256);
    let feed = tokio::spawn(conn::run(client.clone(), conn_tx));
    let mut keys = crate::term::keys();
    let (done_tx, mut done_rx) = mpsc::channel::<(Pending, Result<wire::Account, String>)>(16);
    let (report_tx, mut report_rx) =
        mpsc::channel::<Result<switchyard_admin::report::Report, String>>(4);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut reconnect_at: Option<Instant> = None;
    let outcome = loop {
        term.draw(&app)?;
        tokio::select! {
            key = keys.recv() => match key {
                Some(Ok(crate::term::Input::Resize)) => {}
                Some(Ok(crate::term::Input::Key(key))) => match app.on_key(key) {
                    Some(Command::Quit) => break Ok(()),
                    Some(Command::Send(pending)) => {
                        app.flash = Some(crate::app::Flash {
                            text: format!("{}: sending {}…", pending.label, pending.action.segment()),
                            error: false,
                        });
                        let client = client.clone();
                        let done = done_tx.clone();
                        tokio::spawn(async move {
                            let result = client
                                .account_action(&pending.account, pending.action)
                                .await
                                .map_err(|e| e.to_string());
                            let _ = done.send((pending, result)).await;
                        });
                    }
                    Some(Command::Report) => {
                        let client = client.clone();
                        let done = report_tx.clone();
                        tokio::spawn(async move {
                            let result = client
                                .report(&[], None)
                                .await
                                .map_err(|e| e.to_string());
                            let _ = done.send(result).await;
                        });
                    }
                    None => {}
                },
                Some(Err(e)) => break Err(Error::Terminal(e)),
                None => break Ok(()),
            },
            Some(event) = conn_rx.recv() => {
                if let ConnEvent::Refused(msg) = &event {
                    break Err(Error::Refused(msg.clone()));
                }
                if let ConnEvent::Reconnecting { delay, .. } = &event {
                    reconnect_at = Some(Instant::now() + *delay);
                }
                app.on_conn(event);
            },
            Some((pending, result)) = done_rx.recv() => app.on_result(&pending, result),
            Some(result) = report_rx.recv() => app.on_report(result),
            _ = tick.tick() => {
                if let (Some(at), Link::Reconnecting { in_s, .. }) = (reconnect_at, &mut app.state.link) {
                    *in_s = at.saturating_duration_since(Instant::now()).as_secs_f64().ceil() as u64;
                }
            }
        }
    };
    feed.abort();
    drop(term);
    outcome
}
