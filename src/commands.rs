//! What each CLI command does. Management commands talk to a running daemon through its admin
//! socket (so it sees the change at once) and otherwise open the store directly; both paths
//! yield the same wire types, printed by the same code, so the output is identical.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::Method;
use switchyard_tui::wire;

use crate::admin_client::{AdminClient, ClientError, Target};
use crate::api::view;
use crate::base::clock::{self, SharedClock};
use crate::cli::{
    AccountCommand, Cli, Command, ConfigCommand, KeyCommand, PolicyArgs, Setting, UsageArgs,
};
use crate::config::{self, Config, ConfigError};
use crate::daemon::systemd::Notifier;
use crate::daemon::{self, BootError};
use crate::fleet::auth_file::AuthFileError;
use crate::fleet::{Fleet, FleetError};
use crate::keys::{KeyError, KeyRing};
use crate::store::{Store, StoreError};
use crate::telemetry;

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Console(#[from] switchyard_tui::Error),
    #[error("{path}: {source}")]
    AuthFile {
        path: String,
        #[source]
        source: AuthFileError,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the store {path} is locked by another process, and no daemon answers on the admin socket \
         {socket} (a daemon with another `[admin] socket`? pass the same --config)"
    )]
    LockedWithoutDaemon { path: PathBuf, socket: PathBuf },
    #[error(
        "another switchyard (pid {pid}) already serves the state directory {dir} (admin socket \
         {socket}); stop it first (`systemctl stop switchyard`, or end that process), or give this \
         one its own --state-dir"
    )]
    AlreadyServing {
        pid: u32,
        dir: PathBuf,
        socket: PathBuf,
    },
    #[error("unknown simulator profile `{0}` (known: healthy, demo, flaky, exhausted, slow)")]
    UnknownProfile(String),
    #[error("simulator: {0}")]
    Sim(std::io::Error),
    #[error(transparent)]
    Demo(#[from] crate::demo::DemoError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Backup(crate::store::backup::BackupError),
    #[error(transparent)]
    Restore(#[from] crate::backup::RestoreError),
}

/// Runs a parsed command line; `Ok` carries the exit status (0, or `doctor`'s 1 and 2).
pub fn run(cli: Cli) -> Result<u8, CommandError> {
    if let Command::Doctor(args) = &cli.command {
        // The doctor reports a config that does not load as one of its findings.
        let source = config::Source {
            path: cli.config.clone(),
            state_dir: cli.state_dir.clone(),
            listen: None,
        };
        let loaded = source.load(None, &config::process_env);
        telemetry::init_logging("error", crate::telemetry::LogFormat::Auto);
        return Ok(runtime()?.block_on(crate::doctor::run(loaded, args)));
    }
    run_command(cli).map(|()| 0)
}

fn run_command(cli: Cli) -> Result<(), CommandError> {
    let env = config::process_env;
    let source = config::Source {
        path: cli.config.clone(),
        state_dir: cli.state_dir.clone(),
        listen: match &cli.command {
            Command::Serve(args) => args.listen,
            _ => None,
        },
    };
    let config = source.load(None, &env)?;

    match cli.command {
        Command::Config(ConfigCommand::Default) => {
            print!("{}", config::DEFAULT_TOML);
            Ok(())
        }
        Command::Config(ConfigCommand::Check) => {
            print!("{}", config.to_toml());
            Ok(())
        }
        Command::Serve(_) => {
            telemetry::init_logging(&config.log.level, config.log.format);
            // Before the runtime starts its threads: taking it unsets the variables.
            let activated =
                crate::daemon::systemd::activated_listener().map_err(CommandError::Usage)?;
            runtime()?.block_on(serve(config, source, activated))
        }
        Command::Account(cmd) => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(account(&config, cmd))
        }
        Command::Key(cmd) => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(key(&config, cmd))
        }
        Command::Usage(args) => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(usage(&config, args))
        }
        Command::Report(args) => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(report(&config, args))
        }
        Command::Doctor(_) => Ok(()),
        Command::Backup(args) => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(crate::backup::backup(&config, args))
        }
        Command::Restore(args) => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(crate::backup::restore(&config, args))
        }
        Command::Reload => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(reload(&config, &source))
        }
        Command::Sim(args) => {
            telemetry::init_logging(&config.log.level, config.log.format);
            runtime()?.block_on(sim(args))
        }
        // No logging: the console owns the terminal.
        Command::Console(args) => runtime()?.block_on(console(args, &config)),
        // Logs go to a file in the demo's directory (the console owns the terminal).
        Command::Demo(args) => runtime()?.block_on(demo(args, &config)),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, CommandError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(CommandError::Runtime)
}

pub(crate) fn state_dir(config: &Config) -> PathBuf {
    config.state_dir(&config::process_env)
}

pub(crate) fn admin_socket(config: &Config) -> PathBuf {
    config.admin_socket(&config::process_env)
}

async fn serve(
    config: Config,
    source: config::Source,
    activated: Option<std::net::TcpListener>,
) -> Result<(), CommandError> {
    let dir = state_dir(&config);
    let shutdown = daemon::signals::stop_on(daemon::signals::STOP);
    let store = match Store::open(&dir) {
        Ok(store) => store,
        Err(StoreError::Locked { path }) => return Err(locked(path, &config).await),
        Err(e) => return Err(e.into()),
    };
    let listeners =
        daemon::bind_with(activated, config.server.listen, &admin_socket(&config)).await?;
    let clock: SharedClock = clock::system();
    daemon::run_with(
        store,
        config,
        Some(source),
        clock,
        listeners,
        Notifier::from_env(),
        shutdown,
    )
    .await?;
    Ok(())
}

