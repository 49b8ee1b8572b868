//! The command line (clap derive). Every flag can also be set by an environment variable, except
//! the values of one key's policy, one account's settings and one report, which belong on the
//! command line.

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
    /// Usage totals per key, model, account, day or hour: requests, errors, tokens by kind,
    /// cache hit ratio (and the API-equivalent cost with `[pricing]`).
    Usage(UsageArgs),
    /// The error analysis of the request records, per window: the clients' and the upstream's
    /// error rates, failovers, requests that ran out of candidates, models no account serves,
    /// failures after the answer began, slow failures, each account's failures by cause — and
    /// the changes the numbers suggest.
    Report(ReportArgs),
    /// Write a consistent backup of the store to FILE (0600), through the daemon while it
    /// serves, else from the store itself. Without --include-key it does not hold secret.key
    /// (restoring it then needs that key).
    Backup(BackupArgs),
    /// Restore a backup into the state directory (refused when it is not empty, unless
    /// --force), checking that the key opens it. The daemon must be stopped.
    Restore(RestoreArgs),
    /// Check the installation: config, state directory and file modes, the store's integrity
    /// and unreadable rows, the key, every account's tokens and login, the clock and the
    /// upstream (unless --offline), the listener's exposure, the installed unit. Exit 0 all
    /// fine, 1 warnings, 2 errors.
    Doctor(DoctorArgs),
    /// Send the configuration (--config) to the running daemon, which applies what changes
    /// live and logs what waits for a restart. SIGHUP re-reads the daemon's own copy instead.
    Reload,
    /// The `[[notify]]` targets: send a test message, or seal a target's secret.
    #[command(subcommand)]
    Notify(NotifyCommand),
}

#[derive(Debug, Subcommand)]
pub enum NotifyCommand {
    /// Send one test message to every target (or the one named: its `name`, else
    /// `webhook-1`, `ntfy-2`, … by kind and position) and say what each answered. Exit 0 when
    /// all were delivered.
    Test { target: Option<String> },
    /// Seal a secret (`secret`, `token`, `bot_token`) with the state directory's key: prints
    /// `sealed:…` to put in the config instead of the secret itself.
    Seal {
        /// Where to read it (`-`: one line from stdin).
        #[arg(default_value = "-", value_name = "FILE|-")]
        file: std::path::PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A window to report on, ending now (repeat it; default 20m and 60m).
    #[arg(long = "window", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub windows: Vec<std::time::Duration>,
    /// A failed attempt slower than this counts as a slow failure (it ate the client's time).
    #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION", default_value = "30s")]
    pub slow: std::time::Duration,
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub format: String,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Skip the checks that need the network (upstream DNS, TLS, clock).
    #[arg(long, env = "SWITCHYARD_DOCTOR_OFFLINE")]
    pub offline: bool,
    /// Print the findings as JSON.
    #[arg(long, env = "SWITCHYARD_JSON")]
    pub json: bool,
    /// Where the systemd units are looked for (default: /etc/systemd/system, then
    /// /lib/systemd/system and /usr/lib/systemd/system).
    #[arg(long, env = "SWITCHYARD_DOCTOR_UNIT_DIR", value_name = "DIR")]
    pub unit_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// Where to write the backup.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Put secret.key in the backup too (then the file alone opens every account's tokens:
    /// keep it like a password).
    #[arg(long, env = "SWITCHYARD_BACKUP_INCLUDE_KEY")]
    pub include_key: bool,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The backup to restore.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The secret.key the backup was sealed with, when the backup does not hold it (default:
    /// the one already in the state directory).
    #[arg(long, env = "SWITCHYARD_RESTORE_KEY", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Replace the store (and key) of a state directory that is not empty.
    #[arg(long, env = "SWITCHYARD_RESTORE_FORCE")]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Group by these, in order (`--by key,day`); without it, one line of totals.
    #[arg(long, value_delimiter = ',', value_name = "key|model|account|day|hour")]
    pub by: Vec<String>,
    /// The period: this long before now, e.g. "7d", "24h" (default 7d).
    #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION", conflicts_with_all = ["from", "to"])]
    pub since: Option<std::time::Duration>,
    /// Start of the period: YYYY-MM-DD (00:00 UTC) or an RFC 3339 time.
    #[arg(long, value_name = "DATE", requires = "to")]
    pub from: Option<String>,
    /// End of the period: YYYY-MM-DD (that whole day, UTC) or an RFC 3339 time.
    #[arg(long, value_name = "DATE", requires = "from")]
    pub to: Option<String>,
    /// Only this key (id or name).
    #[arg(long, value_name = "ID|NAME")]
    pub key: Option<String>,
    #[arg(long, default_value = "table", value_parser = ["table", "csv", "json"])]
    pub format: String,
}

/// A policy value given on the command line: a value, or `none` to remove it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting<T> {
    Set(T),
    Clear,
}

fn limit(s: &str) -> Result<Setting<u64>, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Setting::Clear);
    }
    let digits: String = s.chars().filter(|c| *c != '_').collect();
    let (num, mult) = match digits.chars().last() {
        Some('k' | 'K') => (&digits[..digits.len() - 1], 1_000),
        Some('m' | 'M') => (&digits[..digits.len() - 1], 1_000_000),
        _ => (digits.as_str(), 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n > 0)
        .map(Setting::Set)
        .ok_or_else(|| format!("`{s}` is not a positive number (or `none`); 1500, 200k, 2M"))
}

