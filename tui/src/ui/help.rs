//! The keys.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};

use super::centered;
use crate::app::App;
use crate::input::HELP;

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let popup = centered(area, 70, HELP.len() as u16 + 4);
    frame.render_widget(Clear, popup);
    let mut lines: Vec<Line> = HELP
        .iter()
        .map(|(keys, what)| {
            Line::from(vec![
                Span::styled(
                    format!("{keys:<12}"),
                    Style::new().add_modifier(Modifier::BOLD),
                ),
                Span::raw(*what),
            ])
        })
        .collect();
    lines.push(Line::from(""));
    lines.push(Line::from(format!("connected to {}", app.target)));
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" Keys · Esc closes ")),
        popup,
    );
}
