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

use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState};
use crate::base::clock::SharedClock;
use crate::config::Config;
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::fleet::Fleet;
use crate::keys::KeyRing;
use crate::store::{Store, StoreError};
use crate::systemd::{self, Notifier};
use crate::telemetry::records::RequestLog;
use crate::upstream::Upstream;
use crate::usage::UsageBook;

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

/// How to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownKind {
    /// Stop accepting, let in-flight work finish within the grace period.
    Graceful,
    /// Stop now.
    Fast,
}

/// The bound listeners.
pub struct Listeners {
    pub http: TcpListener,
    pub admin: UnixListener,
    pub admin_path: PathBuf,
}

impl Listeners {
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.local_addr().ok()
    }
}

/// Binds the client listener and the admin socket (mode 0660). A stale socket file left by a
/// crash is replaced; one that a live daemon answers on is an error.
pub async fn bind(listen: SocketAddr, admin_path: &Path) -> Result<Listeners, BootError> {
    bind_with(None, listen, admin_path).await
}

/// [`bind`], taking the client listener systemd passed (socket activation) when there is one:
/// it stays open across restarts, so a client connecting meanwhile waits instead of being
/// refused.
pub async fn bind_with(
    activated: Option<std::net::TcpListener>,
    listen: SocketAddr,
    admin_path: &Path,
) -> Result<Listeners, BootError> {
    let http = match activated {
        Some(l) => {
            let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
            let taken = l
                .set_nonblocking(true)
                .and_then(|()| TcpListener::from_std(l))
                .map_err(|source| BootError::Listen {
                    addr: addr.clone(),
                    source,
                })?;
            if addr != listen.to_string() {
                tracing::info!(
                    socket = %addr,
                    configured = %listen,
                    "serving on the socket systemd passed; [server] listen is not used"
                );
            }
            taken
        }
        None => TcpListener::bind(listen)
            .await
            .map_err(|source| BootError::Listen {
                addr: listen.to_string(),
                source,
            })?,
    };
    let socket_err = |source| BootError::Socket {
        path: admin_path.to_path_buf(),
        source,
    };
    if admin_path.exists() {
        if tokio::net::UnixStream::connect(admin_path).await.is_ok() {
            return Err(BootError::SocketInUse(admin_path.to_path_buf()));
        }
        std::fs::remove_file(admin_path).map_err(socket_err)?;
    }
    if let Some(parent) = admin_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(socket_err)?;
    }
    let admin = UnixListener::bind(admin_path).map_err(socket_err)?;
    std::fs::set_permissions(admin_path, std::fs::Permissions::from_mode(0o660))
        .map_err(socket_err)?;
    Ok(Listeners {
        http,
        admin,
        admin_path: admin_path.to_path_buf(),
    })
}

/// The dispatcher's tunables from the config.
pub fn dispatch_config(config: &Config) -> DispatchConfig {
    DispatchConfig {
        keepalive_after: config.server.keepalive_after,
        stream_idle_timeout: config.upstream.stream_idle_timeout,
        first_output_timeout: Some(config.upstream.first_output_timeout).filter(|d| !d.is_zero()),
        aliases: config.models.aliases.clone(),
        request_deadline: config.upstream.request_deadline,
        client_write_timeout: config.server.client_write_timeout,
        probe_model: config.upstream.probe_model.clone(),
        first_output_switches: config.upstream.first_output_switches,
        access_log: config.log.access,
        ..DispatchConfig::default()
    }
}