fn text(s: &str) -> Result<Setting<String>, String> {
    Ok(if s.eq_ignore_ascii_case("none") {
        Setting::Clear
    } else {
        Setting::Set(s.to_string())
    })
}

/// A key's policy on the command line (`key create`, `key update`).
#[derive(Debug, Clone, Default, Args)]
pub struct PolicyArgs {
    /// Models the key may use, as globs: `gpt-5*,o4-mini` (`none`: every model).
    #[arg(long, value_name = "GLOB,…", value_parser = text)]
    pub models: Option<Setting<String>>,
    /// Requests of this key running at once; more wait in the key's queue.
    #[arg(long, value_name = "N|none", value_parser = limit)]
    pub max_concurrency: Option<Setting<u64>>,
    /// Requests per rolling minute.
    #[arg(long, value_name = "N|none", value_parser = limit)]
    pub rpm: Option<Setting<u64>>,
    /// Input + output tokens per rolling 5 hours (200k, 2M, …).
    #[arg(long = "tokens-per-5h", value_name = "N|none", value_parser = limit)]
    pub tokens_per_5h: Option<Setting<u64>>,
    /// Input + output tokens per rolling 24 hours.
    #[arg(long, value_name = "N|none", value_parser = limit)]
    pub tokens_per_day: Option<Setting<u64>>,
    /// Input + output tokens per rolling 7 days.
    #[arg(long, value_name = "N|none", value_parser = limit)]
    pub tokens_per_week: Option<Setting<u64>>,
    /// When the key stops working: YYYY-MM-DD, an RFC 3339 time, or a duration from now ("30d").
    #[arg(long, value_name = "DATE|DURATION|none", value_parser = text)]
    pub expires: Option<Setting<String>>,
    /// A note for operators.
    #[arg(long, value_name = "TEXT", value_parser = text)]
    pub note: Option<Setting<String>>,
    /// Service tiers a request may ask for: `default,priority` (`default` is a request that
    /// asks for none; Codex's Fast mode is `priority`; `none`: every tier).
    #[arg(long, value_name = "TIER,…", value_parser = text)]
    pub tiers: Option<Setting<String>>,
    #[arg(long, conflicts_with = "models", help = "Remove the model restriction")]
    pub clear_models: bool,
    #[arg(
        long,
        conflicts_with = "tiers",
        help = "Remove the service tier restriction"
    )]
    pub clear_tiers: bool,
    #[arg(
        long,
        conflicts_with = "max_concurrency",
        help = "Remove --max-concurrency"
    )]
    pub clear_max_concurrency: bool,
    #[arg(long, conflicts_with = "rpm", help = "Remove --rpm")]
    pub clear_rpm: bool,
    #[arg(
        long = "clear-tokens-per-5h",
        conflicts_with = "tokens_per_5h",
        help = "Remove --tokens-per-5h"
    )]
    pub clear_tokens_per_5h: bool,
    #[arg(
        long,
        conflicts_with = "tokens_per_day",
        help = "Remove --tokens-per-day"
    )]
    pub clear_tokens_per_day: bool,
    #[arg(
        long,
        conflicts_with = "tokens_per_week",
        help = "Remove --tokens-per-week"
    )]
    pub clear_tokens_per_week: bool,
    #[arg(long, conflicts_with = "expires", help = "Remove --expires")]
    pub clear_expires: bool,
    #[arg(long, conflicts_with = "note", help = "Remove --note")]
    pub clear_note: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("token_source").args(["token", "token_file"])))]
