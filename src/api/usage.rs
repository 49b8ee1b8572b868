//! `GET /v1/usage`: a client key's own usage and limits — nothing about other keys or the
//! accounts behind the gateway.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::responses::authenticate;
use crate::keys::usage::{BudgetState, Counters};

fn totals(c: &Counters) -> Value {
    json!({
        "requests": c.requests,
        "errors": c.errors,
        "input_tokens": c.input_tokens,
        "cached_tokens": c.cached_tokens,
        "output_tokens": c.output_tokens,
        "reasoning_tokens": c.reasoning_tokens,
        "total_tokens": c.tokens(),
    })
}

fn budget(b: &BudgetState) -> Value {
    json!({
        "window": b.window.as_str(),
        "limit": b.limit,
        "used": b.used,
        "reserved": b.reserved,
        "remaining": b.limit.saturating_sub(b.used + b.reserved),
        "exhausted": b.exhausted,
        "resets_in_seconds": b.resets_in_s,
    })
}

pub async fn usage(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let key = match authenticate(&state, &headers) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    let Some(policy) = state.keys.policy(&key.id) else {
        return super::error::ApiError::unauthorized("this key no longer exists").into_response();
    };
    let book = &state.dispatcher.usage;
    let now = state.clock.now_secs();
    let live = state.keys.now(&key.id);
    let budget_of = |limit: Option<u64>, w| limit.map(|l| budget(&book.budget(&key.id, w, l)));
    use crate::keys::policy::Window;
    Json(json!({
        "object": "usage",
        "key": {"id": &*key.id, "name": &*key.name},
        "now": crate::base::clock::rfc3339(now),
        "usage": {
            "today": totals(&book.totals_since(&key.id, now / 86_400 * 86_400)),
            "last_5h": totals(&book.totals_since(&key.id, now.saturating_sub(5 * 3600))),
            "last_7d": totals(&book.totals_since(&key.id, now.saturating_sub(7 * 86_400))),
        },
        "limits": {
            "models": (!policy.models.is_empty()).then(|| policy.models.clone()),
            "max_concurrency": policy.max_concurrency.map(|l| json!({
                "limit": l,
                "in_flight": live.in_flight,
                "remaining": l.saturating_sub(live.in_flight),
            })),
            "rpm": policy.rpm.map(|l| json!({
                "limit": l,
                "used": live.rpm_counted,
                "remaining": l.saturating_sub(live.rpm_counted),
                "resets_in_seconds": live.rpm_resets_in_ms.map(|ms| ms.div_ceil(1000)),
            })),
            "tokens_per_5h": budget_of(policy.tokens_per_5h, Window::FiveHours),
            "tokens_per_day": budget_of(policy.tokens_per_day, Window::Day),
            "tokens_per_week": budget_of(policy.tokens_per_week, Window::Week),
            "expires_at": policy.expires_at.map(crate::base::clock::rfc3339),
        },
    }))
    .into_response()
}