/// `switchyard reload`: the config file, checked here, sent to the daemon.
async fn reload(config: &Config, source: &config::Source) -> Result<(), CommandError> {
    let socket = admin_socket(config);
    let client = AdminClient::connect(&socket).await?;
    let text = match &source.path {
        Some(p) => std::fs::read_to_string(p).map_err(|source| CommandError::Read {
            path: p.display().to_string(),
            source,
        })?,
        None => String::new(),
    };
    let r: wire::Reloaded = client
        .call(Method::POST, "/api/admin/reload", Some(text.into_bytes()))
        .await?;
    if r.applied.is_empty() {
        println!("reloaded: nothing changed that applies live");
    } else {
        println!("reloaded: {}", r.applied.join(", "));
    }
    if !r.restart_needed.is_empty() {
        println!(
            "changed, applies at the next restart: {}",
            r.restart_needed.join(", ")
        );
    }
    Ok(())
}

async fn sim(args: crate::cli::SimArgs) -> Result<(), CommandError> {
    use crate::sim::{Profile, SimOptions};
    let profile = match &args.profile {
        Some(name) => Some(
            Profile::from_name(name).ok_or_else(|| CommandError::UnknownProfile(name.clone()))?,
        ),
        None => None,
    };
    let opts = SimOptions {
        accounts: args.accounts.max(1),
        access_ttl: args.access_ttl,
        profile,
        ..SimOptions::default()
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        daemon::signals::stop_on(daemon::signals::STOP).await;
        on_signal.cancel();
    });
    crate::sim::run_standalone(args.listen, opts, args.write_auth, stop)
        .await
        .map_err(CommandError::Sim)
}

/// `switchyard demo`: everything in a temporary directory; of the configuration only the log
/// level applies (upstream, listener, socket and state directory are the demo's own).
async fn demo(args: crate::cli::DemoArgs, config: &Config) -> Result<(), CommandError> {
    let opts = crate::demo::DemoOptions {
        console: !args.no_console,
        duration: args.duration,
        log_level: config.log.level.clone(),
    };
    Ok(crate::demo::run(opts).await?)
}

/// `switchyard console`: on the admin socket unless a URL is given.
async fn console(args: crate::cli::ConsoleArgs, config: &Config) -> Result<(), CommandError> {
    let target = match (args.url, args.socket) {
        (Some(url), _) => Target::from_url(&url, args.token.as_deref().unwrap_or_default())?,
        (None, Some(socket)) => Target::Socket(socket),
        (None, None) => Target::Socket(admin_socket(config)),
    };
    Ok(switchyard_tui::run(target).await?)
}

/// Why the store is locked, as far as can be told: a daemon answering on the configured socket
/// serves this state directory; otherwise it is a process whose socket is elsewhere, or a
/// command.
async fn locked(path: PathBuf, config: &Config) -> CommandError {
    let socket = admin_socket(config);
    if let Ok(client) = AdminClient::connect(&socket).await
        && let Ok(status) = client
            .call::<wire::Status>(Method::GET, "/api/admin/status", None)
            .await
    {
        return CommandError::AlreadyServing {
            pid: status.pid,
            dir: state_dir(config),
            socket,
        };
    }
    CommandError::LockedWithoutDaemon { path, socket }
}

/// What a management command does to the store when no daemon answers: only read it (the file
/// is opened read-only and never rewritten), or change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// Where management commands send their work.
enum Backend {
    Daemon(AdminClient),
    Direct {
        store: Store,
        fleet: Fleet,
        keys: KeyRing,
    },
}

impl Backend {
    async fn connect(config: &Config, access: Access) -> Result<Backend, CommandError> {
        let socket = admin_socket(config);
        if let Ok(client) = AdminClient::connect(&socket).await {
            return Ok(Backend::Daemon(client));
        }
        let dir = state_dir(config);
        let opened = match access {
            Access::Read => Store::open_read_only(&dir),
            Access::Write => Store::open(&dir),
        };
        let store = opened.map_err(|e| match e {
            StoreError::Locked { path } => CommandError::LockedWithoutDaemon { path, socket },
            other => other.into(),
        })?;
        let clock = clock::system();
        let fleet = Fleet::load(store.clone(), Arc::clone(&clock))?;
        let keys = KeyRing::load(store.clone(), clock)?;
        Ok(Backend::Direct { store, fleet, keys })
    }

    async fn close(self) -> Result<(), CommandError> {
        if let Backend::Direct { store, .. } = self {
            store.close().await?;
        }
        Ok(())
    }

