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
//! - a fault injector that keeps incidents coming after the scripted ones have played out
//!   (a short quota on a healthy account that then recovers, WebSocket closes mid-turn, extra
//!   bursts) and rolls over 5-hour windows that the traffic has filled, so the console never
//!   goes quiet;
//! - the gateway, built by the same functions as `switchyard serve` (`daemon::bind`,
//!   `daemon::run`) over a store in the directory, with the simulator's accounts imported,
//!   one client key, and a small `max_concurrency` so that queues form;
//! - synthetic clients: [`SSE_SESSIONS`] sessions over HTTP/SSE and [`WS_SESSIONS`] over the
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

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;

use crate::base::clock::{self, SharedClock};
use crate::config::Config;
use crate::daemon::signals::Signal;
use crate::daemon::systemd::Notifier;
use crate::daemon::{self, BootError, ShutdownKind};
use crate::fleet::{Fleet, FleetError};
use crate::keys::{KeyError, KeyRing};
use crate::sim::{Fault, FaultKind, Profile, Sim, SimHandle, SimOptions};
use crate::store::{Store, StoreError};

/// Simulated accounts: the three of [`Profile::Demo`]'s faults and two healthy ones.
pub const ACCOUNTS: u32 = 5;
/// Synthetic sessions over HTTP/SSE.
pub const SSE_SESSIONS: usize = 4;
/// Synthetic sessions over the Responses WebSocket.
pub const WS_SESSIONS: usize = 4;
/// Concurrent requests per account: small, so that sessions wait for slots.
pub const MAX_CONCURRENCY: u32 = 2;
/// When the fault injector first acts (the scripted faults show before), and how often after
/// that (it cycles through [`INJECTIONS`] steps).
pub const INJECT_FIRST: Duration = Duration::from_secs(5);
pub const INJECT_EVERY: Duration = Duration::from_secs(10);

const MODEL: &str = "gpt-5.5";
const LOG_FILE: &str = "switchyard.log";
/// A turn that has not ended after this long is abandoned (the simulator never hangs unless
/// told to; this only bounds a surprise).
const TURN_TIMEOUT: Duration = Duration::from_secs(90);
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
        let console =
            switchyard_tui::run(switchyard_tui::admin::Target::Socket(demo.socket.clone()));
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
        let mut tasks = Traffic::spawn(gw.addr, &gw.key, &traffic_stop);
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

/// One step of the injector's cycle: which account gets which fault.
struct Injection {
    /// Index into [`Sim::account_ids`]: 0 is `sim-acct-1`.
    account: usize,
    kind: FaultKind,
    times: u32,
}

/// The injector's cycle (a minute), one step every [`INJECT_EVERY`]. Quotas go to the healthy
/// accounts, `sim-acct-4` and `sim-acct-5`, in turn: they cool with a countdown and come back,
/// and a quota does not climb a ladder. Drops (`sim-acct-3`) and bursts (`sim-acct-2`) go to
/// the accounts whose profile already has them, so the healthy ones stay healthy and the pool
/// never runs dry.
fn injections() -> [Injection; INJECTIONS] {
    [
        Injection {
            account: 3,
            kind: FaultKind::Quota {
                resets_in_seconds: 40,
            },
            times: 1,
        },
        Injection {
            account: 2,
            kind: FaultKind::WsCloseMidTurn { after_deltas: 2 },
            times: 1,
        },
        Injection {
            account: 1,
            kind: FaultKind::Burst429 {
                retry_after_secs: 4,
            },
            times: 2,
        },
        Injection {
            account: 4,
            kind: FaultKind::Quota {
                resets_in_seconds: 40,
            },
            times: 1,
        },
        Injection {
            account: 2,
            kind: FaultKind::ResetMidStream { after_deltas: 4 },
            times: 1,
        },
        Injection {
            account: 1,
            kind: FaultKind::Burst429 {
                retry_after_secs: 4,
            },
            times: 1,
        },
    ]
}

/// Steps in [`injections`].
pub const INJECTIONS: usize = 6;

