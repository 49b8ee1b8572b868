//! `switchyard demo`: the whole product on one machine, with nothing to set up.
//!
//! One process holds everything, on loopback, in a fresh temporary directory (mode 0700,
//! removed with everything in it on every way out — a normal exit, an error, SIGINT, SIGTERM,
//! SIGHUP):
//!
//! - the simulator ([`crate::sim`]) on 127.0.0.1:0 with [`ACCOUNTS`] accounts under
//!   [`Profile::Demo`]: `sim-acct-1` runs out of quota after 5 requests, `sim-acct-2` answers a
//!   burst 429 to every 4th request, `sim-acct-3` drops every 3rd stream mid-turn, the others
//!   are healthy; streams are paced so turns take about a second;
//! - a fault injector ([`crate::sim::injector`]) that keeps incidents coming after the scripted ones have played out
//!   (a short quota on a healthy account that then recovers, WebSocket closes mid-turn, extra
//!   bursts) and rolls over 5-hour windows that the traffic has filled, so the console never
//!   goes quiet;
//! - the gateway, built by the same functions as `switchyard serve` (`daemon::bind`,
//!   `daemon::run`) over a store in the directory, with the simulator's accounts imported,
//!   one client key, and a small `max_concurrency` so that queues form;
//! - synthetic clients ([`crate::sim::traffic`]): [`SSE_SESSIONS`] sessions over HTTP/SSE and [`WS_SESSIONS`] over the
//!   Responses WebSocket (with `previous_response_id` continuations), each a run of
//!   conversations of a few turns with pauses between them;
//! - the console, attached to the admin socket. When the operator quits it, everything stops.
//!
//! With `--no-console` the endpoints are printed instead, one per line (`gateway URL`, `admin
//! SOCKET`, `key KEY`, `state DIR`, `log FILE`), and the demo runs until SIGINT, SIGTERM or
//! SIGHUP. Logs never reach the terminal: they go to `switchyard.log` in the directory.
//!
//! Shutdown order: traffic stops, the gateway drains (the daemon's own order: listeners, grace,
//! store close, socket file), the simulator stops, the directory is removed.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::base::clock::{self, SharedClock};
use crate::config::Config;
use crate::daemon::signals::Signal;
use crate::daemon::systemd::Notifier;
use crate::daemon::{self, BootError, ShutdownKind};
use crate::fleet::{Fleet, FleetError};
use crate::keys::{KeyError, KeyRing};
use crate::sim::injector::inject_faults;
use crate::sim::traffic::Traffic;
use crate::sim::{Profile, Sim, SimHandle, SimOptions};
use crate::store::{Store, StoreError};

/// Simulated accounts: the three of [`Profile::Demo`]'s faults and two healthy ones.
pub const ACCOUNTS: u32 = 5;
/// Synthetic sessions over HTTP/SSE.
pub const SSE_SESSIONS: usize = 4;
/// Synthetic sessions over the Responses WebSocket.
pub const WS_SESSIONS: usize = 4;
/// Concurrent requests per account: small, so that sessions wait for slots.
pub const MAX_CONCURRENCY: u32 = 2;

const LOG_FILE: &str = "switchyard.log";
/// How long stopped traffic tasks get to finish before they are aborted.
const TRAFFIC_STOP_GRACE: Duration = Duration::from_secs(2);

/// How to run the demo.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Open the console; otherwise print the endpoints and wait for a signal.
    pub console: bool,
    /// Stop by itself after this long.
    pub duration: Option<Duration>,
    /// `tracing` filter for the log file (`RUST_LOG` overrides it).
    pub log_level: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot create the demo directory under {dir}: {source}")]
    TempDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the demo log {path}: {source}")]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("simulator: {0}")]
    Sim(std::io::Error),
    #[error("the simulator has no account {0}")]
    SimAccount(String),
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("the gateway stopped unexpectedly: {0}")]
    Gateway(String),
    #[error("console: {0} (without a terminal, use `switchyard demo --no-console`)")]
    Console(switchyard_tui::Error),
}

