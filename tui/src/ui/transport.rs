//! Transport: how turns reached the backend per minute over the last 5 minutes, the idle
//! upstream WebSockets per account, and the WebSocket breaker.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use switchyard_admin::wire::{BreakerState, Transport};

use super::affinity::truncate;
use super::{colored, pane_block, sparkline};
use crate::app::{App, Pane};

/// The decisions, in the order they are shown.
pub const KINDS: [Transport; 6] = [
    Transport::WsReused,
    Transport::WsConnected,
    Transport::Http,
    Transport::HttpWsFailed,
    Transport::HttpWsBudgetExhausted,
    Transport::HttpBreakerOpen,
];

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let s = &app.state;
    let block = pane_block(app, Pane::Transport, "");
    let inner = block.inner(area);
    frame.render_widget(block, area);

    let t = s.transport_stats();
    let mut lines = vec![Line::from(Span::styled(
        format!("{:<25}{:<7}{:>6}", "decision", "5 min", "total"),
        Style::new().add_modifier(Modifier::BOLD),
    ))];
    let others = t.per_minute.keys().filter(|k| !KINDS.contains(k));
    for kind in KINDS.iter().chain(others) {
        let series: Vec<u64> = t
            .per_minute
            .get(kind)
            .map(|v| v.iter().map(|n| *n as u64).collect())
            .unwrap_or_else(|| vec![0; t.minutes]);
        let total = t.total(kind);
        let color = match kind {
            Transport::WsReused | Transport::WsConnected => Color::Green,
            Transport::Http => Color::Reset,
            _ => Color::Yellow,
        };
        lines.push(Line::from(vec![
            colored(
                format!("{:<25}", kind.as_str()),
                if total > 0 { color } else { Color::DarkGray },
            ),
            colored(format!("{:<7}", sparkline(&series)), Color::Cyan),
            Span::raw(format!("{total:>6}")),
        ]));
    }
    let breaker_color = match s.breaker {
        BreakerState::Closed => Color::Green,
        BreakerState::HalfOpen => Color::Yellow,
        _ => Color::Red,
    };
    lines.push(Line::from(vec![
        Span::raw("breaker "),
        colored(
            if s.breaker.as_str().is_empty() {
                "–".to_string()
            } else {
                s.breaker.to_string()
            },
            breaker_color,
        ),
        Span::raw(format!(" · WS pool idle {}", s.ws_pool_idle)),
    ]));
    let per: Vec<String> = s
        .ws_pool
        .iter()
        .map(|(id, n)| format!("{} {n}", truncate(s.account_name(id), 12)))
        .collect();
    if !per.is_empty() {
        lines.push(Line::from(format!("  {}", per.join(" · "))));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}