    async fn list_accounts(&self) -> Result<Vec<wire::Account>, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.call(Method::GET, "/api/admin/accounts", None).await?),
            Backend::Direct { fleet, store, .. } => {
                // The error rates a daemon would show, from the stored records.
                let now = clock::system().now_ms();
                let from =
                    now.saturating_sub(60 * 60_000 + crate::telemetry::report::LONGEST_REQUEST_MS);
                let records: Vec<crate::telemetry::records::RequestRecord> = store
                    .requests_since(from)?
                    .into_iter()
                    .filter_map(|(k, row)| {
                        crate::telemetry::records::RequestRecord::from_row(k, row).ok()
                    })
                    .collect();
                let windows = crate::telemetry::windows::of_records(&records, now);
                Ok(view::accounts_with_rates(&fleet.list(), &windows))
            }
        }
    }

    /// One account by its id, chatgpt_account_id, email or label.
    async fn get_account(&self, selector: &str) -> Result<wire::Account, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c
                .call(
                    Method::GET,
                    &format!(
                        "/api/admin/accounts/{}",
                        crate::base::urlcode::encode(selector)
                    ),
                    None,
                )
                .await?),
            Backend::Direct { fleet, .. } => {
                let id = fleet.resolve(selector)?;
                Ok(view::account(
                    &fleet.get(&id).ok_or(FleetError::NotFound(id))?,
                ))
            }
        }
    }

    async fn import_account(&self, raw: &[u8]) -> Result<wire::ImportedAccount, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c
                .call(Method::POST, "/api/admin/accounts", Some(raw.to_vec()))
                .await?),
            Backend::Direct { fleet, .. } => {
                Ok(view::imported(&fleet.import(fleet.parse_auth(raw)?).await?))
            }
        }
    }

    async fn set_enabled(&self, id: &str, enabled: bool) -> Result<wire::Account, CommandError> {
        match self {
            Backend::Daemon(c) => {
                let verb = if enabled { "enable" } else { "disable" };
                Ok(c.call(
                    Method::POST,
                    &format!(
                        "/api/admin/accounts/{}/{verb}",
                        crate::base::urlcode::encode(id)
                    ),
                    None,
                )
                .await?)
            }
            Backend::Direct { fleet, .. } => {
                Ok(view::account(&fleet.set_enabled(id, enabled).await?))
            }
        }
    }

    async fn remove_account(&self, id: &str) -> Result<wire::Account, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c
                .call(
                    Method::DELETE,
                    &format!("/api/admin/accounts/{}", crate::base::urlcode::encode(id)),
                    None,
                )
                .await?),
            Backend::Direct { fleet, .. } => Ok(view::account(&fleet.remove(id).await?)),
        }
    }

    async fn set_account(
        &self,
        id: &str,
        change: crate::fleet::settings::AccountChange,
    ) -> Result<wire::Account, CommandError> {
        match self {
            Backend::Daemon(c) => {
                let mut body = serde_json::Map::new();
                if let Some(l) = &change.label {
                    body.insert("label".into(), l.clone().into());
                }
                if let Some(p) = change.priority {
                    body.insert("priority".into(), p.into());
                }
                if let Some(m) = change.max_concurrency {
                    body.insert("max_concurrency".into(), serde_json::json!(m));
                }
                if let Some(p) = &change.proxy {
                    body.insert("proxy".into(), serde_json::json!(p));
                }
                Ok(c.call(
                    Method::PUT,
                    &format!("/api/admin/accounts/{}", crate::base::urlcode::encode(id)),
                    Some(serde_json::Value::Object(body).to_string().into_bytes()),
                )
                .await?)
            }
            Backend::Direct { fleet, .. } => {
                Ok(view::account(&fleet.set_account(id, change).await?))
            }
        }
    }

    /// Refreshes an account's tokens now (through the daemon, or with an upstream client made
    /// from the config).
    async fn refresh_account(
        &self,
        config: &Config,
        id: &str,
    ) -> Result<wire::Account, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c
                .call(
                    Method::POST,
                    &format!(
                        "/api/admin/accounts/{}/refresh",
                        crate::base::urlcode::encode(id)
                    ),
                    None,
                )
                .await?),
            Backend::Direct { fleet, .. } => {
                crate::upstream::install_crypto_provider();
                let upstream = crate::upstream::Upstream::new(&config.upstream)
                    .map_err(CommandError::Usage)?;
                Ok(view::account(&fleet.refresh_account(id, &upstream).await?))
            }
        }
    }

    async fn export_account(
        &self,
        id: &str,
        keep: bool,
    ) -> Result<wire::ExportedAccount, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c
                .call(
                    Method::POST,
                    &format!(
                        "/api/admin/accounts/{}/export?keep={keep}",
                        crate::base::urlcode::encode(id)
                    ),
                    None,
                )
                .await?),
            Backend::Direct { fleet, .. } => Ok(view::exported(&fleet.export(id, keep).await?)),
        }
    }

    async fn create_key(
        &self,
        name: &str,
        policy: wire::KeyPolicyPatch,
    ) -> Result<wire::CreatedKey, CommandError> {
        match self {
            Backend::Daemon(c) => {
                let body = serde_json::to_vec(&wire::CreateKey {
                    name: name.to_string(),
                    policy,
                })
                .map_err(|e| ClientError::Decode(e.to_string()))?;
                Ok(c.call(Method::POST, "/api/admin/keys", Some(body)).await?)
            }
            Backend::Direct { keys, .. } => Ok(view::created_key(
                &keys.create(name, &view::policy_patch(policy)).await?,
            )),
        }
    }

    async fn update_key(
        &self,
        id: &str,
        patch: wire::KeyPolicyPatch,
    ) -> Result<wire::Key, CommandError> {
        match self {
            Backend::Daemon(c) => {
                let body =
                    serde_json::to_vec(&patch).map_err(|e| ClientError::Decode(e.to_string()))?;
                Ok(c.call(
                    Method::PATCH,
                    &format!("/api/admin/keys/{}", crate::base::urlcode::encode(id)),
                    Some(body),
                )
                .await?)
            }
            Backend::Direct { keys, .. } => Ok(view::key(
                &keys.update(id, &view::policy_patch(patch)).await?,
            )),
        }
    }

    async fn show_key(&self, id: &str) -> Result<wire::Key, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c
                .call(
                    Method::GET,
                    &format!("/api/admin/keys/{}", crate::base::urlcode::encode(id)),
                    None,
                )
                .await?),
            Backend::Direct { keys, .. } => Ok(view::key(&keys.resolve(id)?)),
        }
    }

    /// The usage buckets of the hours starting in `[from, to)` (unix seconds).
    async fn usage(&self, from: u64, to: u64) -> Result<Vec<wire::UsageBucket>, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c
                .call(
                    Method::GET,
                    &format!("/api/admin/usage?from={from}&to={to}"),
                    None,
                )
                .await?),
            Backend::Direct { store, keys, .. } => {
                let names = keys.names();
                Ok(store
                    .usage_between(from, to)?
                    .into_iter()
                    .map(|r| view::usage_bucket(r, &names))
                    .collect())
            }
        }
    }

    async fn report(
        &self,
        windows: Vec<u64>,
        slow_ms: u64,
    ) -> Result<switchyard_tui::report::Report, CommandError> {
        match self {
            Backend::Daemon(c) => {
                let mut q: Vec<String> = windows.iter().map(|w| format!("window={w}")).collect();
                q.push(format!("slow_ms={slow_ms}"));
                Ok(c.call(
                    Method::GET,
                    &format!("/api/admin/report?{}", q.join("&")),
                    None,
                )
                .await?)
            }
            Backend::Direct { store, fleet, .. } => {
                let names = crate::telemetry::report::names(&fleet.list());
                let scope = crate::telemetry::report::Scope {
                    now_ms: clock::system().now_ms(),
                    windows,
                    slow_ms,
                };
                Ok(crate::telemetry::report::from_store(
                    store,
                    &[],
                    &scope,
                    &names,
                )?)
            }
        }
    }

    async fn list_keys(&self) -> Result<Vec<wire::Key>, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.call(Method::GET, "/api/admin/keys", None).await?),
            Backend::Direct { keys, .. } => Ok(view::keys(&keys.list())),
        }
    }

    async fn revoke_key(&self, id: &str) -> Result<wire::Key, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c
                .call(
                    Method::DELETE,
                    &format!("/api/admin/keys/{}", crate::base::urlcode::encode(id)),
                    None,
                )
                .await?),
            Backend::Direct { keys, .. } => Ok(view::key(&keys.revoke(id).await?)),
        }
    }
}

