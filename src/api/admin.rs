//! The admin API (DESIGN §8): on the Unix socket without a token, and on the main listener
//! only when an admin token is configured.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use switchyard_admin::wire;

use super::AppState;
use super::error::ApiError;
use super::view;
use crate::fleet::health::AccountState;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/admin/status", get(status))
        .route(
            "/api/admin/accounts",
            get(list_accounts).post(import_account),
        )
        .route(
            "/api/admin/accounts/{id}",
            get(get_account).delete(remove_account).put(update_account),
        )
        .route("/api/admin/settings", get(get_settings).put(put_settings))
        .route("/api/admin/accounts/{id}/enable", post(enable_account))
        .route("/api/admin/accounts/{id}/disable", post(disable_account))
        .route("/api/admin/accounts/{id}/drain", post(drain_account))
        .route("/api/admin/accounts/{id}/undrain", post(undrain_account))
        .route(
            "/api/admin/accounts/{id}/clear-cooldown",
            post(clear_cooldown),
        )
        .route("/api/admin/accounts/{id}/refresh", post(refresh_account))
        .route("/api/admin/accounts/{id}/probe", post(probe_account))
        .route("/api/admin/accounts/{id}/reset-window", post(reset_window))
        .route("/api/admin/accounts/{id}/export", post(export_account))
        .route("/api/admin/requests", get(requests))
        .route("/api/admin/console", get(console))
        .route("/api/admin/keys", get(list_keys).post(create_key))
        .route(
            "/api/admin/keys/{id}",
            get(show_key).patch(update_key).delete(revoke_key),
        )
        .route("/api/admin/usage", get(usage))
        .route("/api/admin/report", get(report))
        .route("/api/admin/reload", post(reload))
        .route("/api/admin/backup", get(backup))
        .route("/api/admin/doctor", get(doctor))
}

/// The store as the daemon sees it: a full scan now, and every row quarantined since start.
async fn doctor(State(state): State<Arc<AppState>>) -> Result<Json<wire::StoreReport>, ApiError> {
    let store = state.store.clone();
    let scan = tokio::task::spawn_blocking(move || store.scan())
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(Json(view::store_report(&state.store, scan)))
}

#[derive(Debug, serde::Deserialize)]
struct BackupQuery {
    #[serde(default)]
    include_key: bool,
}

/// A backup of the store taken now, while serving (`store::backup`): usage totals not yet
/// written are written first, then one read transaction is copied into a file in the state
/// directory, which is streamed out and removed. `secret.key` only when asked for.
async fn backup(
    State(state): State<Arc<AppState>>,
    axum::extract::Query(q): axum::extract::Query<BackupQuery>,
) -> Result<Response, ApiError> {
    use futures_util::StreamExt;
    if let Err(e) = state.dispatcher.usage.flush().await {
        tracing::warn!(error = %e, "backup: the latest usage totals could not be written first");
    }
    state.store.flush().await?;
    let dir = state
        .store
        .path()
        .parent()
        .map(std::path::Path::to_path_buf)
        .ok_or_else(|| ApiError::internal("the store has no state directory"))?;
    let mut tag = [0u8; 6];
    getrandom::fill(&mut tag).map_err(|e| ApiError::internal(e.to_string()))?;
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = dir.join(format!(".backup-{tag}.redb"));
    let store = state.store.clone();
    let snapshot = {
        let tmp = tmp.clone();
        tokio::task::spawn_blocking(move || store.snapshot_to(&tmp))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
    };
    let (mut manifest, counts) = snapshot?;
    let key = if q.include_key {
        let k = crate::store::secrets::load_or_create_key(&dir, false)?;
        Some(k)
    } else {
        None
    };
    manifest.key_included = key.is_some();
    let file = tokio::fs::File::open(&tmp)
        .await
        .map_err(|e| ApiError::internal(format!("cannot read the snapshot: {e}")));
    // Unlinked at once: the open file stays readable until the stream ends.
    let _ = std::fs::remove_file(&tmp);
    let file = file?;
    tracing::info!(
        bytes = manifest.store_bytes,
        key_included = manifest.key_included,
        rows = ?counts,
        "backup taken"
    );
    let head = futures_util::stream::once(async move {
        Ok::<_, std::io::Error>(axum::body::Bytes::from(manifest.header()))
    });
    let tail = futures_util::stream::iter(
        key.map(|k| Ok::<_, std::io::Error>(axum::body::Bytes::copy_from_slice(&k))),
    );
    let body = head
        .chain(tokio_util::io::ReaderStream::new(file))
        .chain(tail);
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}

