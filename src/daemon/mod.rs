//! The composition root: open the store, load the pool, bind the listeners, serve until told
//! to stop, then shut down in a fixed order.
//!
//! Start-up: state directory checks and store lock -> accounts and keys loaded -> TCP listener
//! and admin socket bound -> servers spawned -> `READY=1`.
//! Shutdown (graceful, SIGTERM): `STOPPING=1` -> `/readyz` answers 503 -> listeners stop
//! accepting -> requests in flight get `shutdown_grace` to finish (connections stay open
//! meanwhile) -> what still runs is cut, each with a terminal event and a record -> the store
//! writer commits what it holds and stops -> the admin socket file is removed -> exit 0.
//! Fast (SIGINT): the same with no grace period.

pub mod fds;
pub mod jobs;
pub mod listen;
pub mod reload;
pub mod signals;
pub mod systemd;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState};
use crate::base::clock::SharedClock;
use crate::config::{Config, Source};
use crate::dispatch::Dispatcher;
use crate::fleet::Fleet;
use crate::keys::KeyRing;
use crate::keys::usage::UsageBook;
use crate::store::{Store, StoreError};
use crate::telemetry::records::RequestLog;
use crate::upstream::Upstream;

pub use self::listen::{Listeners, bind, bind_with};
use self::reload::{LiveConfig, dispatch_config};
pub use self::signals::ShutdownKind;
use self::systemd::Notifier;

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("another switchyard is already serving the admin socket {0}")]
    SocketInUse(PathBuf),
    #[error("{0}")]
    Upstream(String),
    #[error("cannot create the admin socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The application state over an open store, as `config` describes it.
fn app_state(
    store: Store,
    config: &Config,
    clock: SharedClock,
    listen: String,
) -> Result<AppState, BootError> {
    let fleet = Fleet::load_with(store.clone(), Arc::clone(&clock), config.scheduling.clone())?;
    fleet.set_rules(config.rules.clone());
    match fleet.affinity.load(&store) {
        Ok((sessions, responses)) => tracing::info!(sessions, responses, "affinity restored"),
        Err(e) => tracing::warn!(error = %e, "cannot restore affinity"),
    }
    let keys = KeyRing::load(store.clone(), Arc::clone(&clock))?;
    let usage = UsageBook::load(store.clone(), Arc::clone(&clock))?;
    let upstream = Arc::new(Upstream::new(&config.upstream).map_err(BootError::Upstream)?);
    let log = RequestLog::load(store.clone(), Arc::clone(&clock));
    let dispatcher = Dispatcher::new(
        fleet.clone(),
        upstream,
        log,
        (keys.clone(), usage),
        dispatch_config(config),
    );
    let mut state = AppState::new(
        store,
        fleet,
        keys,
        dispatcher,
        clock,
        listen,
        config.admin.token.clone(),
        usize::try_from(config.server.max_body_bytes).unwrap_or(usize::MAX),
    );
    *state
        .metrics_token
        .get_mut()
        .unwrap_or_else(|e| e.into_inner()) = config.admin.metrics_token.clone();
    state.key_memory = crate::keys::memory::MemoryLedger::new(config.server.key_memory_bytes());
    state.body_limits = crate::api::BodyLimits {
        timeout: config.server.body_timeout,
        min_rate: config.server.body_min_rate,
    };
    state.ws = crate::api::ws::WsLimits {
        first_message_timeout: config.server.ws_first_message_timeout,
        idle_timeout: config.server.ws_idle_timeout,
        max_connections_per_key: config.server.ws_max_connections_per_key.max(1),
    };
    Ok(state)
}

/// Serves until `shutdown` resolves, then shuts down in order. `notifier` gets `READY=1` once
/// the servers are running and `STOPPING=1` when shutdown begins.
pub async fn run(
    store: Store,
    config: Config,
    clock: SharedClock,
    listeners: Listeners,
    notifier: Notifier,
    shutdown: impl Future<Output = ShutdownKind>,
) -> Result<(), BootError> {
    run_with(store, config, None, clock, listeners, notifier, shutdown).await
}