/// Resolves at the first SIGINT, SIGTERM or SIGHUP; the handlers are installed when called.
fn stop_signals() -> Result<impl std::future::Future<Output = ()>, CommandError> {
    use crate::daemon::signals::{Signal, listen};
    let mut signals = listen(&[Signal::Interrupt, Signal::Terminate, Signal::Hangup])
        .map_err(|e| CommandError::Usage(format!("cannot handle signals: {e}")))?;
    Ok(async move {
        signals.next().await;
    })
}

/// Runs one login to its tokens: the device-code flow, or the browser flow.
async fn login(
    config: &Config,
    browser: bool,
) -> Result<crate::upstream::login::LoginTokens, CommandError> {
    use crate::upstream::login::{self as flow, LoginError};
    crate::upstream::install_crypto_provider();
    let up = &config.upstream;
    let http = crate::upstream::http_client(up)
        .timeout(up.header_timeout)
        .build()
        .map_err(|e| CommandError::Usage(e.to_string()))?;
    let failed = |e: LoginError| CommandError::Usage(format!("login failed: {e}"));
    if !browser {
        let code = flow::request_device_code(&http, &up.auth_base_url, &up.oauth_client_id)
            .await
            .map_err(failed)?;
        eprintln!(
            "To log in, open {} in any browser and enter the code\n\n    {}\n\n(it expires in 15 minutes; \
             waiting for the approval…)",
            code.verification_url, code.user_code
        );
        let deadline = std::time::Instant::now() + flow::DEVICE_CODE_LIFETIME;
        let (auth_code, verifier) =
            flow::poll_device_code(&http, &up.auth_base_url, &code, deadline)
                .await
                .map_err(failed)?;
        let redirect = flow::device_redirect_uri(&up.auth_base_url);
        return flow::exchange_code(
            &http,
            &up.oauth_token_url,
            &up.oauth_client_id,
            (&auth_code, &redirect, &verifier),
        )
        .await
        .map_err(failed);
    }
    let pkce = flow::Pkce::new().map_err(failed)?;
    let redirect = format!("http://localhost:{}/auth/callback", flow::CALLBACK_PORT);
    let url = pkce.authorize_url(&up.auth_base_url, &up.oauth_client_id, &redirect);
    // Listening before the URL is shown: a browser that follows it at once finds the callback.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", flow::CALLBACK_PORT))
        .await
        .ok();
    eprintln!(
        "Open this URL in a browser and log in:\n\n    {url}\n\nOn this machine the login completes by \
         itself. Over SSH, copy the address the browser ends on (http://localhost:{}/auth/callback?code=…) \
         and paste it here:",
        flow::CALLBACK_PORT
    );
    // Read on a thread of its own that nothing waits for: a read blocked on the terminal must
    // neither hold the runtime nor keep the command from exiting once the callback came.
    // Without a terminal (stdin closed) only the callback can complete it.
    let (line_tx, line_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        loop {
            line.clear();
            match std::io::stdin().read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line.trim().is_empty() => continue,
                Ok(_) => {
                    let _ = line_tx.send(line.trim().to_string());
                    return;
                }
            }
        }
    });
    let pasted = async {
        match line_rx.await {
            Ok(l) => Ok::<String, LoginError>(l),
            Err(_) => std::future::pending().await,
        }
    };
    let redirected = tokio::select! {
        r = pasted => r,
        r = callback(listener) => r,
    }
    .map_err(failed)?;
    let code = pkce.code_from_redirect(&redirected).map_err(failed)?;
    flow::exchange_code(
        &http,
        &up.oauth_token_url,
        &up.oauth_client_id,
        (&code, &redirect, &pkce.verifier),
    )
    .await
    .map_err(failed)
}

