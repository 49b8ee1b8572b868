//! Queues: who waits now (per account and pool-wide) and for how long the oldest has, wait
//! outcomes over the last 5 minutes, and wait p50/p95.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use switchyard_admin::wire::QueueOutcome;

use super::affinity::truncate;
use super::{colored, human_ms, pane_block};
use crate::app::{App, Pane};

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let s = &app.state;
    let block = pane_block(app, Pane::Queues, "");
    let inner = block.inner(area);
    frame.render_widget(block, area);

    let oldest = |ms: Option<u64>| ms.map_or("–".to_string(), human_ms);
    let mut lines = vec![
        Line::from(Span::styled(
            format!("{:<14}{:>8}{:>9}", "queue", "waiting", "oldest"),
            Style::new().add_modifier(Modifier::BOLD),
        )),
        Line::from(format!(
            "{:<14}{:>8}{:>9}",
            "pool",
            s.pool_waiting,
            oldest(s.pool_oldest_wait_ms)
        ))
        .style(if s.pool_waiting > 0 {
            Style::new().fg(Color::Yellow)
        } else {
            Style::new()
        }),
    ];
    for a in &s.accounts {
        let line = Line::from(format!(
            "{:<14}{:>8}{:>9}",
            truncate(&a.label, 13),
            a.waiting,
            oldest(a.oldest_wait_ms)
        ));
        lines.push(if a.waiting > 0 {
            line.style(Style::new().fg(Color::Yellow))
        } else {
            line
        });
    }
    let q = s.queue_stats();
    let count = |k: QueueOutcome| q.outcomes.get(&k).copied().unwrap_or(0);
    lines.push(Line::from("last 5 min:").style(Style::new().add_modifier(Modifier::BOLD)));
    lines.push(Line::from(vec![
        colored(
            format!("acquired {}", count(QueueOutcome::Acquired)),
            Color::Green,
        ),
        Span::raw(" · "),
        colored(
            format!("timeout {}", count(QueueOutcome::Timeout)),
            Color::Red,
        ),
    ]));
    lines.push(Line::from(vec![
        colored(
            format!("full {}", count(QueueOutcome::QueueFull)),
            Color::Red,
        ),
        Span::raw(" · "),
        Span::raw(format!("left {}", count(QueueOutcome::ClientLeft))),
    ]));
    lines.push(Line::from(match q.wait {
        Some(p) => format!(
            "wait p50 {} · p95 {} (n={})",
            human_ms(p.p50),
            human_ms(p.p95),
            p.n
        ),
        None => "wait p50 – · p95 – (no waits)".to_string(),
    }));
    frame.render_widget(Paragraph::new(lines), inner);
}
