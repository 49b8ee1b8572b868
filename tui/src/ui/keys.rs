//! Keys: each client key, live — requests running (and waiting in its queue) against its
//! concurrency limit, requests in the last minute against its rate, tokens today, its token
//! budgets as gauges with the reset countdown of an exhausted one, and its last refusal.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table, TableState};
use switchyard_admin::wire::{Budget, KeyLive};

use super::affinity::truncate;
use super::{bar, colored, human_secs, pane_block};
use crate::app::{App, Pane};

/// Rows the pane needs to show every key: borders, header, one row per key (or a line that
/// says there are none).
pub fn height(app: &App) -> u16 {
    u16::try_from(app.state.keys.len().max(1))
        .unwrap_or(u16::MAX)
        .saturating_add(3)
}

/// `2/4`, `2` without a limit, plus ` +3` when 3 wait in the key's queue.
pub fn in_flight_text(k: &KeyLive) -> String {
    let mut s = match k.max_concurrency {
        Some(max) => format!("{}/{max}", k.in_flight),
        None => k.in_flight.to_string(),
    };
    if k.waiting > 0 {
        s.push_str(&format!(" +{}", k.waiting));
    }
    s
}

/// `12/60`, or `12` without a limit.
pub fn rpm_text(k: &KeyLive) -> String {
    match k.rpm_limit {
        Some(limit) => format!("{}/{limit}", k.rpm),
        None => k.rpm.to_string(),
    }
}

/// `950`, `1.2k`, `34k`, `3.4M`, `1.1G`.
pub fn human_count(n: u64) -> String {
    const UNITS: [(&str, f64); 4] = [("", 1.0), ("k", 1e3), ("M", 1e6), ("G", 1e9)];
    if n < 1000 {
        return n.to_string();
    }
    let mut i = UNITS.iter().rposition(|(_, u)| n as f64 >= *u).unwrap_or(0);
    loop {
        let v = n as f64 / UNITS[i].1;
        let text = if v < 9.95 {
            format!("{v:.1}")
        } else {
            format!("{v:.0}")
        };
        // 999 950 rounds to `1000k`: say `1.0M` instead.
        if text == "1000" && i + 1 < UNITS.len() {
            i += 1;
            continue;
        }
        return format!("{text}{}", UNITS[i].0);
    }
}

/// Whether the key may spend no more of this budget until its window moves on.
fn exhausted(b: &Budget) -> bool {
    b.used >= b.limit || b.resets_in_s.is_some()
}

/// `5h ███░░ 61%`, and `5h █████ 100% 1h12m` once exhausted.
pub fn budget_text(b: &Budget, width: usize) -> String {
    let (fraction, pct) = if b.limit == 0 {
        (1.0, 100)
    } else {
        (
            b.used as f64 / b.limit as f64,
            b.used.saturating_mul(100) / b.limit,
        )
    };
    let mut s = format!("{} {} {pct}%", b.window, bar(fraction, width));
    if exhausted(b)
        && let Some(left) = b.resets_in_s
    {
        s.push(' ');
        s.push_str(&human_secs(left));
    }
    s
}

fn budget_color(b: &Budget) -> Color {
    if exhausted(b) {
        Color::Red
    } else if b.limit > 0 && b.used.saturating_mul(100) >= b.limit.saturating_mul(80) {
        Color::Yellow
    } else {
        Color::Reset
    }
}

/// The key's budgets side by side, each coloured by how much of it is used.
fn budgets(k: &KeyLive, width: usize) -> Line<'static> {
    let mut spans = Vec::new();
    for (i, b) in k.budgets.iter().enumerate() {
        if i > 0 {
            spans.push(Span::raw("  "));
        }
        spans.push(colored(budget_text(b, width), budget_color(b)));
    }
    Line::from(spans)
}