/// Waits for the browser's redirect on the callback listener and answers it; never resolves
/// without one (the port was taken: the URL can still be pasted).
async fn callback(
    listener: Option<tokio::net::TcpListener>,
) -> Result<String, crate::upstream::login::LoginError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(listener) = listener else {
        return std::future::pending().await;
    };
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let mut buf = vec![0u8; 8192];
        let n = sock.read(&mut buf).await.unwrap_or(0);
        let head = String::from_utf8_lossy(&buf[..n]).into_owned();
        let target = head
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or_default()
            .to_string();
        if !target.starts_with("/auth/callback") {
            let _ = sock
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
            continue;
        }
        let body = "Switchyard: the login is complete; you can close this tab.";
        let _ = sock
            .write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await;
        return Ok(target);
    }
}

/// Writes a file only its owner may read (created 0600; an existing file is truncated and
/// set to 0600 first).
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), CommandError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let err = |source| CommandError::Write {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(err)?;
    f.write_all(bytes).map_err(err)
}

/// Reads every file first and checks it, so a bad file among several imports nothing.
fn read_auth_files(files: &[PathBuf]) -> Result<Vec<(String, Vec<u8>)>, CommandError> {
    let mut out = Vec::new();
    let mut stdin_used = false;
    for f in files {
        let (name, bytes) = if f == Path::new("-") {
            if stdin_used {
                continue;
            }
            stdin_used = true;
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|source| CommandError::Read {
                    path: "stdin".into(),
                    source,
                })?;
            ("stdin".to_string(), buf)
        } else {
            let name = f.display().to_string();
            let bytes = std::fs::read(f).map_err(|source| CommandError::Read {
                path: name.clone(),
                source,
            })?;
            (name, bytes)
        };
        crate::fleet::auth_file::parse(&bytes, 0).map_err(|source| CommandError::AuthFile {
            path: name.clone(),
            source,
        })?;
        out.push((name, bytes));
    }
    Ok(out)
}

async fn account(config: &Config, cmd: AccountCommand) -> Result<(), CommandError> {
    let files = match &cmd {
        AccountCommand::Import { files, .. } => read_auth_files(files)?,
        _ => Vec::new(),
    };
    let access = match cmd {
        AccountCommand::List(_) => Access::Read,
        _ => Access::Write,
    };
    let backend = Backend::connect(config, access).await?;
    let result = account_with(&backend, config, cmd, files).await;
    backend.close().await?;
    result
}

async fn account_with(
    backend: &Backend,
    config: &Config,
    cmd: AccountCommand,
    files: Vec<(String, Vec<u8>)>,
) -> Result<(), CommandError> {
    match cmd {
        AccountCommand::Import { no_refresh, .. } => {
            for (_, bytes) in files {
                let imported = backend.import_account(&bytes).await?;
                let verb = if imported.created {
                    "imported"
                } else {
                    "updated"
                };
                println!("{verb} {}", describe_account(&imported.account));
                if no_refresh {
                    eprintln!(
                        "not refreshed (--no-refresh): whichever of Switchyard and the Codex CLI this \
                         login came from refreshes first takes it; the other must log in again"
                    );
                    continue;
                }
                match backend.refresh_account(config, &imported.account.id).await {
                    Ok(_) => eprintln!(
                        "the login now belongs to Switchyard (its tokens were refreshed): the Codex \
                         CLI it came from must log in again, or use the gateway"
                    ),
                    Err(e) => eprintln!(
                        "warning: could not refresh {} to take ownership ({e}); it is refreshed \
                         before its first request, and the Codex CLI it came from must log in again",
                        imported.account.id
                    ),
                }
            }
        }
        AccountCommand::Login { browser, account } => {
            let expected = match &account {
                Some(sel) => Some(backend.get_account(sel).await?),
                None => None,
            };
            // Interrupted (Ctrl-C, a closed SSH session, a stop): nothing was exchanged to keep.
            // Handled rather than left to the default action, which a parent may have set to
            // ignore.
            let stopped = stop_signals()?;
            let tokens = tokio::select! {
                tokens = login(config, browser) => tokens?,
                () = stopped => {
                    return Err(CommandError::Usage(
                        "the login was interrupted; nothing was stored".into(),
                    ));
                }
            };
            let auth = tokens.auth_json(clock::system().now_secs());
            let parsed = crate::fleet::auth_file::parse(auth.to_string().as_bytes(), 0)
                .map_err(|e| CommandError::Usage(format!("the new login: {e}")))?;
            // The account is its ChatGPT account and user: another member of the same
            // workspace is another account, not this one logged in again.
            if let Some(a) = &expected {
                let id = crate::fleet::account_id(
                    &parsed.chatgpt_account_id,
                    parsed.chatgpt_user_id.as_deref(),
                );
                if id != a.id {
                    return Err(CommandError::Usage(format!(
                        "this login is ChatGPT account {} ({}), not {} ({}); nothing was stored",
                        parsed.chatgpt_account_id,
                        parsed.email.as_deref().unwrap_or("no email"),
                        a.id,
                        a.chatgpt_account_id
                    )));
                }
            }
            let imported = backend.import_account(auth.to_string().as_bytes()).await?;
            let verb = match (&expected, imported.created) {
                (Some(_), _) => "logged in again",
                (None, true) => "logged in",
                (None, false) => "logged in again (already known)",
            };
            println!("{verb}: {}", describe_account(&imported.account));
        }
        AccountCommand::Export { id, out, keep } => {
            let exported = backend.export_account(&id, keep).await?;
            let text = format!("{}\n", to_json(&exported.auth));
            match &out {
                Some(path) => write_private(path, text.as_bytes())?,
                None => print!("{text}"),
            }
            let account = describe_account(&exported.account);
            if keep {
                eprintln!(
                    "exported {account}; still enabled here (--keep): the two copies will refresh \
                     over each other, and one of them will need a new login"
                );
            } else {
                eprintln!(
                    "exported {account} and disabled it here: the login now lives where you import \
                     the file"
                );
            }
        }
        AccountCommand::List(args) => {
            let accounts = backend.list_accounts().await?;
            if args.json {
                println!("{}", to_json(&accounts));
            } else {
                print!("{}", account_table(&accounts));
            }
        }
        AccountCommand::Enable { id } => println!(
            "enabled {}",
            describe_account(&backend.set_enabled(&id, true).await?)
        ),
        AccountCommand::Disable { id } => println!(
            "disabled {}",
            describe_account(&backend.set_enabled(&id, false).await?)
        ),
        AccountCommand::Remove { id } => println!(
            "removed {}",
            describe_account(&backend.remove_account(&id).await?)
        ),
        AccountCommand::Set(args) => {
            let max_concurrency = match args.max_concurrency {
                None => None,
                Some(Setting::Clear) => Some(None),
                Some(Setting::Set(n)) => Some(Some(u32::try_from(n).map_err(|_| {
                    CommandError::Usage(format!("--max-concurrency {n} is too large"))
                })?)),
            };
            let change = crate::fleet::settings::AccountChange {
                label: args.label,
                priority: args.priority,
                max_concurrency,
                proxy: args.proxy.map(|p| match p {
                    Setting::Set(url) => Some(url),
                    Setting::Clear => None,
                }),
            };
            if change == crate::fleet::settings::AccountChange::default() {
                return Err(CommandError::Usage(
                    "nothing to change: give --label, --priority, --max-concurrency or --proxy"
                        .into(),
                ));
            }
            let a = backend.set_account(&args.id, change).await?;
            println!(
                "{} · priority {} · max concurrency {} · proxy {}",
                describe_account(&a),
                a.priority,
                a.max_concurrency
                    .map_or_else(|| "pool default".to_string(), |m| m.to_string()),
                a.proxy.as_deref().unwrap_or("none")
            );
        }
    }
    Ok(())
}