/// Usage at which the injector rolls an account's 5-hour window over (the profile adds usage
/// with every turn, and without this every bar would sit at the top after a few minutes). An
/// account out of quota shows 100 % and is left alone.
const ROLL_OVER_AT: std::ops::Range<f64> = 90.0..99.5;

/// Keeps incidents coming. A fault is queued only on an account with nothing queued, so an
/// account that is out (and so gets no requests) does not pile them up.
async fn inject_faults(sim: Sim, stop: CancellationToken) {
    let ids = sim.account_ids();
    let steps = injections();
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + INJECT_FIRST, INJECT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for step in steps.iter().cycle() {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(id) = ids.get(step.account) else {
            continue;
        };
        if sim.faults(id).is_empty() {
            tracing::debug!(account = %id, fault = ?step.kind, "demo: injecting a fault");
            sim.push_fault(id, Fault::times(step.kind.clone(), step.times));
        }
        for id in &ids {
            if let Some((primary, secondary)) = sim.usage(id)
                && ROLL_OVER_AT.contains(&primary)
            {
                let fresh = 5.0 + (primary * 7.0) % 15.0;
                tracing::debug!(account = %id, primary, fresh, "demo: usage window rolls over");
                sim.set_usage(id, fresh, secondary);
            }
        }
    }
}

/// The synthetic clients.
#[derive(Clone)]
struct Traffic {
    http: reqwest::Client,
    base: String,
    ws_url: String,
    key: String,
    stop: CancellationToken,
}

#[derive(Debug, Clone, Copy)]
enum Transport {
    Sse,
    Ws,
}

/// How a turn ended, as the client saw it.
#[derive(Debug)]
enum Outcome {
    Completed {
        id: String,
        text: String,
    },
    /// An error status, a `response.failed` / `error` event, with its code.
    Failed {
        code: Option<String>,
    },
    /// The stream or the socket ended without a terminal event.
    Dropped,
}

/// Prompts the synthetic users type.
const PROMPTS: [&str; 8] = [
    "Why does the integration test fail on CI but not locally?",
    "Summarise the last build log in three bullet points.",
    "Refactor this function to return a Result instead of panicking.",
    "What does this regex match?",
    "Write a doc comment for the scheduler's pick function.",
    "Is this SQL query safe against injection?",
    "Explain the borrow checker error on line 42.",
    "Suggest a name for a module that pools accounts.",
];