/// Reads the configuration again (the body, when there is one, is the file's text: what
/// `switchyard reload` sends, since the daemon's own copy may be stale) and applies it.
async fn reload(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Json<wire::Reloaded>, ApiError> {
    let text = if body.is_empty() {
        None
    } else {
        Some(
            std::str::from_utf8(&body)
                .map_err(|_| ApiError::bad_request("invalid_config", "the config is not UTF-8"))?,
        )
    };
    let reloader = state
        .reloader
        .as_ref()
        .ok_or_else(|| ApiError::internal("this server reads no configuration"))?;
    reloader
        .reload(&state, text)
        .map(Json)
        .map_err(|e| ApiError::bad_request("invalid_config", e))
}

/// Parses a JSON body, answering 400 with the parse position when it is not valid.
pub fn json_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("invalid JSON body: {e}")))
}

async fn status(State(state): State<Arc<AppState>>) -> Json<wire::Status> {
    Json(state.status())
}

async fn list_accounts(State(state): State<Arc<AppState>>) -> Json<Vec<wire::Account>> {
    Json(state.accounts())
}

async fn import_account(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let imported = state
        .fleet
        .import_auth(&body, state.dispatcher.upstream.as_ref())
        .await?;
    // Prove it before it takes requests, now rather than at the poller's next round.
    state.dispatcher.wake_prober();
    tracing::info!(account = %imported.account.id, created = imported.created, "account imported");
    let status = if imported.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view::imported(&imported))).into_response())
}