async fn key(config: &Config, cmd: KeyCommand) -> Result<(), CommandError> {
    let access = match cmd {
        KeyCommand::List(_) | KeyCommand::Show { .. } => Access::Read,
        _ => Access::Write,
    };
    let backend = Backend::connect(config, access).await?;
    let result = key_with(&backend, cmd).await;
    backend.close().await?;
    result
}

async fn key_with(backend: &Backend, cmd: KeyCommand) -> Result<(), CommandError> {
    match cmd {
        KeyCommand::Create { name, policy } => {
            let created = backend.create_key(&name, policy_patch(&policy)?).await?;
            eprintln!(
                "created key {} ({}); this is the only time it is shown:",
                created.info.id, created.info.name
            );
            println!("{}", created.key);
        }
        KeyCommand::Update { id, policy } => {
            let patch = policy_patch(&policy)?;
            if patch.is_empty() {
                return Err(CommandError::Usage(
                    "nothing to change: give a policy flag (see `switchyard key update --help`)"
                        .into(),
                ));
            }
            let k = backend.update_key(&id, patch).await?;
            print!("{}", key_detail(&k));
        }
        KeyCommand::Show { id, list } => {
            let k = backend.show_key(&id).await?;
            if list.json {
                println!("{}", to_json(&k));
            } else {
                print!("{}", key_detail(&k));
            }
        }
        KeyCommand::List(args) => {
            let keys = backend.list_keys().await?;
            if args.json {
                println!("{}", to_json(&keys));
            } else {
                print!("{}", key_table(&keys));
            }
        }
        KeyCommand::Revoke { id } => {
            let k = backend.revoke_key(&id).await?;
            println!("revoked key {} ({})", k.id, k.name);
        }
    }
    Ok(())
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

fn describe_account(a: &wire::Account) -> String {
    format!(
        "{} {} (plan {}, account {})",
        a.id,
        a.email.as_deref().unwrap_or(&a.label),
        a.plan.as_deref().unwrap_or("unknown"),
        a.chatgpt_account_id
    )
}

/// Renders rows as left-aligned columns.
pub(crate) fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let n = cells.len();
        for (i, (c, w)) in cells.into_iter().zip(&widths).enumerate() {
            if i + 1 == n {
                out.push_str(&c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = *w));
            }
        }
        out.push('\n');
    };
    line(header.iter().map(|s| s.to_string()).collect(), &mut out);
    for r in rows {
        line(r, &mut out);
    }
    out
}

fn account_table(accounts: &[wire::Account]) -> String {
    if accounts.is_empty() {
        return "no accounts (import one with `switchyard account import ~/.codex/auth.json`)\n"
            .into();
    }
    let mut out = table(
        &[
            "ID",
            "EMAIL",
            "LABEL",
            "PLAN",
            "ACCOUNT ID",
            "PRIORITY",
            "STATE",
            "CREATED",
        ],
        accounts
            .iter()
            .map(|a| {
                let state = match &a.reason {
                    Some(reason) => format!("{} ({reason})", a.state),
                    None => a.state.clone(),
                };
                vec![
                    a.id.clone(),
                    a.email.clone().unwrap_or_else(|| "-".into()),
                    if a.email.as_deref() == Some(a.label.as_str()) {
                        "-".into()
                    } else {
                        a.label.clone()
                    },
                    a.plan.clone().unwrap_or_else(|| "-".into()),
                    a.chatgpt_account_id.clone(),
                    a.priority.to_string(),
                    state,
                    a.created_at.clone(),
                ]
            })
            .collect(),
    );
    // What the operator has to do, said once per account below the table.
    for a in accounts {
        if let Some(detail) = &a.detail {
            out.push_str(&format!("{}: {detail}\n", a.id));
        }
        if let Some(proxy) = &a.proxy {
            out.push_str(&format!("{}: goes out through {proxy}\n", a.id));
        }
    }
    out
}