/// [`run`], with the configuration's source: SIGHUP then reads it again and applies it
/// (`RELOADING=1`, then `READY=1` once applied).
pub async fn run_with(
    store: Store,
    config: Config,
    source: Option<Source>,
    clock: SharedClock,
    listeners: Listeners,
    notifier: Notifier,
    shutdown: impl Future<Output = ShutdownKind>,
) -> Result<(), BootError> {
    let listen = listeners
        .http_addr()
        .map_or_else(|| config.server.listen.to_string(), |a| a.to_string());
    let mut state = app_state(store.clone(), &config, clock, listen.clone())?;
    let hangups = source.is_some();
    let live = Arc::new(LiveConfig::new(config.clone(), source, notifier.clone()));
    state.reloader = Some(Arc::clone(&live) as Arc<dyn api::Reloader>);
    let state = Arc::new(state);
    let hangups = hangups.then(|| reload::on_sighup(Arc::clone(&state), Arc::clone(&live)));
    let stop_accepting = CancellationToken::new();

    let limits = api::server::Limits {
        header_read_timeout: config.server.header_read_timeout,
        keepalive_idle_timeout: config.server.keepalive_idle_timeout,
        client_write_timeout: config.server.client_write_timeout,
        max_connections: fds::start(config.server.max_connections),
    };
    let http = tokio::spawn(api::server::serve(
        listeners.http,
        api::Edge::new(Arc::clone(&state)),
        limits,
        Arc::clone(&state.edge),
        stop_accepting.clone(),
    ));
    let admin = spawn_server(
        "admin",
        axum::serve(listeners.admin, api::admin_router(Arc::clone(&state)))
            .with_graceful_shutdown(stop_accepting.clone().cancelled_owned()),
    );
    tracing::info!(
        listen = %listen,
        admin_socket = %listeners.admin_path.display(),
        accounts = state.fleet.len(),
        version = env!("CARGO_PKG_VERSION"),
        "switchyard serving"
    );
    notifier.notify_or_log("READY=1");

    start_notifications(&state, &config);
    let background = jobs::spawn_all(&state, &live, &notifier, stop_accepting.clone());

    let kind = shutdown.await;
    tracing::info!(?kind, "shutting down");
    if let Some(h) = hangups {
        h.abort();
    }
    notifier.notify_or_log("STOPPING=1");
    state.start_draining();
    // Consoles are told at once; they reconnect to the next daemon.
    state.feed.close();
    stop_accepting.cancel();
    let grace = match kind {
        ShutdownKind::Graceful => live.current().server.shutdown_grace,
        ShutdownKind::Fast => Duration::ZERO,
    };
    drain(&state, http, grace).await;
    drain_admin(admin).await;
    for task in background {
        task.abort();
    }
    match state.fleet.affinity.save(&store).await {
        Ok((sessions, responses)) => tracing::info!(sessions, responses, "affinity saved"),
        Err(e) => tracing::warn!(error = %e, "cannot save affinity"),
    }
    // Every request has ended: their usage is complete.
    if let Err(e) = state.dispatcher.usage.flush().await {
        tracing::error!(error = %e, "cannot write the last usage totals");
    }
    store.close().await?;
    let _ = std::fs::remove_file(&listeners.admin_path);
    tracing::info!("stopped");
    Ok(())
}

fn spawn_server<F>(name: &'static str, server: F) -> JoinHandle<()>
where
    F: std::future::IntoFuture<Output = std::io::Result<()>> + Send + 'static,
    F::IntoFuture: Send,
{
    tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(server = name, error = %e, "server stopped with an error");
        }
    })
}

/// How long the requests cut at the end of the grace period get to send their last frames.
const CUT_FLUSH: Duration = Duration::from_secs(3);

/// Waits up to `grace` for the client connections (HTTP and WebSocket) to finish what they
/// have in flight. Then the requests still running are cut — each ends with `response.failed`
/// `server_shutting_down` (or a 503 before its commit) and a record — and what is left of the
/// connections after [`CUT_FLUSH`] is closed.
async fn drain(state: &AppState, http: JoinHandle<()>, grace: Duration) {
    let mut http = Some(http);
    if tokio::time::timeout(grace, closed(state, &mut http))
        .await
        .is_ok()
    {
        return;
    }
    tracing::warn!(
        ?grace,
        "grace period over; cutting the requests still running"
    );
    state.dispatcher.cut();
    let flushed = async {
        state.dispatcher.settled().await;
        closed(state, &mut http).await;
    };
    if tokio::time::timeout(CUT_FLUSH, flushed).await.is_err() {
        tracing::warn!("closing the client connections still open");
        if let Some(http) = http {
            http.abort();
            let _ = http.await;
        }
        // Their requests now find their clients gone: let them keep their records.
        let _ = tokio::time::timeout(CUT_FLUSH, state.dispatcher.settled()).await;
    }
}

/// Starts the `[[notify]]` deliveries, their secrets opened with the state's key; a target
/// whose secret cannot be opened is left out (and said so).
fn start_notifications(state: &Arc<AppState>, config: &Config) {
    let mut targets = config.notify.clone();
    if targets.is_empty() {
        return;
    }
    if let Err(e) = crate::notify::open_sealed(&mut targets, state.store.sealer()) {
        tracing::error!(error = %e, "notifications are off");
        return;
    }
    let d = state.dispatcher.clone();
    let on_outcome: crate::notify::OnOutcome =
        Arc::new(move |target, outcome| d.metrics.notification(target, outcome));
    let n = crate::notify::Notifier::start(targets, on_outcome);
    tracing::info!(targets = config.notify.len(), "notifications on");
    state.dispatcher.set_notifier(n);
}

/// Resolves once the HTTP server has closed its connections and every WebSocket connection
/// has ended.
async fn closed(state: &AppState, http: &mut Option<JoinHandle<()>>) {
    if let Some(task) = http.as_mut() {
        let _ = task.await;
        *http = None;
    }
    state.ws_open.close();
    state.ws_open.wait().await;
}

/// Gives admin calls in flight a moment, then closes the admin socket.
async fn drain_admin(mut admin: JoinHandle<()>) {
    if tokio::time::timeout(CUT_FLUSH, &mut admin).await.is_err() {
        admin.abort();
        let _ = admin.await;
    }
}