impl Traffic {
    fn spawn(addr: SocketAddr, key: &str, stop: &CancellationToken) -> Vec<JoinHandle<()>> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .build()
            .unwrap_or_default();
        let traffic = Traffic {
            http,
            base: format!("http://{addr}"),
            ws_url: format!("ws://{addr}/v1/responses"),
            key: key.to_string(),
            stop: stop.clone(),
        };
        let sessions = (0..SSE_SESSIONS)
            .map(|i| (Transport::Sse, i))
            .chain((0..WS_SESSIONS).map(|i| (Transport::Ws, i)));
        sessions
            .map(|(transport, i)| {
                let t = traffic.clone();
                tokio::spawn(async move {
                    let stop = t.stop.clone();
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        () = t.client(transport, i) => {}
                    }
                })
            })
            .collect()
    }

    /// One synthetic user: conversations of 3–10 turns, each under a new session id, forever.
    async fn client(self, transport: Transport, n: usize) {
        let mut rng = Rng::new();
        // Staggered starts, so the first seconds already show sessions arriving.
        pause(&mut rng, 100, 1500).await;
        for conversation in 0u64.. {
            let session = format!(
                "demo-{}-{n}-{conversation}-{:04x}",
                match transport {
                    Transport::Sse => "sse",
                    Transport::Ws => "ws",
                },
                rng.below(0x10000)
            );
            let turns = 3 + rng.below(8);
            match transport {
                Transport::Sse => self.sse_conversation(&session, turns, &mut rng).await,
                Transport::Ws => self.ws_conversation(&session, turns, &mut rng).await,
            }
            pause(&mut rng, 500, 2500).await;
        }
    }

    /// Turns over HTTP/SSE; every request carries the whole conversation, as Codex's do.
    async fn sse_conversation(&self, session: &str, turns: u64, rng: &mut Rng) {
        let mut history: Vec<Value> = Vec::new();
        for _ in 0..turns {
            let user = user_message(rng);
            let mut input = history.clone();
            input.push(user.clone());
            let mut body = request_body(session, Value::Array(input));
            body["stream"] = json!(true);
            let outcome = tokio::time::timeout(TURN_TIMEOUT, self.sse_turn(session, &body))
                .await
                .unwrap_or(Outcome::Dropped);
            tracing::debug!(session, ?outcome, "demo: sse turn");
            if let Outcome::Completed { text, .. } = outcome {
                history.push(user);
                history.push(assistant_message(&text));
            }
            pause(rng, 300, 2000).await;
        }
    }

    async fn sse_turn(&self, session: &str, body: &Value) -> Outcome {
        let sent = self
            .http
            .post(format!("{}/v1/responses", self.base))
            .bearer_auth(&self.key)
            .header("session_id", session)
            .json(body)
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(_) => return Outcome::Dropped,
        };
        if !resp.status().is_success() {
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            return Outcome::Failed {
                code: body["error"]["code"].as_str().map(str::to_string),
            };
        }
        let mut text = String::new();
        let mut buf: Vec<u8> = Vec::new();
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else {
                return Outcome::Dropped;
            };
            buf.extend_from_slice(&chunk);
            while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = buf.drain(..end + 2).collect();
                if let Some(event) = sse_data(&block)
                    && let Some(outcome) = on_event(&event, &mut text)
                {
                    return outcome;
                }
            }
        }
        Outcome::Dropped
    }

    /// Turns on one Responses WebSocket: the first with the whole input, the next ones as
    /// continuations (`previous_response_id` and only the new message). A failed turn is
    /// resent in full; a dropped socket is reopened.
    async fn ws_conversation(&self, session: &str, turns: u64, rng: &mut Rng) {
        let mut ws = None;
        let mut history: Vec<Value> = Vec::new();
        let mut previous: Option<String> = None;
        for _ in 0..turns {
            if ws.is_none() {
                ws = self.ws_connect(session).await;
                previous = None;
            }
            let Some(socket) = ws.as_mut() else {
                pause(rng, 1000, 2000).await;
                continue;
            };
            let user = user_message(rng);
            let mut outcome = self
                .ws_send(socket, session, &history, &user, &previous)
                .await;
            if let Outcome::Failed { code: Some(code) } = &outcome
                && code == "previous_response_not_found"
            {
                // The account that held the conversation is out: resend it in full at once,
                // as Codex does.
                outcome = self.ws_send(socket, session, &history, &user, &None).await;
            }
            match outcome {
                Outcome::Completed { id, text } => {
                    history.push(user);
                    history.push(assistant_message(&text));
                    previous = Some(id);
                }
                Outcome::Failed { .. } => previous = None,
                Outcome::Dropped => ws = None,
            }
            pause(rng, 300, 2000).await;
        }
        if let Some(mut socket) = ws {
            let _ = socket.close(None).await;
        }
    }

    /// One turn: a continuation of `previous` if there is one, else the whole conversation.
    async fn ws_send(
        &self,
        socket: &mut Ws,
        session: &str,
        history: &[Value],
        user: &Value,
        previous: &Option<String>,
    ) -> Outcome {
        let mut frame = request_body(session, Value::Null);
        frame["type"] = json!("response.create");
        match previous {
            Some(id) => {
                frame["previous_response_id"] = json!(id);
                frame["input"] = json!([user]);
            }
            None => {
                let mut input = history.to_vec();
                input.push(user.clone());
                frame["input"] = Value::Array(input);
            }
        }
        let outcome = tokio::time::timeout(TURN_TIMEOUT, ws_turn(socket, &frame))
            .await
            .unwrap_or(Outcome::Dropped);
        tracing::debug!(session, ?outcome, "demo: ws turn");
        outcome
    }

    async fn ws_connect(&self, session: &str) -> Option<Ws> {
        let mut req = self.ws_url.as_str().into_client_request().ok()?;
        let headers = req.headers_mut();
        headers.insert(
            "authorization",
            format!("Bearer {}", self.key).parse().ok()?,
        );
        headers.insert("session_id", session.parse().ok()?);
        match tokio_tungstenite::connect_async(req).await {
            Ok((ws, _)) => Some(ws),
            Err(e) => {
                tracing::debug!(session, error = %e, "demo: websocket refused");
                None
            }
        }
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Sends one `response.create` and reads until its terminal event.
async fn ws_turn(ws: &mut Ws, frame: &Value) -> Outcome {
    if ws
        .send(Message::Text(frame.to_string().into()))
        .await
        .is_err()
    {
        return Outcome::Dropped;
    }
    let mut text = String::new();
    while let Some(msg) = ws.next().await {
        match msg {
            Ok(Message::Text(t)) => {
                let Ok(event) = serde_json::from_str::<Value>(t.as_str()) else {
                    continue;
                };
                if let Some(outcome) = on_event(&event, &mut text) {
                    return outcome;
                }
            }
            Ok(Message::Close(_)) | Err(_) => return Outcome::Dropped,
            Ok(_) => {}
        }
    }
    Outcome::Dropped
}

/// The JSON of an SSE block's `data:` lines; `None` for comments (keep-alives).
fn sse_data(block: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(block).ok()?;
    let data: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim_start)
        .collect();
    serde_json::from_str(&data).ok()
}