pub struct ConsoleArgs {
    /// The daemon's admin socket (default: the configured `[admin] socket`).
    #[arg(
        long,
        env = "SWITCHYARD_CONSOLE_SOCKET",
        value_name = "PATH",
        conflicts_with = "url"
    )]
    pub socket: Option<PathBuf>,
    /// The daemon's admin API over TCP, `http://HOST:PORT` (needs --token-file or the
    /// token in the environment).
    #[arg(
        long,
        env = "SWITCHYARD_CONSOLE_URL",
        value_name = "URL",
        requires = "token_source"
    )]
    pub url: Option<String>,
    /// The daemon's `[admin] token`, for --url. On the command line other local users can
    /// read it while the console runs: prefer --token-file or the environment.
    #[arg(
        long,
        env = "SWITCHYARD_CONSOLE_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// The `[admin] token` read from FILE (`-`: one line from stdin).
    #[arg(long, value_name = "FILE|-")]
    pub token_file: Option<PathBuf>,
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
    /// The login then belongs to Switchyard: it refreshes the tokens once to take ownership,
    /// and the Codex CLI they came from must log in again (or use the gateway).
    ///
    /// A Business or Enterprise workspace's access token (`at-…`, no refresh token) is
    /// imported with `--access-token TOKEN` (`-` reads it from stdin), or as an auth.json
    /// that holds only `tokens.access_token`: the auth server is asked whose it is, and it is
    /// used until it expires, never refreshed.
    Import {
        #[arg(required_unless_present = "access_token", value_name = "FILE")]
        files: Vec<PathBuf>,
        /// A workspace access token to import instead of a file (`-`: read it from stdin).
        #[arg(long, value_name = "TOKEN", env = "SWITCHYARD_ACCESS_TOKEN")]
        access_token: Option<String>,
        /// Do not refresh at import (the source keeps working until either side refreshes).
        #[arg(long, env = "SWITCHYARD_IMPORT_NO_REFRESH")]
        no_refresh: bool,
    },
    /// Log an account in the way Codex CLI does: a device code to enter in any browser (the
    /// default), or `--browser` for the PKCE flow. The login is stored (through the daemon when
    /// one runs) only once it succeeded.
    Login {
        /// Open the browser flow: prints the authorize URL; the login completes by the local
        /// callback on 127.0.0.1:1455 or by pasting the final redirect URL.
        #[arg(long)]
        browser: bool,
        /// Log in again as this existing account (id, email or label): it keeps its id, history,
        /// health and affinity.
        #[arg(long, value_name = "ID")]
        account: Option<String>,
    },
    /// Write an account's login as a Codex auth.json (0600) and, unless --keep, disable it
    /// here: a login lives in one place.
    Export {
        id: String,
        /// Where to write it (default: stdout).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Keep serving requests with it here too (the two copies will fight over refreshes).
        #[arg(long)]
        keep: bool,
    },
    /// List accounts.
    List(ListArgs),
    /// Let an account take requests again.
    Enable { id: String },
    /// Stop sending requests to an account.
    Disable { id: String },
    /// Remove an account and its tokens.
    Remove { id: String },
    /// Change an account's label, priority (lower is preferred; equal priorities follow the
    /// strategy), its own concurrency cap or its egress proxy.
    Set(AccountSetArgs),
    /// Spend one of the account's rate-limit reset credits (the soonest to expire) to reset
    /// its spent usage windows now. A spend cannot be undone; refused when no window is
    /// spent, the account has a single window, or it holds no credit. Needs the daemon.
    ResetWindow {
        id: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Args)]
pub struct AccountSetArgs {
    /// The account: its id, chatgpt_account_id, email or label.
    pub id: String,
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
    /// Lower goes first, under every strategy (default 0; negative allowed).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub priority: Option<i32>,
    /// Requests at once on this account (`none`: the pool's `max_concurrency`).
    #[arg(long, value_name = "N|none", value_parser = limit)]
    pub max_concurrency: Option<Setting<u64>>,
    /// Its egress proxy for every upstream call (`http://`, `https://`, `socks5://`,
    /// `socks5h://`, optional `user:password@`; stored sealed). `none`: `[upstream] proxy`, or
    /// straight out.
    #[arg(long, value_name = "URL|none", value_parser = proxy_setting)]
    pub proxy: Option<Setting<String>>,
    /// --proxy read from FILE (`-`: one line from stdin), so that a password in it is not on
    /// the command line, where other local users can read it while the command runs.
    #[arg(long, value_name = "FILE|-", conflicts_with = "proxy")]
    pub proxy_file: Option<PathBuf>,
}

pub(super) fn proxy_setting(s: &str) -> Result<Setting<String>, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Setting::Clear);
    }
    crate::upstream::egress::ProxyUrl::parse(s).map(|p| Setting::Set(p.as_url()))
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create a client key, with its policy; prints the key once, alone on its line.
    Create {
        name: String,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Change a key's policy (applies to its next request).
    Update {
        #[arg(value_name = "ID|NAME")]
        id: String,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Show one key and its policy.
    Show {
        #[arg(value_name = "ID|NAME")]
        id: String,
        #[command(flatten)]
        list: ListArgs,
    },
    /// List client keys (never the keys themselves).
    List(ListArgs),
    /// Revoke a client key.
    Revoke {
        #[arg(value_name = "ID|NAME")]
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the configuration and print the effective values (secrets masked).
    Check,
    /// Print the documented default configuration.
    Default,
}
