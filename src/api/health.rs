//! `/healthz` (the process and its store answer) and `/readyz` (and it takes traffic).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::AppState;

async fn store_ok(state: &AppState) -> Result<(), String> {
    let store = state.store.clone();
    match tokio::task::spawn_blocking(move || store.ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

pub async fn healthz(State(state): State<Arc<AppState>>) -> (StatusCode, Json<Value>) {
    match store_ok(&state).await {
        Ok(()) => (StatusCode::OK, Json(json!({"status": "ok"}))),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "error", "error": e})),
        ),
    }
}

pub async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, Json<Value>) {
    if state.is_draining() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining"})),
        );
    }
    if let Err(e) = store_ok(&state).await {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "error", "error": e})),
        );
    }
    let by_state = super::view::by_state(state.fleet.count_by_state());
    (
        StatusCode::OK,
        Json(
            json!({"status": "ready", "accounts": state.fleet.len(), "accounts_by_state": by_state}),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Arc<AppState> {
        crate::api::test_state()
    }

    #[tokio::test]
    async fn healthz_is_ok_while_the_store_answers_and_503_after_it_stops() {
        let s = state();
        let (code, Json(body)) = healthz(State(Arc::clone(&s))).await;
        assert_eq!((code, body), (StatusCode::OK, json!({"status": "ok"})));
        s.store.close().await.unwrap();
        let (code, Json(body)) = healthz(State(Arc::clone(&s))).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["status"], "error");
    }

    #[tokio::test]
    async fn readyz_is_503_while_draining() {
        let s = state();
        assert_eq!(readyz(State(Arc::clone(&s))).await.0, StatusCode::OK);
        s.start_draining();
        let (code, Json(body)) = readyz(State(s)).await;
        assert_eq!(
            (code, body),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "draining"})
            )
        );
    }
}
