//! What `switchyard X` does. `args` is the command line (clap); one file per command family
//! carries it out. Management commands talk to a running daemon through its admin socket (so
//! it sees the change at once) and otherwise open the store directly (`backend`); both paths
//! yield the same wire types, printed by the same code, so the output is identical.

mod account;
pub mod args;
mod backend;
mod backup;
mod demo;
mod doctor;
mod key;
mod login;
mod notify;
mod report;
mod table;
mod usage;
pub mod usage_report;

use std::path::PathBuf;

use switchyard_admin::{AdminClient, ClientError, Target};

pub use self::args::Cli;
use self::args::{Command, ConfigCommand};
use crate::base::clock::{self, SharedClock};
use crate::config::{self, Config, ConfigError};
use crate::daemon::systemd::Notifier;
use crate::daemon::{self, BootError};
use crate::fleet::FleetError;
use crate::fleet::auth_file::AuthFileError;
use crate::keys::KeyError;
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
    Demo(#[from] self::demo::DemoError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Backup(crate::store::backup::BackupError),
    #[error(transparent)]
    Restore(#[from] self::backup::RestoreError),
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
        return Ok(runtime()?.block_on(self::doctor::run(loaded, args)));
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
            runtime()?.block_on(account::account(&config, cmd))
        }
        Command::Key(cmd) => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(key::key(&config, cmd))
        }
        Command::Usage(args) => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(usage::usage(&config, args))
        }
        Command::Report(args) => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(report::report(&config, args))
        }
        Command::Doctor(_) => Ok(()),
        Command::Backup(args) => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(self::backup::backup(&config, args))
        }
        Command::Restore(args) => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(self::backup::restore(&config, args))
        }
        Command::Reload => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(reload(&config, &source))
        }
        Command::Notify(cmd) => {
            telemetry::init_logging("warn", config.log.format);
            runtime()?.block_on(self::notify::notify(&config, cmd))
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
    let store = match Store::open_with_cache(&dir, config.storage.cache_bytes()) {
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
    let r = client.reload(&text).await?;
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

async fn sim(args: args::SimArgs) -> Result<(), CommandError> {
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
async fn demo(args: args::DemoArgs, config: &Config) -> Result<(), CommandError> {
    let opts = demo::DemoOptions {
        console: !args.no_console,
        duration: args.duration,
        log_level: config.log.level.clone(),
    };
    Ok(demo::run(opts).await?)
}

/// A secret read from `file`, or one line from stdin for `-`: trimmed, and never empty.
/// Secrets come this way (or from the environment) so they are not on a command line, which
/// every local user can read while the command runs.
pub(crate) fn read_secret(file: &std::path::Path, flag: &str) -> Result<String, CommandError> {
    let text = if file == std::path::Path::new("-") {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map_err(|source| CommandError::Read {
                path: "stdin".into(),
                source,
            })?;
        line
    } else {
        std::fs::read_to_string(file).map_err(|source| CommandError::Read {
            path: file.display().to_string(),
            source,
        })?
    };
    let secret = text.trim();
    if secret.is_empty() {
        return Err(CommandError::Usage(format!(
            "{flag}: {} is empty",
            if file == std::path::Path::new("-") {
                "stdin".to_string()
            } else {
                file.display().to_string()
            }
        )));
    }
    Ok(secret.to_string())
}

/// `switchyard console`: on the admin socket unless a URL is given.
async fn console(args: args::ConsoleArgs, config: &Config) -> Result<(), CommandError> {
    let token = match &args.token_file {
        Some(file) => Some(read_secret(file, "--token-file")?),
        None => args.token,
    };
    let target = match (args.url, args.socket) {
        (Some(url), _) => Target::from_url(&url, token.as_deref().unwrap_or_default())?,
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
        && let Ok(status) = client.status().await
    {
        return CommandError::AlreadyServing {
            pid: status.pid,
            dir: state_dir(config),
            socket,
        };
    }
    CommandError::LockedWithoutDaemon { path, socket }
}
