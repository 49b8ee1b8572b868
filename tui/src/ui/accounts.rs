//! Accounts: state with reason and time left, slots, waiting, quota gauges with reset
//! countdowns, success rate and p50 time to first token over the last 5 minutes, last error.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table, TableState};
use switchyard_admin::wire::{Account, AccountState, ErrorRates, Login};

use super::{bar, colored, human_ms, human_secs, pane_block, state_color};
use crate::app::{App, Pane};
use crate::state::stats::parse_ms;

/// `cooling quota 41m`, `half-open`, `needs re-login`, `disabled`, `ready`, plus `draining`.
pub fn state_text(a: &Account) -> String {
    let mut s = match &a.state {
        AccountState::Cooling => {
            let mut s = "cooling".to_string();
            if let Some(r) = &a.reason {
                s.push(' ');
                s.push_str(r.as_str());
            }
            if let Some(left) = a.cooldown_remaining_s {
                s.push(' ');
                s.push_str(&human_secs(left));
            }
            s
        }
        AccountState::HalfOpen => "half-open".to_string(),
        AccountState::NeedsReauth => "needs re-login".to_string(),
        other => other.to_string(),
    };
    if a.draining {
        s.push_str(" draining");
    }
    s
}

/// [`state_text`] in at most 17 characters, for the narrow table: a cooling account by its
/// reason in a short word and its countdown (`quota 41m`, `rate 4m`, `edge 20s`), so the
/// reason and the countdown are never cut.
pub fn state_short(a: &Account) -> String {
    let mut s = match &a.state {
        AccountState::Cooling => {
            let reason = a.reason.as_ref().map(|r| match r.as_str() {
                "rate_limited" => "rate",
                "edge_challenge" => "edge",
                "auth_expired" => "auth",
                "auth_dead" => "dead",
                "model_unsupported" => "model",
                other => other,
            });
            let mut s = reason.unwrap_or("cooling").to_string();
            if let Some(left) = a.cooldown_remaining_s {
                s.push(' ');
                s.push_str(&human_secs(left));
            }
            s
        }
        AccountState::HalfOpen => "half-open".to_string(),
        AccountState::NeedsReauth => "re-login".to_string(),
        other => other.to_string(),
    };
    if a.draining {
        s.push_str(" drain");
    }
    s
}

/// The width from which the table has every column at its full width.
const WIDE: u16 = 157;
/// The State column's width there: a longer state is said in [`state_short`]'s words.
const WIDE_STATE: usize = 28;

/// A rate as a whole percentage, `–` without anything to count.
pub fn pct(rate: Option<f64>) -> String {
    rate.map_or("–".to_string(), |r| format!("{:.0}%", r * 100.0))
}

/// Upstream error rates of the 20- and 60-minute windows: `12%/4%`.
fn upstream_rates(rates: &[ErrorRates]) -> String {
    let of = |m: u64| {
        rates
            .iter()
            .find(|r| r.window_minutes == m)
            .and_then(|r| r.upstream_error_rate)
    };
    format!("{}/{}", pct(of(20)), pct(of(60)))
}

/// `client errors 20m 1% · 60m 0% · upstream errors 20m 12% · 60m 4%`.
pub fn rates_text(rates: &[ErrorRates]) -> String {
    let part = |label: &str, f: fn(&ErrorRates) -> Option<f64>| {
        let windows: Vec<String> = rates
            .iter()
            .map(|r| format!("{}m {}", r.window_minutes, pct(f(r))))
            .collect();
        format!("{label} {}", windows.join(" · "))
    };
    format!(
        "{} · {}",
        part("client errors", |r| r.client_error_rate),
        part("upstream errors", |r| r.upstream_error_rate)
    )
}

/// Both rates of each window, short: `20m 1%/3% · 60m 1%/4% client/upstream`.
pub fn windows_short(rates: &[ErrorRates]) -> String {
    let w: Vec<String> = rates
        .iter()
        .map(|r| {
            format!(
                "{}m {}/{}",
                r.window_minutes,
                pct(r.client_error_rate),
                pct(r.upstream_error_rate)
            )
        })
        .collect();
    format!("{} client/upstream", w.join(" · "))
}