/// Follows one event; the outcome once it is terminal.
fn on_event(event: &Value, text: &mut String) -> Option<Outcome> {
    match event["type"].as_str()? {
        "response.output_text.delta" => {
            text.push_str(event["delta"].as_str().unwrap_or(""));
            None
        }
        "response.completed" => Some(Outcome::Completed {
            id: event["response"]["id"].as_str().unwrap_or("").to_string(),
            text: std::mem::take(text),
        }),
        "response.failed" | "response.incomplete" => Some(Outcome::Failed {
            code: event["response"]["error"]["code"]
                .as_str()
                .map(str::to_string),
        }),
        "error" => Some(Outcome::Failed {
            code: event["error"]["code"].as_str().map(str::to_string),
        }),
        _ => None,
    }
}

/// The body Codex sends (minus the tools), with `input` as given.
fn request_body(session: &str, input: Value) -> Value {
    json!({
        "model": MODEL,
        "instructions": "You are a coding agent in a switchyard demo.",
        "input": input,
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "low", "summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": session,
    })
}

fn user_message(rng: &mut Rng) -> Value {
    let prompt = PROMPTS
        .get(usize::try_from(rng.below(PROMPTS.len() as u64)).unwrap_or(0))
        .copied()
        .unwrap_or(PROMPTS[0]);
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]})
}

fn assistant_message(text: &str) -> Value {
    json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
}

/// A pause of `lo..hi` ms.
async fn pause(rng: &mut Rng, lo: u64, hi: u64) {
    let ms = lo + rng.below(hi.saturating_sub(lo).max(1));
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// xorshift64*: enough to make the synthetic users differ; not for anything secret.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = getrandom::u64().unwrap_or_else(|_| clock::system().now_ms());
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
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
    fn sse_blocks_and_events_are_followed_to_the_terminal_one() {
        let mut text = String::new();
        assert!(sse_data(b": keep-alive\n\n").is_none());
        let delta = sse_data(b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi \"}\n\n").unwrap();
        assert!(on_event(&delta, &mut text).is_none());
        let done = json!({"type": "response.completed", "response": {"id": "resp_1"}});
        match on_event(&done, &mut text) {
            Some(Outcome::Completed { id, text }) => {
                assert_eq!((id.as_str(), text.as_str()), ("resp_1", "hi "))
            }
            other => panic!("{other:?}"),
        }
        let failed = json!({"type": "error", "error": {"code": "previous_response_not_found"}});
        assert!(matches!(
            on_event(&failed, &mut text),
            Some(Outcome::Failed { code: Some(c) }) if c == "previous_response_not_found"
        ));
    }

    #[test]
    fn every_injection_names_an_account_of_the_pool() {
        assert!(
            injections()
                .iter()
                .all(|i| u32::try_from(i.account).unwrap() < ACCOUNTS)
        );
    }
}