/// Builds the application state over an open store.
pub fn build_state(
    store: Store,
    config: &Config,
    clock: SharedClock,
    listen: String,
) -> Result<Arc<AppState>, BootError> {
    app_state(store, config, clock, listen).map(Arc::new)
}

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
    state.started_config = Arc::new(config.clone());
    *state.config.get_mut().unwrap_or_else(|e| e.into_inner()) = Arc::new(config.clone());
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
    source: Option<crate::config::Source>,
    clock: SharedClock,
    listeners: Listeners,
    notifier: Notifier,
    shutdown: impl Future<Output = ShutdownKind>,
) -> Result<(), BootError> {
    let listen = listeners
        .http_addr()
        .map_or_else(|| config.server.listen.to_string(), |a| a.to_string());
    let mut state = app_state(store.clone(), &config, clock, listen.clone())?;
    state.notifier = notifier.clone();
    state.config_source = source;
    let state = Arc::new(state);
    let hangups = state
        .config_source
        .is_some()
        .then(|| crate::reload::on_sighup(Arc::clone(&state)));
    let stop_accepting = CancellationToken::new();

    let limits = api::server::Limits {
        header_read_timeout: config.server.header_read_timeout,
        keepalive_idle_timeout: config.server.keepalive_idle_timeout,
        client_write_timeout: config.server.client_write_timeout,
        max_connections: config.server.max_connections,
    };
    let http = tokio::spawn(api::server::serve(
        listeners.http,
        api::router(Arc::clone(&state)),
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

    let background = spawn_background(&state, stop_accepting.clone());
    let watchdog = systemd::watchdog_interval().map(|every| {
        let notifier = notifier.clone();
        let store = store.clone();
        let stop = stop_accepting.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {
                        // Only a gateway whose store answers is alive.
                        if store.ping().is_ok() {
                            notifier.notify_or_log("WATCHDOG=1");
                        }
                    }
                }
            }
        })
    });

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
        ShutdownKind::Graceful => state.current_config().server.shutdown_grace,
        ShutdownKind::Fast => Duration::ZERO,
    };
    drain(&state, http, grace).await;
    drain_admin(admin).await;
    if let Some(w) = watchdog {
        w.abort();
    }
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

/// The periodic work of the daemon: proactive token refresh and record pruning.
fn spawn_background(state: &Arc<AppState>, stop: CancellationToken) -> Vec<JoinHandle<()>> {
    let refresher = {
        let d = state.dispatcher.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {
                        for id in d.fleet.due_for_refresh() {
                            if let Err(e) = d.fleet.ensure_fresh(&id, None, d.upstream.as_ref()).await {
                                tracing::warn!(account = %id, error = ?e, "proactive refresh failed");
                            }
                        }
                    }
                }
            }
        })
    };
    let pruner = {
        let state = Arc::clone(state);
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(3600));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {
                        // Read at every round: a reload may change them.
                        let storage = state.current_config().storage.clone();
                        state.dispatcher.log.prune(storage.request_retention_days);
                        state.dispatcher.usage.prune(storage.usage_retention_days);
                    }
                }
            }
        })
    };
    let usage_flusher = state.dispatcher.usage.spawn_flusher(stop.clone());
    let snapshots = {
        let fleet = state.fleet.clone();
        let store = state.store.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(AFFINITY_SNAPSHOT_EVERY);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {
                        if let Err(e) = fleet.affinity.save(&store).await {
                            tracing::warn!(error = %e, "cannot save affinity");
                        }
                    }
                }
            }
        })
    };
    let poller = state.dispatcher.spawn_usage_poller(stop.clone());
    let feed = {
        let state = Arc::clone(state);
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::telemetry::feed::TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                if state.feed.subscribers() == 0 {
                    // Nobody watches: no tick until a console attaches.
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        () = state.feed.first_subscriber() => {}
                    }
                    tick.reset();
                }
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let Some(seen) = state.feed.oldest_seen() else {
                    continue;
                };
                let (requests, total) = state
                    .dispatcher
                    .log
                    .newer_than(seen, crate::telemetry::records::RING);
                state.feed.publish(&state.feed_state(&requests), total);
            }
        })
    };
    let mut tasks = vec![refresher, pruner, usage_flusher, snapshots, poller, feed];
    tasks.extend(
        state
            .fleet
            .spawn_sweepers(Duration::from_secs(60), stop.clone()),
    );
    tasks.extend(
        state
            .dispatcher
            .spawn_sweepers(Duration::from_secs(60), stop),
    );
    tasks
}

/// How often session affinity is written to the store (and at shutdown).
pub const AFFINITY_SNAPSHOT_EVERY: Duration = Duration::from_secs(60);

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

/// SIGTERM -> graceful, SIGINT -> fast. The handlers are installed when this is called (not
/// when the future is first polled), so a signal that arrives right after `READY=1` is caught.
pub fn signals() -> impl Future<Output = ShutdownKind> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut term), Ok(mut int)) = handlers else {
            tracing::error!("cannot install signal handlers; stop with SIGKILL");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => ShutdownKind::Graceful,
            _ = int.recv() => ShutdownKind::Fast,
        }
    }
}
