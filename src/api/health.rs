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
    let by_state = state.fleet.count_by_state();
    (
        StatusCode::OK,
        Json(
            json!({"status": "ready", "accounts": state.fleet.len(), "accounts_by_state": by_state}),
        ),
    )
}
