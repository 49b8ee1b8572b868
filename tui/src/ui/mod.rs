//! Drawing. Each pane is a `render(frame, area, &App)` that only reads. A wide terminal shows
//! every pane at once; a small one (80×24) shows one pane at a time under a tab bar. 16
//! colours are enough: only the basic ANSI colours are used.

pub mod accounts;
pub mod affinity;
pub mod detail;
pub mod header;
pub mod help;
pub mod keys;
pub mod queues;
pub mod requests;
pub mod transport;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Tabs};
use switchyard_admin::wire::AccountState;

use crate::app::{ActionWords, App, Overlay, Pane};

/// Below this size the panes collapse to tabs.
pub const WIDE_MIN: (u16, u16) = (120, 36);

/// Whether every pane fits at once.
pub fn is_wide(area: Rect) -> bool {
    area.width >= WIDE_MIN.0 && area.height >= WIDE_MIN.1
}

/// Draws the whole console.
pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(5),
        Constraint::Length(1),
    ])
    .areas(area);
    header::render(frame, head, app);
    if is_wide(area) {
        let rows = app.state.accounts.len().max(1) as u16;
        let accounts_h = (rows + 4).min(body.height * 2 / 5).max(6);
        // The bottom keeps at least 6 rows for Requests and 4 for Keys (one key); the middle
        // row gets what it wants of the rest, and at least 12 rows when that leaves them.
        let rest = body.height.saturating_sub(accounts_h);
        let middle_h = (rows + 8).max(12).min(rest.saturating_sub(10));
        let [top, middle, bottom] = Layout::vertical([
            Constraint::Length(accounts_h),
            Constraint::Length(middle_h),
            Constraint::Min(6),
        ])
        .areas(body);
        accounts::render(frame, top, app);
        let [a, q, t] = Layout::horizontal([
            Constraint::Percentage(36),
            Constraint::Percentage(30),
            Constraint::Percentage(34),
        ])
        .areas(middle);
        affinity::render(frame, a, app);
        queues::render(frame, q, app);
        transport::render(frame, t, app);
        // Keys and Requests both need the full width (budgets and refusals; the attempt
        // chain): they share the bottom one above the other, Keys at most 3/5 of it and with
        // 6 rows left for Requests; more keys than fit scroll with the selection.
        let keys_h = keys::height(app)
            .min(bottom.height * 3 / 5)
            .max(4)
            .min(bottom.height.saturating_sub(6));
        let [k, r] =
            Layout::vertical([Constraint::Length(keys_h), Constraint::Min(6)]).areas(bottom);
        requests::render(frame, r, app);
        if k.height >= 3 {
            keys::render(frame, k, app);
        }
    } else {
        let [tabs, pane] =
            Layout::vertical([Constraint::Length(1), Constraint::Min(3)]).areas(body);
        let titles = Pane::ALL
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{} {}", i + 1, p.title()));
        let selected = Pane::ALL.iter().position(|p| *p == app.focus).unwrap_or(0);
        frame.render_widget(
            Tabs::new(titles)
                .select(selected)
                .highlight_style(Style::new().add_modifier(Modifier::REVERSED)),
            tabs,
        );
        match app.focus {
            Pane::Accounts => accounts::render(frame, pane, app),
            Pane::Affinity => affinity::render(frame, pane, app),
            Pane::Queues => queues::render(frame, pane, app),
            Pane::Transport => transport::render(frame, pane, app),
            Pane::Requests => requests::render(frame, pane, app),
            Pane::Keys => keys::render(frame, pane, app),
        }
    }
    footer(frame, foot, app);
    match &app.overlay {
        Overlay::None => {}
        Overlay::Help => help::render(frame, area, app),
        Overlay::Detail(id) => detail::render(frame, area, app, id),
        Overlay::Report(view) => {
            let popup = centered(
                area,
                area.width.saturating_sub(4),
                area.height.saturating_sub(2),
            );
            frame.render_widget(Clear, popup);
            let (text, scroll) = match view {
                crate::app::ReportView::Loading => ("fetching the report…".to_string(), 0),
                crate::app::ReportView::Failed(e) => (format!("no report: {e}"), 0),
                crate::app::ReportView::Text { text, scroll } => (text.clone(), *scroll),
            };
            frame.render_widget(
                Paragraph::new(text)
                    .scroll((scroll, 0))
                    .block(Block::bordered().title(" Error report · ↑↓ scroll · Esc closes ")),
                popup,
            );
        }
        Overlay::Confirm(p) => {
            let text = format!("{} {} ({})?", p.action.verb(), p.label, p.account);
            let width = (text.chars().count() as u16 + 4).clamp(30, area.width);
            let popup = centered(area, width, 5);
            frame.render_widget(Clear, popup);
            frame.render_widget(
                Paragraph::new(vec![
                    Line::from(text),
                    Line::from(""),
                    Line::from("y confirm · n cancel").style(Style::new().fg(Color::Yellow)),
                ])
                .block(Block::bordered().title(" Confirm ")),
                popup,
            );
        }
    }
}

