//! The header: version, uptime, connection state, req/s and error-rate sparklines, dropped
//! events.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{colored, human_secs, sparkline};
use crate::app::App;
use crate::state::Link;

/// Seconds the sparklines cover, on a wide and on a small terminal.
const SPARK_SECS: (usize, usize) = (30, 10);

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let s = &app.state;
    let link = match &s.link {
        Link::Connecting => colored("● connecting", Color::Yellow),
        Link::Connected => colored("● connected", Color::Green),
        Link::Reconnecting { in_s, .. } => {
            colored(format!("● reconnecting in {in_s}s"), Color::Red)
        }
        Link::Refused(_) => colored("● refused", Color::Red),
    };
    let mut first = vec![Span::styled(
        "Switchyard ",
        Style::new().add_modifier(Modifier::BOLD),
    )];
    match &s.status {
        Some(st) => {
            first.push(Span::raw(format!(
                "{} · up {} · {} · ",
                st.version,
                human_secs(st.uptime_s),
                st.strategy
            )));
        }
        None => first.push(Span::raw(format!("{} · ", app.target))),
    }
    first.push(link);
    if let Link::Reconnecting { reason, .. } = &s.link {
        first.push(colored(format!(" ({reason})"), Color::DarkGray));
    }
    let secs = if area.width >= super::WIDE_MIN.0 {
        SPARK_SECS.0
    } else {
        SPARK_SECS.1
    };
    let (all, failed) = s.per_second(secs);
    let total: u64 = all.iter().sum();
    let errors: u64 = failed.iter().sum();
    let rate = total as f64 / secs as f64;
    let err_pct = if total == 0 {
        0.0
    } else {
        errors as f64 * 100.0 / total as f64
    };
    let (in_flight, waiting) = s
        .status
        .as_ref()
        .map_or((0, 0), |st| (st.in_flight, st.waiting));
    let mut second = vec![
        Span::raw("req/s "),
        colored(sparkline(&all), Color::Cyan),
        Span::raw(format!(" {rate:.1}  errors ")),
        colored(sparkline(&failed), Color::Red),
        Span::raw(format!(
            " {err_pct:.0}%  in-flight {in_flight} waiting {waiting} dropped {}",
            s.dropped_events + s.dropped_subscribers
        )),
    ];
    // The pool's windows, as an operator compares them: the clients' errors and the upstream's.
    if let Some(st) = s.status.as_ref().filter(|st| !st.error_rates.is_empty()) {
        second.push(colored(
            format!("  {}", super::accounts::windows_short(&st.error_rates)),
            Color::DarkGray,
        ));
    }
    let second = Line::from(second);
    frame.render_widget(Paragraph::new(vec![Line::from(first), second]), area);
}
