//! Affinity: sessions bound per account, prompt-cache hit ratio per account, and the latest
//! decisions (reused / new / rebound with its reason).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use switchyard_admin::wire::Affinity;

use super::{colored, pane_block};
use crate::app::{App, Pane};

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let s = &app.state;
    let block = pane_block(app, Pane::Affinity, "");
    let inner = block.inner(area);
    frame.render_widget(block, area);

    let stats = s.affinity_stats();
    let mut lines = vec![Line::from(Span::styled(
        format!("{:<14}{:>9}{:>11}", "account", "sessions", "cache hit"),
        Style::new().add_modifier(Modifier::BOLD),
    ))];
    for a in &s.accounts {
        let sessions = s.sessions.get(&a.chatgpt_account_id).copied().unwrap_or(0);
        let cache = match stats.cache.get(&a.chatgpt_account_id) {
            Some((cached, input)) if *input > 0 => {
                format!("{:.0}%", *cached as f64 * 100.0 / *input as f64)
            }
            _ => "–".to_string(),
        };
        lines.push(Line::from(format!(
            "{:<14}{:>9}{:>11}",
            truncate(&a.label, 13),
            sessions,
            cache
        )));
    }
    let count = |k: &str| stats.decisions.get(k).copied().unwrap_or(0);
    lines.push(Line::from(vec![
        colored(format!("reused {}", count("reused")), Color::Green),
        Span::raw(" · "),
        colored(format!("new {}", count("new_bind")), Color::Cyan),
        Span::raw(" · "),
        colored(format!("rebound {}", count("rebound")), Color::Yellow),
        Span::raw(format!(" · none {}", count("none"))),
    ]));
    let room = (inner.height as usize).saturating_sub(lines.len());
    for f in s.affinity_decisions(room) {
        let r = &f.record;
        let session = r.session.as_deref().unwrap_or("");
        let account = r.account.as_deref().map_or("–", |a| s.account_name(a));
        let color = match &r.affinity {
            Affinity::Reused => Color::Green,
            Affinity::NewBind => Color::Cyan,
            Affinity::Rebound(_) => Color::Yellow,
            _ => Color::DarkGray,
        };
        lines.push(Line::from(vec![
            Span::raw(format!(
                "{} {} → {} ",
                clock(&r.started_at),
                truncate(session, 8),
                truncate(account, 12)
            )),
            colored(r.affinity.to_string(), color),
        ]));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

/// `12:01:03` from an RFC 3339 time.
pub fn clock(rfc3339: &str) -> &str {
    rfc3339.get(11..19).unwrap_or(rfc3339)
}

/// At most `n` characters.
pub fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}
