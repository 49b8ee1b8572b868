//! Requests: a live tail, newest first — time, key, model, the attempt chain
//! (`A ✗ quota → B ✓`), transport, status, time to first token, duration, tokens.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Cell, Row, Table, TableState};
use switchyard_admin::wire::{Class, RequestRecord};

use super::affinity::{clock, truncate};
use super::{human_ms, pane_block};
use crate::app::{App, Pane};
use crate::state::State;
use crate::state::stats::{is_failure, transport};

/// `sim-acct-1 ✗ quota → sim-acct-2 ✓`.
pub fn chain(state: &State, r: &RequestRecord) -> String {
    if r.attempts.is_empty() {
        return format!("✗ {}", r.outcome);
    }
    r.attempts
        .iter()
        .map(|a| {
            let name = state.account_name(&a.account);
            match &a.class {
                Class::Success => format!("{name} ✓"),
                class => format!("{name} ✗ {class}"),
            }
        })
        .collect::<Vec<_>>()
        .join(" → ")
}

fn tokens(r: &RequestRecord) -> String {
    r.usage.as_ref().map_or("–".to_string(), |u| {
        format!("{}/{}", u.input_tokens, u.output_tokens)
    })
}

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let s = &app.state;
    let wide = area.width >= 110;
    let block = pane_block(
        app,
        Pane::Requests,
        &format!("{} seen · Enter opens one", s.requests.len()),
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);

    // Only the rows that can show are built.
    let selected = app.selected_request_index();
    let visible = inner.height.saturating_sub(1) as usize;
    let offset = selected.saturating_sub(visible.saturating_sub(1));
    let rows = s
        .requests
        .iter()
        .skip(offset)
        .take(visible.max(1))
        .map(|f| {
            let r = &f.record;
            let color = if is_failure(r) {
                Color::Red
            } else if r.attempts.len() > 1 {
                Color::Yellow
            } else {
                Color::Reset
            };
            let transport = transport(r);
            let ttft = r.ttft_ms.map_or("–".to_string(), human_ms);
            let mut cells = vec![Cell::from(clock(&r.started_at).to_string())];
            if wide {
                cells.push(Cell::from(truncate(&r.key, 10)));
                cells.push(Cell::from(truncate(&r.model, 14)));
            }
            cells.extend([
                Cell::from(chain(s, r)).style(Style::new().fg(color)),
                Cell::from(transport.to_string()),
                Cell::from(r.status.to_string()),
                Cell::from(ttft),
                Cell::from(human_ms(r.duration_ms)),
            ]);
            if wide {
                cells.push(Cell::from(tokens(r)));
            }
            Row::new(cells)
        });
    let (header, widths): (Vec<&str>, Vec<Constraint>) = if wide {
        (
            vec![
                "Time",
                "Key",
                "Model",
                "Attempts",
                "Transport",
                "St",
                "TTFT",
                "Dur",
                "Tokens",
            ],
            vec![
                Constraint::Length(8),
                Constraint::Length(10),
                Constraint::Length(14),
                Constraint::Min(30),
                Constraint::Length(24),
                Constraint::Length(3),
                Constraint::Length(6),
                Constraint::Length(6),
                Constraint::Length(11),
            ],
        )
    } else {
        (
            vec!["Time", "Attempts", "Transport", "St", "TTFT", "Dur"],
            vec![
                Constraint::Length(8),
                Constraint::Min(24),
                Constraint::Length(12),
                Constraint::Length(3),
                Constraint::Length(5),
                Constraint::Length(5),
            ],
        )
    };
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(Style::new().add_modifier(Modifier::BOLD)))
        .row_highlight_style(if app.focus == Pane::Requests {
            Style::new().add_modifier(Modifier::REVERSED)
        } else {
            Style::new()
        });
    let mut state =
        TableState::default().with_selected((!s.requests.is_empty()).then_some(selected - offset));
    frame.render_stateful_widget(table, inner, &mut state);
}