async fn remove_account(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Account>, ApiError> {
    let a = state.fleet.remove(&id).await?;
    tracing::info!(account = %a.id, "account removed");
    Ok(Json(view::account(&a)))
}

async fn enable_account(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Account>, ApiError> {
    Ok(Json(view::account(
        &state.fleet.set_enabled(&id, true).await?,
    )))
}

async fn disable_account(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Account>, ApiError> {
    Ok(Json(view::account(
        &state.fleet.set_enabled(&id, false).await?,
    )))
}

async fn drain_account(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Account>, ApiError> {
    Ok(Json(view::account(&state.fleet.set_draining(&id, true)?)))
}

async fn undrain_account(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Account>, ApiError> {
    Ok(Json(view::account(&state.fleet.set_draining(&id, false)?)))
}

async fn clear_cooldown(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Account>, ApiError> {
    Ok(Json(view::account(&state.fleet.clear_cooldown(&id).await?)))
}

async fn refresh_account(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Account>, ApiError> {
    let upstream = std::sync::Arc::clone(&state.dispatcher.upstream);
    Ok(Json(view::account(
        &state.fleet.refresh_account(&id, upstream.as_ref()).await?,
    )))
}

/// Probes an account now: its usage (which refreshes its quota); for a half-open account the
/// verdict that brings it back or cools it again; for an account not yet proved, its proof.
async fn probe_account(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Account>, ApiError> {
    let id = state.fleet.resolve(&id)?;
    let d = &state.dispatcher;
    let now = state.fleet.get(&id).map(|a| a.state);
    if now == Some(AccountState::HalfOpen) {
        d.probe(&id).await;
    } else if now == Some(AccountState::Probing) {
        d.prove(&id).await;
    } else {
        match d.poll_usage(&id).await {
            Err(f) => {
                return Err(ApiError::new(
                    axum::http::StatusCode::BAD_GATEWAY,
                    "server_error",
                    Some("probe_failed"),
                    format!("usage probe failed: {}", f.summary()),
                ));
            }
            // Banked credits: their list says when the soonest expires.
            Ok(snap) if snap.reset_credits.is_some_and(|n| n > 0) => {
                if let Err(e) = d.list_credits(&id).await {
                    tracing::debug!(account = %id, error = %e, "reset credits not listed");
                }
            }
            Ok(_) => {}
        }
    }
    state
        .fleet
        .get(&id)
        .map(|a| Json(view::account(&a)))
        .ok_or_else(|| ApiError::not_found("account removed"))
}

/// Spends one reset credit (the soonest to expire) on an account whose window is spent.
/// 409 `not_eligible` when its windows are not spent, it has a single window or no credit.
async fn reset_window(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::CreditSpend>, ApiError> {
    let id = state.fleet.resolve(&id)?;
    match state.dispatcher.spend_on_account(&id).await {
        Ok(spend) => Ok(Json(view::credit_spend(&spend, Some("operator"), None))),
        Err(why) => Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "invalid_request_error",
            Some("not_eligible"),
            format!("no reset credit spent on {id}: {why}"),
        )),
    }
}

/// The console feed: a snapshot, then updates; closed with 1013 when the subscriber fell
/// behind (it reconnects to a fresh snapshot).
async fn console(
    State(state): State<Arc<AppState>>,
    ws: axum::extract::ws::WebSocketUpgrade,
) -> Response {
    use axum::extract::ws::{CloseFrame, Message};
    ws.on_upgrade(move |mut socket| async move {
        let (recent, seen) = state.dispatcher.log.newer_than(0, 200);
        let mut rx = state.feed.subscribe(state.feed_state(&recent), seen);
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(m) => {
                        let text = serde_json::to_string(&m).unwrap_or_default();
                        if socket.send(Message::Text(text.into())).await.is_err() {
                            break;
                        }
                    }
                    None => {
                        let close = if state.feed.is_closed() {
                            CloseFrame {
                                code: 1001,
                                reason: "the daemon is stopping".into(),
                            }
                        } else {
                            CloseFrame {
                                code: 1013,
                                reason: "fell behind; reconnect for a fresh snapshot".into(),
                            }
                        };
                        let _ = socket.send(Message::Close(Some(close))).await;
                        break;
                    }
                },
                incoming = socket.recv() => match incoming {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break,
                    Some(Ok(_)) => {}
                },
            }
        }
    })
}

#[derive(serde::Deserialize)]
struct RequestsQuery {
    limit: Option<usize>,
}

async fn requests(
    State(state): State<Arc<AppState>>,
    axum::extract::Query(q): axum::extract::Query<RequestsQuery>,
) -> Json<Vec<wire::RequestRecord>> {
    let limit = q
        .limit
        .unwrap_or(50)
        .clamp(1, crate::telemetry::records::RING);
    Json(view::requests(&state.dispatcher.log.recent(limit)))
}

async fn update_account(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<wire::Account>, ApiError> {
    let patch: wire::AccountPatch = json_body(&body)?;
    if patch.max_concurrency == Some(Some(0)) {
        return Err(ApiError::bad_request(
            "invalid_value",
            "`max_concurrency` must be an integer of at least 1, or null",
        ));
    }
    let proxy_changed = patch.proxy.is_some();
    let account = state
        .fleet
        .set_account(&id, view::account_change(patch))
        .await?;
    if proxy_changed {
        // Idle upstream sockets went out the old way.
        state.dispatcher.ws_pool.evict(&account.id);
    }
    Ok(Json(view::account(&account)))
}

async fn get_settings(
    State(state): State<Arc<AppState>>,
) -> Json<crate::fleet::settings::Settings> {
    Json(state.fleet.settings())
}

async fn put_settings(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Json<crate::fleet::settings::Settings>, ApiError> {
    let v: serde_json::Value = json_body(&body)?;
    let (patch, resets) = crate::fleet::settings::patch_from_json(&v)
        .map_err(|e| ApiError::bad_request("invalid_settings", e))?;
    Ok(Json(state.fleet.update_settings(patch, &resets).await?))
}

async fn list_keys(State(state): State<Arc<AppState>>) -> Json<Vec<wire::Key>> {
    Json(view::keys(&state.keys.list()))
}

async fn create_key(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    let req: wire::CreateKey = json_body(&body)?;
    let created = state
        .keys
        .create(&req.name, &view::policy_patch(req.policy))
        .await?;
    tracing::info!(key = %created.info.id, name = %created.info.name, "client key created");
    Ok((StatusCode::CREATED, Json(view::created_key(&created))).into_response())
}

async fn revoke_key(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Key>, ApiError> {
    let k = state.keys.revoke(&id).await?;
    tracing::info!(key = %k.id, "client key revoked");
    Ok(Json(view::key(&k)))
}

/// One key by id or name.
async fn show_key(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Key>, ApiError> {
    Ok(Json(view::key(&state.keys.resolve(&id)?)))
}

/// Changes a key's policy (id or name): absent fields stay, `null` clears one.
async fn update_key(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<wire::Key>, ApiError> {
    let patch: wire::KeyPolicyPatch = json_body(&body)?;
    let k = state.keys.update(&id, &view::policy_patch(patch)).await?;
    tracing::info!(key = %k.id, name = %k.name, "client key policy changed");
    Ok(Json(view::key(&k)))
}

#[derive(serde::Deserialize)]
struct UsageQuery {
    /// Unix seconds; hours starting at or after it.
    from: u64,
    /// Unix seconds; hours starting before it.
    to: u64,
}

/// The hourly usage buckets of `[from, to)`, unflushed totals included.
async fn usage(
    State(state): State<Arc<AppState>>,
    axum::extract::Query(q): axum::extract::Query<UsageQuery>,
) -> Result<Json<Vec<wire::UsageBucket>>, ApiError> {
    let rows = state.dispatcher.usage.between(q.from, q.to)?;
    let names = state.keys.names();
    Ok(Json(
        rows.into_iter()
            .map(|r| view::usage_bucket(r, &names))
            .collect(),
    ))
}

#[derive(serde::Deserialize)]
struct ExportQuery {
    #[serde(default)]
    keep: bool,
}

/// The account's login as a Codex auth.json; the account is disabled here unless `keep`.
async fn export_account(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    axum::extract::Query(q): axum::extract::Query<ExportQuery>,
) -> Result<Json<wire::ExportedAccount>, ApiError> {
    Ok(Json(view::exported(
        &state.fleet.export(&id, q.keep).await?,
    )))
}

/// One account by its id, chatgpt_account_id, email or label.
async fn get_account(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Account>, ApiError> {
    let id = state.fleet.resolve(&id)?;
    let a = state
        .fleet
        .get(&id)
        .ok_or(crate::fleet::FleetError::NotFound(id))?;
    Ok(Json(view::account(&a)))
}

/// `GET /api/admin/report?window=20&window=60&slow_ms=30000` (windows in minutes, default 20
/// and 60): the error report of the stored records and the newest in memory.
async fn report(
    State(state): State<Arc<AppState>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Result<Json<switchyard_admin::report::Report>, ApiError> {
    let mut windows = Vec::new();
    let mut slow_ms = crate::telemetry::report::SLOW_FAILURE_MS;
    for pair in query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match (k, v.parse::<u64>()) {
            ("window", Ok(m)) if (1..=10_080).contains(&m) => windows.push(m),
            ("slow_ms", Ok(ms)) => slow_ms = ms,
            _ => {
                return Err(ApiError::bad_request(
                    "invalid_query",
                    format!("`{pair}`: use window=MINUTES (1 to 10080, repeated) and slow_ms=MS"),
                ));
            }
        }
    }
    if windows.is_empty() {
        windows = crate::telemetry::windows::WINDOWS.to_vec();
    }
    let names = crate::telemetry::report::names(&state.fleet.list());
    let recent = state.dispatcher.log.recent(crate::telemetry::records::RING);
    let scope = crate::telemetry::report::Scope {
        now_ms: state.fleet.clock().now_ms(),
        windows,
        slow_ms,
    };
    let r = crate::telemetry::report::from_store(&state.store, &recent, &scope, &names)?;
    Ok(Json(r))
}