/// The policy flags as a change: `none` and `--clear-…` remove a limit; a duration for
/// `--expires` counts from now.
fn policy_patch(p: &PolicyArgs) -> Result<wire::KeyPolicyPatch, CommandError> {
    fn num<T: TryFrom<u64>>(
        name: &str,
        v: &Option<Setting<u64>>,
        clear: bool,
    ) -> Result<Option<Option<T>>, CommandError> {
        match (v, clear) {
            (_, true) | (Some(Setting::Clear), _) => Ok(Some(None)),
            (Some(Setting::Set(n)), _) => T::try_from(*n)
                .map(|n| Some(Some(n)))
                .map_err(|_| CommandError::Usage(format!("--{name} {n} is too large"))),
            (None, false) => Ok(None),
        }
    }
    let models = match (&p.models, p.clear_models) {
        (_, true) | (Some(Setting::Clear), _) => Some(Vec::new()),
        (Some(Setting::Set(list)), _) => Some(
            list.split(',')
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty())
                .collect(),
        ),
        (None, false) => None,
    };
    let expires_at = match (&p.expires, p.clear_expires) {
        (_, true) | (Some(Setting::Clear), _) => Some(None),
        (Some(Setting::Set(t)), _) => Some(Some(expiry(t)?)),
        (None, false) => None,
    };
    let note = match (&p.note, p.clear_note) {
        (_, true) | (Some(Setting::Clear), _) => Some(None),
        (Some(Setting::Set(t)), _) => Some(Some(t.clone())),
        (None, false) => None,
    };
    Ok(wire::KeyPolicyPatch {
        models,
        max_concurrency: num(
            "max-concurrency",
            &p.max_concurrency,
            p.clear_max_concurrency,
        )?,
        rpm: num("rpm", &p.rpm, p.clear_rpm)?,
        tokens_per_5h: num("tokens-per-5h", &p.tokens_per_5h, p.clear_tokens_per_5h)?,
        tokens_per_day: num("tokens-per-day", &p.tokens_per_day, p.clear_tokens_per_day)?,
        tokens_per_week: num(
            "tokens-per-week",
            &p.tokens_per_week,
            p.clear_tokens_per_week,
        )?,
        expires_at,
        note,
    })
}

/// `--expires`: a date (00:00 UTC that day), an RFC 3339 time, or a duration from now.
fn expiry(t: &str) -> Result<String, CommandError> {
    if let Some(ms) = parse_time(t) {
        return Ok(clock::rfc3339(ms / 1000));
    }
    match humantime::parse_duration(t) {
        Ok(d) => Ok(clock::rfc3339(clock::system().now_secs() + d.as_secs())),
        Err(_) => Err(CommandError::Usage(format!(
            "--expires `{t}` is not a date (2027-01-31), an RFC 3339 time or a duration (30d)"
        ))),
    }
}

/// YYYY-MM-DD (00:00 UTC) or RFC 3339, as unix ms.
fn parse_time(t: &str) -> Option<u64> {
    clock::parse_rfc3339_ms(t).or_else(|| clock::parse_rfc3339_ms(&format!("{t}T00:00:00Z")))
}

/// One key with its policy, a line per setting.
fn key_detail(k: &wire::Key) -> String {
    let p = &k.policy;
    let num = |v: Option<u64>| v.map_or_else(|| "none".to_string(), |n| n.to_string());
    let mut out = format!(
        "{} {} ({}, {}…, created {})\n",
        k.id,
        k.name,
        if k.enabled { "active" } else { "revoked" },
        k.prefix,
        k.created_at
    );
    let lines = [
        (
            "models",
            if p.models.is_empty() {
                "any".to_string()
            } else {
                p.models.join(", ")
            },
        ),
        ("max concurrency", num(p.max_concurrency.map(u64::from))),
        ("rpm", num(p.rpm.map(u64::from))),
        ("tokens per 5h", num(p.tokens_per_5h)),
        ("tokens per day", num(p.tokens_per_day)),
        ("tokens per week", num(p.tokens_per_week)),
        (
            "expires",
            p.expires_at.clone().unwrap_or_else(|| "never".into()),
        ),
        ("note", p.note.clone().unwrap_or_default()),
    ];
    for (name, value) in lines {
        out.push_str(&format!("  {name:<16} {value}\n"));
    }
    out
}