fn footer(frame: &mut Frame, area: Rect, app: &App) {
    let line = match &app.flash {
        Some(f) => Line::from(f.text.clone()).style(if f.error {
            Style::new().fg(Color::Red)
        } else {
            Style::new().fg(Color::Green)
        }),
        None if area.width >= WIDE_MIN.0 => Line::from(
            "↑↓ select · Tab pane · Enter open · e/d enable/disable · n drain · c clear cooldown · r refresh · p probe · R report · ? help · q quit",
        )
        .style(Style::new().fg(Color::DarkGray)),
        None => Line::from("↑↓ select · Tab pane · Enter open · e d n c r p act · R report · ? help · q quit")
            .style(Style::new().fg(Color::DarkGray)),
    };
    frame.render_widget(Paragraph::new(line), area);
}

/// A pane's frame; the focused pane's border stands out.
pub fn pane_block(app: &App, pane: Pane, extra: &str) -> Block<'static> {
    let focused = app.focus == pane;
    let title = if extra.is_empty() {
        format!(" {} ", pane.title())
    } else {
        format!(" {} · {} ", pane.title(), extra)
    };
    Block::default()
        .borders(Borders::ALL)
        .title(title)
        .border_style(if focused {
            Style::new().fg(Color::Cyan)
        } else {
            Style::new().fg(Color::DarkGray)
        })
}

/// A rectangle of at most `w`×`h` in the middle of `area`.
pub fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    }
}

/// `41m`, `2h05m`, `3d04h`, `35s`.
pub fn human_secs(s: u64) -> String {
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// `850ms`, `1.2s`, `14s`, `3m`.
pub fn human_ms(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1000..=9_999 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => human_secs(ms / 1000),
    }
}

/// A text gauge of `width` cells: `███░░`.
pub fn bar(fraction: f64, width: usize) -> String {
    let filled = ((fraction.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("{}{}", "█".repeat(filled), "░".repeat(width - filled))
}

/// A one-line sparkline of `values`, scaled to their maximum.
pub fn sparkline(values: &[u64]) -> String {
    const TICKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = values.iter().copied().max().unwrap_or(0);
    values
        .iter()
        .map(|&v| {
            if max == 0 || v == 0 {
                ' '
            } else {
                TICKS[((v * 7).div_ceil(max)) as usize]
            }
        })
        .collect()
}

/// A span in a colour.
pub fn colored(text: impl Into<String>, color: Color) -> Span<'static> {
    Span::styled(text.into(), Style::new().fg(color))
}

/// The colour of an account state.
pub fn state_color(state: &AccountState) -> Color {
    match state {
        AccountState::Ready => Color::Green,
        AccountState::Cooling => Color::Yellow,
        AccountState::HalfOpen | AccountState::Probing => Color::Cyan,
        AccountState::NeedsReauth => Color::Red,
        _ => Color::DarkGray,
    }
}

#[cfg(test)]
pub(crate) mod tests;
