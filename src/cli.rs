//! The command line (clap derive). Every flag can also be set by an environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Pools Codex (ChatGPT) accounts behind one OpenAI-Responses-compatible endpoint"
)]
pub struct Cli {
    /// Config file (TOML). Without one, the documented defaults apply.
    #[arg(long, global = true, env = "SWITCHYARD_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// State directory (default: $STATE_DIRECTORY under systemd, else ./switchyard-data).
    #[arg(long, global = true, env = "SWITCHYARD_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway.
    Serve(ServeArgs),
    /// Manage upstream accounts.
    #[command(subcommand)]
    Account(AccountCommand),
    /// Manage client keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Check or print the configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Run the simulated Codex backend on loopback (to try switchyard without real accounts).
    Sim(SimArgs),
    /// Try switchyard with nothing to set up: a simulated backend with failing accounts, the
    /// gateway, synthetic clients and the console, all in a temporary directory.
    Demo(DemoArgs),
    /// Watch and act on a running daemon: accounts, affinity, queues, transports, requests.
    Console(ConsoleArgs),
}

#[derive(Debug, Args)]
pub struct ConsoleArgs {
    /// The daemon's admin socket (default: the configured `[admin] socket`).
    #[arg(
        long,
        env = "SWITCHYARD_CONSOLE_SOCKET",
        value_name = "PATH",
        conflicts_with = "url"
    )]
    pub socket: Option<PathBuf>,
    /// The daemon's admin API over TCP, `http://HOST:PORT` (needs --token).
    #[arg(
        long,
        env = "SWITCHYARD_CONSOLE_URL",
        value_name = "URL",
        requires = "token"
    )]
    pub url: Option<String>,
    /// The daemon's `[admin] token`, for --url.
    #[arg(
        long,
        env = "SWITCHYARD_CONSOLE_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Do not open the console: print the endpoints (`gateway URL`, `admin SOCKET`, `key KEY`,
    /// `state DIR`, `log FILE`), one per line, and run until SIGINT, SIGTERM or SIGHUP.
    #[arg(long, env = "SWITCHYARD_DEMO_NO_CONSOLE")]
    pub no_console: bool,
    /// Stop by itself after this long, e.g. "5m" (default: until the console is closed or a
    /// signal arrives).
    #[arg(long, env = "SWITCHYARD_DEMO_DURATION", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub duration: Option<std::time::Duration>,
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(
        long,
        env = "SWITCHYARD_SIM_LISTEN",
        default_value = "127.0.0.1:9090",
        value_name = "ADDR"
    )]
    pub listen: SocketAddr,
    /// Number of simulated accounts.
    #[arg(long, env = "SWITCHYARD_SIM_ACCOUNTS", default_value_t = 3)]
    pub accounts: u32,
    /// Write one Codex auth.json per account into this directory.
    #[arg(long, env = "SWITCHYARD_SIM_WRITE_AUTH", value_name = "DIR")]
    pub write_auth: Option<PathBuf>,
    /// Lifetime of the access tokens it issues, e.g. "1h" or "90s".
    #[arg(long, env = "SWITCHYARD_SIM_ACCESS_TTL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub access_ttl: std::time::Duration,
    /// A named fault schedule: healthy, demo, flaky, exhausted, slow.
    #[arg(long, env = "SWITCHYARD_SIM_PROFILE", value_name = "NAME")]
    pub profile: Option<String>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the client-facing listener (default 127.0.0.1:8080).
    #[arg(long, env = "SWITCHYARD_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print JSON instead of a table.
    #[arg(long, env = "SWITCHYARD_JSON")]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum AccountCommand {
    /// Import Codex auth.json files (`-` reads one from stdin). Re-importing an account updates
    /// its tokens.
    Import {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// List accounts.
    List(ListArgs),
    /// Let an account take requests again.
    Enable { id: String },
    /// Stop sending requests to an account.
    Disable { id: String },
    /// Remove an account and its tokens.
    Remove { id: String },
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create a client key; prints it once, alone on its line.
    Create { name: String },
    /// List client keys (never the keys themselves).
    List(ListArgs),
    /// Revoke a client key.
    Revoke { id: String },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the configuration and print the effective values (secrets masked).
    Check,
    /// Print the documented default configuration.
    Default,
}