/// `2M`, `300k` when that is exact, else the number.
fn exact_short(n: u64) -> String {
    match n {
        0 => "0".into(),
        n if n.is_multiple_of(1_000_000) => format!("{}M", n / 1_000_000),
        n if n.is_multiple_of(1_000) => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// A key's limits in a few words, for the key table.
fn limits_summary(p: &wire::KeyPolicy) -> String {
    let mut parts = Vec::new();
    if !p.models.is_empty() {
        parts.push(p.models.join(","));
    }
    if let Some(n) = p.max_concurrency {
        parts.push(format!("{n} at once"));
    }
    if let Some(n) = p.rpm {
        parts.push(format!("{n} rpm"));
    }
    for (w, v) in [
        ("5h", p.tokens_per_5h),
        ("day", p.tokens_per_day),
        ("week", p.tokens_per_week),
    ] {
        if let Some(n) = v {
            parts.push(format!("{} tok/{w}", exact_short(n)));
        }
    }
    if let Some(t) = &p.expires_at {
        parts.push(format!("expires {t}"));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(" · ")
    }
}

async fn report(config: &Config, args: crate::cli::ReportArgs) -> Result<(), CommandError> {
    let windows = report_windows(&args.windows)?;
    let backend = Backend::connect(config, Access::Read).await?;
    let slow_ms = u64::try_from(args.slow.as_millis()).unwrap_or(u64::MAX);
    let result = backend.report(windows, slow_ms).await;
    backend.close().await?;
    let r = result?;
    if args.format == "json" {
        println!("{}", to_json(&r));
    } else {
        print!("{}", switchyard_tui::report::render_text(&r));
    }
    Ok(())
}

/// The report's windows in whole minutes (default 20 and 60).
fn report_windows(given: &[std::time::Duration]) -> Result<Vec<u64>, CommandError> {
    if given.is_empty() {
        return Ok(crate::telemetry::windows::WINDOWS.to_vec());
    }
    given
        .iter()
        .map(|d| {
            let m = d.as_secs() / 60;
            if d.as_secs() % 60 != 0 || !(1..=10_080).contains(&m) {
                Err(CommandError::Usage(format!(
                    "--window {}: a whole number of minutes, from 1m to 7d",
                    humantime::format_duration(*d)
                )))
            } else {
                Ok(m)
            }
        })
        .collect()
}

async fn usage(config: &Config, args: UsageArgs) -> Result<(), CommandError> {
    let backend = Backend::connect(config, Access::Read).await?;
    let result = usage_with(&backend, config, args).await;
    backend.close().await?;
    result
}

async fn usage_with(
    backend: &Backend,
    config: &Config,
    args: UsageArgs,
) -> Result<(), CommandError> {
    use switchyard_tui::usage as report;
    let by = args
        .by
        .iter()
        .map(|g| report::Group::parse(g))
        .collect::<Result<Vec<_>, String>>()
        .map_err(CommandError::Usage)?;
    let now = clock::system().now_secs();
    let (from, to) = match (&args.from, &args.to) {
        (Some(f), Some(t)) => {
            let bad = |what: &str, v: &str| {
                CommandError::Usage(format!(
                    "--{what} `{v}` is not a date (2026-11-01) or an RFC 3339 time"
                ))
            };
            let from = parse_time(f).ok_or_else(|| bad("from", f))? / 1000;
            // A bare date means that whole day.
            let to = match clock::parse_rfc3339_ms(t) {
                Some(ms) => ms / 1000,
                None => parse_time(t).ok_or_else(|| bad("to", t))? / 1000 + 86_400,
            };
            if to <= from {
                return Err(CommandError::Usage("--to must be after --from".into()));
            }
            (from, to)
        }
        _ => {
            let since = args
                .since
                .unwrap_or(std::time::Duration::from_secs(7 * 86_400));
            (now.saturating_sub(since.as_secs()), now + 3600)
        }
    };
    // Hours are whole: the one `from` falls in counts.
    let mut buckets = backend.usage(from - from % 3600, to).await?;
    if let Some(k) = &args.key {
        // The key ring's own resolution (id or name; an ambiguous name lists the ids).
        let id = backend.show_key(k).await?.id;
        buckets.retain(|b| b.key_id == id);
    }
    let accounts: std::collections::BTreeMap<String, String> = backend
        .list_accounts()
        .await?
        .into_iter()
        .map(|a| (a.chatgpt_account_id, a.email.unwrap_or(a.label)))
        .collect();
    let prices = config
        .pricing
        .iter()
        .map(|(m, p)| {
            (
                m.clone(),
                report::Price {
                    input: p.input,
                    cached_input: p.cached_input,
                    output: p.output,
                },
            )
        })
        .collect();
    let r = report::report(&buckets, &by, &prices, &accounts);
    let text = match args.format.as_str() {
        "csv" => report::render_csv(&r),
        "json" => report::render_json(&r),
        _ => report::render_table(&r),
    };
    print!("{text}");
    Ok(())
}

fn key_table(keys: &[wire::Key]) -> String {
    if keys.is_empty() {
        return "no keys (create one with `switchyard key create NAME`)\n".into();
    }
    table(
        &["ID", "NAME", "PREFIX", "STATUS", "CREATED", "LIMITS"],
        keys.iter()
            .map(|k| {
                vec![
                    k.id.clone(),
                    k.name.clone(),
                    format!("{}…", k.prefix),
                    if k.enabled {
                        "active".into()
                    } else {
                        "revoked".into()
                    },
                    k.created_at.clone(),
                    limits_summary(&k.policy),
                ]
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_table_says_why_an_account_needs_a_login() {
        let a = |id: &str, state: &str, reason: Option<&str>, detail: Option<&str>| wire::Account {
            id: id.into(),
            label: format!("{id}@example.com"),
            email: None,
            plan: None,
            chatgpt_account_id: format!("acc-{id}"),
            enabled: true,
            state: state.into(),
            created_at: "2026-11-30T00:00:00Z".into(),
            reason: reason.map(str::to_string),
            detail: detail.map(str::to_string),
            cooldown_until: None,
            cooldown_remaining_s: None,
            level: 0,
            last_error: None,
            in_flight: 0,
            limit: 3,
            limit_exact: 3.0,
            max_concurrency: None,
            priority: 0,
            waiting: 0,
            oldest_wait_ms: None,
            draining: false,
            unsupported_models: Vec::new(),
            quota: None,
            proxy: None,
            error_rates: Vec::new(),
        };
        let t = account_table(&[
            a("a1", "ready", None, None),
            a("a2", "cooling", Some("edge_challenge"), None),
            a(
                "a3",
                "needs_reauth",
                Some("auth_dead"),
                Some("this login's refresh token was used by another client"),
            ),
        ]);
        assert!(t.contains("cooling (edge_challenge)"), "{t}");
        assert!(t.contains("needs_reauth (auth_dead)"), "{t}");
        assert!(
            t.ends_with("a3: this login's refresh token was used by another client\n"),
            "{t}"
        );
    }

    #[test]
    fn tables_align_columns() {
        let t = table(&["A", "BB"], vec![vec!["xxx".into(), "y".into()]]);
        assert_eq!(t, "A    BB\nxxx  y\n");
    }
}
