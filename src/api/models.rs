//! `GET /v1/models`: the upstream catalog (cached), merged with configured aliases. The OpenAI
//! list shape by default; the Codex shape `{"models": [...]}` when `client_version` is given.
//! `GET /v1/models/{id}`: one model of it in the OpenAI shape (`models.retrieve`), 404
//! `model_not_found` for a model neither the catalog nor an alias names.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::responses::authenticate;

/// How long a fetched catalog is served before it is fetched again.
pub const CATALOG_TTL_MS: u64 = 5 * 60 * 1000;

pub async fn list(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let models = match models(&state, &headers).await {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    if query.contains_key("client_version") {
        return Json(json!({ "models": models })).into_response();
    }
    let mut data: Vec<Value> = models
        .iter()
        .filter_map(|m| m["slug"].as_str())
        .map(|id| {
            let mut m = openai_model(id);
            m["front_doors"] = json!(["responses", "chat_completions"]);
            m
        })
        .collect();
    // What the other front doors answer to: the model names their maps name outright.
    let config = state.dispatcher.current();
    let named = |map: &crate::dispatch::ModelMap| {
        map.models
            .iter()
            .filter(|(k, _)| !k.contains(['*', '?']))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    for (name, target) in named(&config.anthropic) {
        data.push(
            json!({"id": name, "object": "model", "created": 0, "owned_by": "switchyard",
            "front_doors": ["messages"], "serves": target}),
        );
    }
    let mut images = named(&config.images);
    if !images.iter().any(|(k, _)| k == "gpt-image-1") {
        let host = config
            .images
            .default
            .clone()
            .unwrap_or_else(|| config.probe_model.clone());
        images.push(("gpt-image-1".into(), host));
    }
    for (name, target) in images {
        data.push(
            json!({"id": name, "object": "model", "created": 0, "owned_by": "switchyard",
            "front_doors": ["images"], "serves": target}),
        );
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`.
pub async fn retrieve(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let models = match models(&state, &headers).await {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    match models.iter().find(|m| m["slug"] == id.as_str()) {
        Some(_) => Json(openai_model(&id)).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("model_not_found"),
            format!("The model `{id}` does not exist or you do not have access to it."),
        )
        .into_response(),
    }
}

/// One model in the OpenAI shape.
fn openai_model(id: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": "openai"})
}

/// The catalog's models with the configured aliases, for a client with a key.
async fn models(state: &AppState, headers: &HeaderMap) -> Result<Vec<Value>, ApiError> {
    authenticate(state, headers)?;
    let catalog = catalog(state).await?;
    let mut models: Vec<Value> = catalog["models"].as_array().cloned().unwrap_or_default();
    let config = state.dispatcher.current();
    for (alias, target) in &config.aliases {
        if models.iter().any(|m| m["slug"] == alias.as_str()) {
            continue;
        }
        let mut entry = models
            .iter()
            .find(|m| m["slug"] == target.as_str())
            .cloned()
            .unwrap_or_else(|| json!({}));
        entry["slug"] = json!(alias);
        entry["display_name"] = json!(alias);
        models.push(entry);
    }
    Ok(models)
}

async fn catalog(state: &AppState) -> Result<Value, ApiError> {
    let now = state.clock.now_ms();
    let cached = state
        .models_cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some((at, v)) = &cached
        && now.saturating_sub(*at) < CATALOG_TTL_MS
    {
        return Ok(v.clone());
    }
    let d = &state.dispatcher;
    let mut last_error = String::from("no account is available to fetch the model catalog");
    for id in d.fleet.plan("", None).order {
        let Ok(identity) = d.fleet.ensure_fresh(&id, None, d.upstream.as_ref()).await else {
            continue;
        };
        match d
            .upstream
            .models(&identity, &d.upstream.config().client_version)
            .await
        {
            Ok(v) if v["models"].is_array() => {
                *state.models_cache.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((now, v.clone()));
                return Ok(v);
            }
            Ok(_) => last_error = "the model catalog has no `models` list".into(),
            Err(f) => last_error = f.summary(),
        }
    }
    match cached {
        Some((_, v)) => Ok(v),
        None => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("models_unavailable"),
            format!("cannot fetch the model catalog: {last_error}"),
        )),
    }
}