/// `key_rate_limited 12s ago` (its age on the daemon's clock), empty without a refusal.
pub fn refusal_text(k: &KeyLive, now_ms: u64) -> String {
    match (&k.last_refusal, k.last_refusal_ms) {
        (Some(code), Some(at)) => {
            format!(
                "{code} {} ago",
                human_secs(now_ms.saturating_sub(at) / 1000)
            )
        }
        (Some(code), None) => code.clone(),
        (None, _) => String::new(),
    }
}

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let s = &app.state;
    let wide = area.width >= 110;
    let block = pane_block(
        app,
        Pane::Keys,
        &format!("{} keys · tokens since 00:00 UTC", s.keys.len()),
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);

    if s.keys.is_empty() {
        let line = if s.status.is_some() {
            Line::from("no client keys: create one with `switchyard key create NAME`")
        } else {
            Line::from("waiting for the daemon…")
        };
        frame.render_widget(Paragraph::new(line), inner);
        return;
    }

    // The wide table has a column for the last refusal; the small one says it under the
    // table, for the selected key.
    let (table_area, detail_area) = if wide {
        (inner, None)
    } else {
        let [t, d] = Layout::vertical([Constraint::Min(2), Constraint::Length(1)]).areas(inner);
        (t, Some(d))
    };
    let bar_w = if area.width >= 150 { 5 } else { 3 };
    let rows = s.keys.iter().map(|k| {
        let busy = k.waiting > 0 || k.max_concurrency.is_some_and(|m| k.in_flight >= m);
        let limited = k.rpm_limit.is_some_and(|l| k.rpm >= l);
        let name_w = if wide { 12 } else { 10 };
        let mut cells = vec![
            Cell::from(truncate(&k.name, name_w)),
            Cell::from(in_flight_text(k)).style(if busy {
                Style::new().fg(Color::Yellow)
            } else {
                Style::new()
            }),
            Cell::from(rpm_text(k)).style(if limited {
                Style::new().fg(Color::Yellow)
            } else {
                Style::new()
            }),
            Cell::from(human_count(k.tokens_today)),
            Cell::from(budgets(k, bar_w)),
        ];
        if wide {
            cells.push(Cell::from(refusal_text(k, s.now_ms)).style(Style::new().fg(Color::Red)));
        }
        let row = Row::new(cells);
        // The daemon leaves disabled keys out; one that comes anyway is dimmed.
        if k.enabled {
            row
        } else {
            row.style(Style::new().fg(Color::DarkGray).add_modifier(Modifier::DIM))
        }
    });
    let (header, widths): (Vec<&str>, Vec<Constraint>) = if wide {
        // Below 150 columns the budgets need the room more than the headers and refusals.
        let roomy = area.width >= 150;
        // As wide as the widest key's budgets, the rest to the refusals.
        let fixed = if roomy {
            12 + 9 + 9 + 12 + 32
        } else {
            12 + 9 + 8 + 6 + 28
        } + 5;
        let budgets_w = s
            .keys
            .iter()
            .map(|k| budgets(k, bar_w).width())
            .max()
            .unwrap_or(0)
            .max("Budgets".len())
            .min(inner.width.saturating_sub(fixed).max(20) as usize) as u16;
        (
            vec![
                "Key",
                "In-flight",
                "RPM",
                if roomy { "Tokens today" } else { "Today" },
                "Budgets",
                "Last refusal",
            ],
            vec![
                Constraint::Length(12),
                Constraint::Length(9),
                Constraint::Length(if roomy { 9 } else { 8 }),
                Constraint::Length(if roomy { 12 } else { 6 }),
                Constraint::Length(budgets_w),
                Constraint::Min(if roomy { 32 } else { 28 }),
            ],
        )
    } else {
        (
            vec!["Key", "In-fl", "RPM", "Today", "Budgets"],
            vec![
                Constraint::Length(10),
                Constraint::Length(7),
                Constraint::Length(7),
                Constraint::Length(5),
                Constraint::Min(20),
            ],
        )
    };
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(Style::new().add_modifier(Modifier::BOLD)))
        .row_highlight_style(if app.focus == Pane::Keys {
            Style::new().add_modifier(Modifier::REVERSED)
        } else {
            Style::new()
        });
    let selected = app.selected_key_index();
    let mut state = TableState::default().with_selected(Some(selected));
    frame.render_stateful_widget(table, table_area, &mut state);

    if let (Some(area), Some(k)) = (detail_area, s.keys.get(selected)) {
        let mut spans = vec![
            Span::styled(
                format!("{} ", k.name),
                Style::new().add_modifier(Modifier::BOLD),
            ),
            colored(format!("id {} · ", k.id), Color::DarkGray),
        ];
        match refusal_text(k, s.now_ms) {
            r if r.is_empty() => spans.push(colored("no refusal", Color::DarkGray)),
            r => spans.push(colored(format!("last refusal: {r}"), Color::Red)),
        }
        frame.render_widget(Paragraph::new(Line::from(spans)), area);
    }
}
