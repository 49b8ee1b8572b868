//! One request's full record: candidates, skips, affinity, queue, every attempt.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};
use switchyard_admin::wire::{Affinity, Class, Phase, TerminalSource};

use super::{centered, colored, human_ms};
use crate::app::App;

pub fn render(frame: &mut Frame, area: Rect, app: &App, id: &str) {
    let s = &app.state;
    let popup = centered(
        area,
        area.width.saturating_sub(4).min(110),
        area.height.saturating_sub(2),
    );
    frame.render_widget(Clear, popup);
    let block = Block::bordered().title(format!(" Request {id} · Esc closes "));
    let Some(r) = s.requests.iter().map(|f| &f.record).find(|r| r.id == id) else {
        frame.render_widget(
            Paragraph::new("this request is no longer in the console's memory").block(block),
            popup,
        );
        return;
    };
    let field = |name: &str, value: String| {
        Line::from(vec![
            Span::styled(
                format!("{name:<12}"),
                Style::new().add_modifier(Modifier::BOLD),
            ),
            Span::raw(value),
        ])
    };
    let names = |ids: &[String]| {
        ids.iter()
            .map(|a| s.account_name(a).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut lines = vec![
        field("started", r.started_at.clone()),
        field(
            "client",
            format!(
                "key {} · {} {} · model {}",
                r.key,
                if r.ws { "WS" } else { "HTTP" },
                r.path,
                r.model
            ),
        ),
        field(
            "outcome",
            format!(
                "{} · status {} · ttft {} · duration {}",
                r.outcome,
                r.status,
                r.ttft_ms.map_or("–".to_string(), human_ms),
                human_ms(r.duration_ms)
            ),
        ),
        field(
            "terminal",
            match &r.terminal_source {
                Some(TerminalSource::Upstream) => "upstream: the backend's own answer".to_string(),
                Some(TerminalSource::Synthetic) => "synthetic: made by the gateway".to_string(),
                Some(TerminalSource::Nothing) => {
                    "none: the client left or stopped reading first".to_string()
                }
                Some(other) => other.to_string(),
                None => "not recorded".to_string(),
            },
        ),
        field(
            "tier",
            match (&r.service_tier, &r.served_tier) {
                (None, None) => "default asked · the answer named none".to_string(),
                (asked, claimed) => format!(
                    "{} asked · {} claimed by the answer (a claim, not proof)",
                    asked.as_deref().unwrap_or("default"),
                    claimed.as_deref().unwrap_or("none")
                ),
            },
        ),
        field(
            "transport",
            match r.ws_connect_ms {
                Some(ms) => format!(
                    "{} (upstream socket opened in {})",
                    r.transport,
                    human_ms(ms)
                ),
                None => r.transport.to_string(),
            },
        ),
        field(
            "session",
            format!(
                "{} · affinity {}",
                r.session.as_deref().unwrap_or("none"),
                match &r.affinity {
                    Affinity::Unknown(name) if name.is_empty() => "none".to_string(),
                    a => a.to_string(),
                }
            ),
        ),
        field(
            "credit",
            r.credit_spend
                .as_ref()
                .map_or("no reset credit spent".to_string(), |c| {
                    format!(
                        "reset credit on {}: {} · {} window(s) reset · redeem {}",
                        s.account_name(&c.account),
                        c.outcome,
                        c.windows_reset,
                        c.redeem_id
                    )
                }),
        ),
        field(
            "queue",
            r.queue.as_ref().map_or("no wait".to_string(), |q| {
                format!(
                    "{} queue · {} after {}",
                    q.queue,
                    q.outcome,
                    human_ms(q.wait_ms)
                )
            }),
        ),
        field("candidates", names(&r.candidate_pool)),
        field(
            "skipped",
            if r.skipped.is_empty() {
                "none".to_string()
            } else {
                r.skipped
                    .iter()
                    .map(|k| format!("{} ({})", s.account_name(&k.account), k.reason))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ),
        field(
            "tokens",
            r.usage.as_ref().map_or("–".to_string(), |u| {
                format!(
                    "input {} (cached {}) · output {} (reasoning {})",
                    u.input_tokens, u.cached_tokens, u.output_tokens, u.reasoning_tokens
                )
            }),
        ),
        Line::from(""),
        Line::from(Span::styled(
            "attempts",
            Style::new().add_modifier(Modifier::BOLD),
        )),
    ];
    for (i, a) in r.attempts.iter().enumerate() {
        let ok = a.class == Class::Success;
        lines.push(Line::from(vec![
            Span::raw(format!("{}. {} ", i + 1, s.account_name(&a.account))),
            colored(
                a.class.to_string(),
                if ok { Color::Green } else { Color::Red },
            ),
            Span::raw(format!(
                " · status {} · {} · {}",
                a.status.map_or("–".to_string(), |c| c.to_string()),
                a.phase.as_ref().map_or("–", Phase::as_str),
                human_ms(a.ms)
            )),
            colored(
                a.rule
                    .as_ref()
                    .map_or(String::new(), |r| format!(" · rule {r}")),
                Color::Magenta,
            ),
            colored(
                a.error
                    .as_ref()
                    .map_or(String::new(), |e| format!(" · {e}")),
                Color::DarkGray,
            ),
        ]));
    }
    if r.attempts.is_empty() {
        lines.push(Line::from("none: no account was tried"));
    }
    frame.render_widget(
        Paragraph::new(lines)
            .block(block)
            .wrap(Wrap { trim: false }),
        popup,
    );
}