/// A directory that is removed, with everything in it, when dropped.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<temp dir>/<prefix>-<pid>-<random>` with mode 0700.
    pub fn new(prefix: &str) -> std::io::Result<TempDir> {
        let base = std::env::temp_dir();
        let mut last = None;
        for _ in 0..16 {
            let n = getrandom::u64().unwrap_or_else(|_| clock::system().now_ms());
            let path = base.join(format!("{prefix}-{}-{n:016x}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    let dir = TempDir { path };
                    // The mode asked for is filtered by the umask; this one is exact.
                    std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o700))?;
                    return Ok(dir);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Runs the demo until the console is closed, a signal arrives, or `duration` is over; then
/// stops everything and removes its directory.
pub async fn run(opts: DemoOptions) -> Result<(), DemoError> {
    // Installed first, so a signal at any point below is caught rather than killing the
    // process with the directory still there.
    // SIGTERM -> graceful; SIGINT, or SIGHUP (the terminal went away, e.g. an SSH session
    // closed) -> fast. Without the last, a hang-up would kill the demo and leave its directory.
    let mut signals = pin!(daemon::signals::stop_on(&[
        Signal::Terminate,
        Signal::Interrupt,
        Signal::Hangup
    ]));
    let dir = TempDir::new("switchyard-demo").map_err(|source| DemoError::TempDir {
        dir: std::env::temp_dir(),
        source,
    })?;
    let log = dir.path().join(LOG_FILE);
    init_file_logging(&log, &opts.log_level)?;

    let mut demo = tokio::select! {
        r = Demo::start(dir.path()) => r?,
        _ = &mut signals => return Ok(()),
    };
    tracing::info!(
        gateway = %demo.addr,
        admin_socket = %demo.socket.display(),
        dir = %dir.path().display(),
        "demo running"
    );

    let deadline = async {
        match opts.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let why = if opts.console {
        let console = switchyard_tui::run(switchyard_admin::Target::Socket(demo.socket.clone()));
        tokio::select! {
            r = console => Why::Console(r),
            kind = &mut signals => Why::Signal(kind),
            () = deadline => Why::Elapsed,
            r = demo.gateway_exit() => Why::GatewayExited(r),
        }
    } else {
        print_endpoints(&demo, dir.path(), &log);
        tokio::select! {
            kind = &mut signals => Why::Signal(kind),
            () = deadline => Why::Elapsed,
            r = demo.gateway_exit() => Why::GatewayExited(r),
        }
    };
    tracing::info!(why = why.name(), "demo stopping");
    let kind = match &why {
        Why::Signal(kind) => *kind,
        _ => ShutdownKind::Graceful,
    };
    let stopped = demo.stop(kind).await;
    tracing::info!("demo stopped");
    drop(dir);
    match why {
        Why::Console(Err(e)) => Err(DemoError::Console(e)),
        Why::GatewayExited(r) => r.and(Err(DemoError::Gateway("exited".into()))),
        _ => stopped,
    }
}

/// Why the demo ends.
enum Why {
    Console(Result<(), switchyard_tui::Error>),
    Signal(ShutdownKind),
    Elapsed,
    GatewayExited(Result<(), DemoError>),
}

impl Why {
    fn name(&self) -> &'static str {
        match self {
            Why::Console(_) => "console closed",
            Why::Signal(_) => "signal",
            Why::Elapsed => "duration elapsed",
            Why::GatewayExited(_) => "gateway exited",
        }
    }
}

/// The readiness lines of `--no-console`. A closed stdout does not stop the demo.
fn print_endpoints(demo: &Demo, dir: &Path, log: &Path) {
    let text = format!(
        "gateway http://{}\nadmin {}\nkey {}\nstate {}\nlog {}\n",
        demo.addr,
        demo.socket.display(),
        demo.key,
        dir.display(),
        log.display()
    );
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// Logs to `path` (mode 0600), never to the terminal: the console owns it.
fn init_file_logging(path: &Path, level: &str) -> Result<(), DemoError> {
    use tracing_subscriber::EnvFilter;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| DemoError::Log {
            path: path.to_path_buf(),
            source,
        })?;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // A second initialisation (a test calling `run` twice) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::sync::Mutex::new(file))
        .with_ansi(false)
        .try_init();
    Ok(())
}

/// The running parts.
struct Demo {
    sim: SimHandle,
    addr: SocketAddr,
    socket: PathBuf,
    key: String,
    gateway: Option<JoinHandle<Result<(), BootError>>>,
    gateway_stop: Option<oneshot::Sender<ShutdownKind>>,
    /// Stops the traffic and the fault injector.
    traffic_stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Demo {
    async fn start(dir: &Path) -> Result<Demo, DemoError> {
        crate::upstream::install_crypto_provider();
        let sim = Sim::start(SimOptions {
            accounts: ACCOUNTS,
            profile: Some(Profile::Demo),
            ..SimOptions::default()
        })
        .await
        .map_err(DemoError::Sim)?;
        let gw = match start_gateway(dir, &sim).await {
            Ok(gw) => gw,
            Err(e) => {
                sim.stop();
                return Err(e);
            }
        };
        let traffic_stop = CancellationToken::new();
        let mut tasks =
            Traffic::spawn(gw.addr, &gw.key, (SSE_SESSIONS, WS_SESSIONS), &traffic_stop);
        tasks.push(tokio::spawn(inject_faults(
            sim.sim.clone(),
            traffic_stop.clone(),
        )));
        Ok(Demo {
            sim,
            addr: gw.addr,
            socket: gw.socket,
            key: gw.key,
            gateway: Some(gw.task),
            gateway_stop: Some(gw.stop),
            traffic_stop,
            tasks,
        })
    }

    /// Resolves when the gateway task ends (it only does on its own after a failure).
    async fn gateway_exit(&mut self) -> Result<(), DemoError> {
        let Some(task) = self.gateway.as_mut() else {
            return std::future::pending().await;
        };
        let r = task.await;
        self.gateway = None;
        match r {
            Ok(r) => Ok(r?),
            Err(e) => Err(DemoError::Gateway(e.to_string())),
        }
    }

    /// Traffic first (so nothing is cut mid-turn by the gateway), then the gateway (drained
    /// and its store closed), then the simulator.
    async fn stop(mut self, kind: ShutdownKind) -> Result<(), DemoError> {
        self.traffic_stop.cancel();
        for mut task in std::mem::take(&mut self.tasks) {
            if tokio::time::timeout(TRAFFIC_STOP_GRACE, &mut task)
                .await
                .is_err()
            {
                task.abort();
                let _ = task.await;
            }
        }
        if let Some(tx) = self.gateway_stop.take() {
            let _ = tx.send(kind);
        }
        let result = match self.gateway.take() {
            Some(task) => match task.await {
                Ok(r) => r.map_err(DemoError::from),
                Err(e) => Err(DemoError::Gateway(e.to_string())),
            },
            None => Ok(()),
        };
        self.sim.stop();
        result
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        // An early exit (an error, a panic) still stops the parts.
        self.traffic_stop.cancel();
        if let Some(tx) = self.gateway_stop.take() {
            let _ = tx.send(ShutdownKind::Fast);
        }
        self.sim.stop();
    }
}

/// A started gateway.
struct Gateway {
    addr: SocketAddr,
    socket: PathBuf,
    key: String,
    task: JoinHandle<Result<(), BootError>>,
    stop: oneshot::Sender<ShutdownKind>,
}

/// Opens the store, imports the simulator's accounts, creates the client key, binds and
/// spawns `daemon::run`.
async fn start_gateway(dir: &Path, sim: &SimHandle) -> Result<Gateway, DemoError> {
    let state_dir = dir.join("state");
    let socket = dir.join(crate::config::ADMIN_SOCKET_FILE);
    let config = demo_config(sim, &state_dir, &socket);
    let clock: SharedClock = clock::system();
    let store = Store::open(&state_dir)?;
    let prepared = async {
        let key = populate(&store, &sim.sim, &clock).await?;
        let listeners = daemon::bind(config.server.listen, &socket).await?;
        let addr = listeners
            .http_addr()
            .ok_or_else(|| DemoError::Gateway("the listener has no local address".into()))?;
        Ok::<_, DemoError>((key, listeners, addr))
    }
    .await;
    let (key, listeners, addr) = match prepared {
        Ok(p) => p,
        Err(e) => {
            let _ = store.close().await;
            return Err(e);
        }
    };
    let (stop_tx, stop_rx) = oneshot::channel();
    let gateway = tokio::spawn(daemon::run(
        store,
        config,
        clock,
        listeners,
        Notifier::default(),
        async move { stop_rx.await.unwrap_or(ShutdownKind::Fast) },
    ));
    Ok(Gateway {
        addr,
        socket,
        key,
        task: gateway,
        stop: stop_tx,
    })
}

/// The gateway's configuration: defaults, pointed at the simulator, everything else in `dir`.
fn demo_config(sim: &SimHandle, state_dir: &Path, socket: &Path) -> Config {
    let mut c = Config::default();
    c.server.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    c.server.shutdown_grace = Duration::from_secs(2);
    c.storage.state_dir = Some(state_dir.to_path_buf());
    c.admin.socket = Some(socket.to_path_buf());
    c.upstream.base_url = sim.base_url();
    c.upstream.usage_url = sim.usage_url();
    c.upstream.oauth_token_url = sim.oauth_token_url();
    c.scheduling.max_concurrency = MAX_CONCURRENCY;
    // Short enough that a session stuck behind a busy account is seen to rebind.
    c.scheduling.sticky_wait = Duration::from_secs(8);
    // Quota bars that follow the traffic.
    c.scheduling.usage_poll_interval = Duration::from_secs(30);
    c
}

/// Imports every simulated account and creates the demo's client key (returned).
async fn populate(store: &Store, sim: &Sim, clock: &SharedClock) -> Result<String, DemoError> {
    let fleet = Fleet::load(store.clone(), Arc::clone(clock))?;
    for id in sim.account_ids() {
        let auth = sim
            .auth_json(&id)
            .ok_or_else(|| DemoError::SimAccount(id.clone()))?;
        fleet
            .import(fleet.parse_auth(auth.to_string().as_bytes())?)
            .await?;
    }
    let keys = KeyRing::load(store.clone(), Arc::clone(clock))?;
    Ok(keys.create("demo", &Default::default()).await?.key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temp_dir_is_private_and_removed_on_drop() {
        let dir = TempDir::new("switchyard-demo-test").unwrap();
        let path = dir.path().to_path_buf();
        std::fs::write(path.join("f"), b"x").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn every_injection_names_an_account_of_the_pool() {
        assert!(
            crate::sim::injector::injections()
                .iter()
                .all(|i| u32::try_from(i.account).unwrap() < ACCOUNTS)
        );
    }
}
