//! Keys to intents. The console is keyboard only; what an intent does depends on what is open
//! (see `App::on_key`).

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use switchyard_admin::wire::AccountAction;

use crate::app::Pane;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    Quit,
    Help,
    /// Esc: close what is open.
    Back,
    Up,
    Down,
    Top,
    Bottom,
    NextPane,
    PrevPane,
    Pane(Pane),
    /// Enter: open the selected request.
    Open,
    /// An action on the selected account (asks for confirmation).
    Act(AccountAction),
    /// `n`: drain the selected account, or end its draining.
    ToggleDrain,
    /// `R`: the error report of the last 20 and 60 minutes.
    Report,
    Yes,
    No,
}

/// The intent of a key press, if it has one.
pub fn intent(key: KeyEvent) -> Option<Intent> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    if key.modifiers.contains(KeyModifiers::CONTROL) {
        return matches!(key.code, KeyCode::Char('c') | KeyCode::Char('d')).then_some(Intent::Quit);
    }
    Some(match key.code {
        KeyCode::Char('q') => Intent::Quit,
        KeyCode::Char('?') | KeyCode::F(1) => Intent::Help,
        KeyCode::Esc => Intent::Back,
        KeyCode::Up | KeyCode::Char('k') => Intent::Up,
        KeyCode::Down | KeyCode::Char('j') => Intent::Down,
        KeyCode::Home | KeyCode::Char('g') => Intent::Top,
        KeyCode::End | KeyCode::Char('G') => Intent::Bottom,
        KeyCode::Tab | KeyCode::Right | KeyCode::Char('l') => Intent::NextPane,
        KeyCode::BackTab | KeyCode::Left | KeyCode::Char('h') => Intent::PrevPane,
        KeyCode::Char(c @ '1'..='6') => Intent::Pane(Pane::ALL[(c as u8 - b'1') as usize]),
        KeyCode::Enter => Intent::Open,
        KeyCode::Char('e') => Intent::Act(AccountAction::Enable),
        KeyCode::Char('d') => Intent::Act(AccountAction::Disable),
        KeyCode::Char('n') => Intent::ToggleDrain,
        KeyCode::Char('c') => Intent::Act(AccountAction::ClearCooldown),
        KeyCode::Char('r') => Intent::Act(AccountAction::Refresh),
        KeyCode::Char('p') => Intent::Act(AccountAction::Probe),
        KeyCode::Char('R') => Intent::Report,
        KeyCode::Char('y') | KeyCode::Char('Y') => Intent::Yes,
        KeyCode::Char('N') => Intent::No,
        _ => return None,
    })
}

/// The keys, for the help screen: (keys, what they do).
pub const HELP: &[(&str, &str)] = &[
    ("↑ ↓  j k", "select an account / a request / a key"),
    ("g G", "first / last"),
    ("Tab ← →", "next / previous pane"),
    (
        "1-6",
        "accounts, affinity, queues, transport, requests, keys",
    ),
    ("Enter", "open the selected request's record"),
    ("e / d", "enable / disable the selected account"),
    ("n", "drain the account (no new sessions) / end draining"),
    ("c", "clear its cooldown"),
    ("r", "refresh its token now"),
    ("p", "probe its quota now"),
    ("R", "the error report of the last 20 and 60 minutes"),
    ("y / n", "confirm / cancel an action"),
    ("Esc", "close"),
    ("?", "this help"),
    ("q  Ctrl-C", "quit"),
];