/// A quota window: `██░░ 62% 2h10m` (used share, and time to its reset).
fn gauge(used: Option<f64>, reset_at: Option<&str>, now_ms: u64, width: usize) -> String {
    let Some(used) = used else {
        return "–".to_string();
    };
    let mut s = format!("{} {:>3.0}%", bar(used / 100.0, width), used);
    if let Some(at) = reset_at.and_then(parse_ms) {
        s.push(' ');
        s.push_str(&human_secs(at.saturating_sub(now_ms) / 1000));
    }
    s
}

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let s = &app.state;
    let wide = area.width >= WIDE;
    let block = pane_block(
        app,
        Pane::Accounts,
        &format!("{} accounts · 5 min window", s.accounts.len()),
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [table_area, error_area] =
        Layout::vertical([Constraint::Min(2), Constraint::Length(1)]).areas(inner);

    let bar_w = if wide { 8 } else { 2 };
    let rows = s.accounts.iter().map(|a| {
        let stats = s.account_stats(&a.chatgpt_account_id);
        let quota = a.quota.as_ref();
        let ok = stats
            .success_rate()
            .map_or("–".to_string(), |r| format!("{:.0}%", r * 100.0));
        let ttft = stats.ttft.map_or("–".to_string(), |p| human_ms(p.p50));
        let name = if wide {
            match &a.email {
                Some(e) if e != &a.label => format!("{} <{e}>", a.label),
                _ => a.label.clone(),
            }
        } else {
            a.label.clone()
        };
        let long = state_text(a);
        let text = if wide && long.chars().count() <= WIDE_STATE {
            long
        } else {
            state_short(a)
        };
        let state = Cell::from(text).style(Style::new().fg(state_color(&a.state)));
        let mut cells = vec![Cell::from(name)];
        if wide {
            cells.push(Cell::from(a.plan.clone().unwrap_or_default()));
        }
        cells.extend([
            state,
            Cell::from(format!("{}/{}", a.in_flight, a.limit)),
            Cell::from(a.waiting.to_string()),
            Cell::from(gauge(
                quota.and_then(|q| q.primary_used_percent),
                quota.and_then(|q| q.primary_reset_at.as_deref()),
                s.now_ms,
                bar_w,
            )),
            Cell::from(gauge(
                quota.and_then(|q| q.secondary_used_percent),
                quota.and_then(|q| q.secondary_reset_at.as_deref()),
                s.now_ms,
                bar_w,
            )),
            Cell::from(ok),
            Cell::from(ttft),
        ]);
        if wide {
            cells.push(Cell::from(upstream_rates(&a.error_rates)));
            cells.push(
                Cell::from(a.last_error.clone().unwrap_or_default())
                    .style(Style::new().fg(Color::DarkGray)),
            );
        }
        Row::new(cells)
    });
    let (header, widths): (Vec<&str>, Vec<Constraint>) = if wide {
        (
            vec![
                "Account",
                "Plan",
                "State",
                "Slots",
                "Wait",
                "5h quota",
                "Weekly",
                "OK",
                "TTFT",
                "Up err 20/60m",
                "Last error",
            ],
            vec![
                Constraint::Length(30),
                Constraint::Length(5),
                Constraint::Length(WIDE_STATE as u16),
                Constraint::Length(5),
                Constraint::Length(4),
                Constraint::Length(20),
                Constraint::Length(20),
                Constraint::Length(4),
                Constraint::Length(6),
                Constraint::Length(13),
                Constraint::Min(10),
            ],
        )
    } else {
        (
            vec![
                "Account", "State", "Slots", "Wt", "5h", "Week", "OK", "TTFT",
            ],
            vec![
                // The account's name takes what is left.
                Constraint::Min(11),
                Constraint::Length(17),
                Constraint::Length(5),
                Constraint::Length(2),
                Constraint::Length(13),
                Constraint::Length(13),
                Constraint::Length(4),
                Constraint::Length(5),
            ],
        )
    };
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(Style::new().add_modifier(Modifier::BOLD)))
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .highlight_symbol("›");
    let mut state = TableState::default()
        .with_selected((!s.accounts.is_empty()).then(|| app.selected_account_index()));
    frame.render_stateful_widget(table, table_area, &mut state);

    let line = match app.selected_account() {
        Some(a) => {
            let mut spans = vec![Span::styled(
                format!("{} ", a.label),
                Style::new().add_modifier(Modifier::BOLD),
            )];
            if let Some(e) = a.email.as_ref().filter(|e| **e != a.label) {
                spans.push(Span::raw(format!("{e} ")));
            }
            spans.push(colored(format!("id {} · ", a.id), Color::DarkGray));
            if let Some(n) = a
                .quota
                .as_ref()
                .and_then(|q| q.reset_credits)
                .filter(|n| *n > 0)
            {
                let s = if n == 1 { "" } else { "s" };
                spans.push(colored(format!("{n} reset credit{s} · "), Color::Green));
            }
            if !a.unsupported_models.is_empty() {
                spans.push(colored(
                    format!("not for {} · ", a.unsupported_models.join(", ")),
                    Color::Yellow,
                ));
            }
            if !a.error_rates.is_empty() {
                spans.push(colored(
                    format!("{} · ", rates_text(&a.error_rates)),
                    Color::DarkGray,
                ));
            }
            if let Some(origin) = &a.origin {
                spans.push(colored(format!("served at {origin} · "), Color::Cyan));
            }
            if let Some(why) = &a.routing_error {
                spans.push(colored(format!("routing unknown: {why} · "), Color::Red));
            }
            if a.login == Login::AccessToken {
                let until = a.token_expires_at.as_deref().unwrap_or("unknown");
                spans.push(colored(
                    format!("access token until {until} · "),
                    Color::Yellow,
                ));
            }
            match (&a.detail, &a.last_error) {
                // Why it needs a new login, in words, before the raw error.
                (Some(detail), _) => spans.push(colored(detail.clone(), Color::Red)),
                (None, Some(err)) => spans.push(colored(format!("last error: {err}"), Color::Red)),
                (None, None) => spans.push(colored("no error", Color::DarkGray)),
            }
            Line::from(spans)
        }
        None if s.status.is_some() => {
            Line::from("no accounts: import one with `switchyard account import`")
        }
        None => Line::from("waiting for the daemon…"),
    };
    frame.render_widget(Paragraph::new(line), error_area);
}
