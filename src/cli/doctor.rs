//! `switchyard doctor`: every check an operator would make by hand, each a finding with what
//! to do about it, printed as one table. Exit 0 when all is fine, 1 with warnings, 2 with
//! errors. It only reads: through the daemon when one answers, else the store opened
//! read-only (its integrity is checked on a private copy, since redb's check writes).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use switchyard_admin::AdminClient;
use switchyard_admin::wire;

use super::args::DoctorArgs;
use crate::api::view;
use crate::config::{Config, ConfigError};
use crate::fleet::Fleet;
use crate::store::secrets::KEY_FILE;
use crate::store::{self, DB_FILE, Integrity, Store};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warning,
    Error,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warning => "warning",
            Level::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub level: Level,
    pub check: &'static str,
    pub finding: String,
    /// What to do; empty when nothing is to be done.
    pub remedy: String,
}

#[derive(Default)]
struct Report(Vec<Finding>);

impl Report {
    fn add(&mut self, level: Level, check: &'static str, finding: impl Into<String>, remedy: &str) {
        self.0.push(Finding {
            level,
            check,
            finding: finding.into(),
            remedy: remedy.to_string(),
        });
    }
    fn ok(&mut self, check: &'static str, finding: impl Into<String>) {
        self.add(Level::Ok, check, finding, "");
    }
    fn warn(&mut self, check: &'static str, finding: impl Into<String>, remedy: &str) {
        self.add(Level::Warning, check, finding, remedy);
    }
    fn error(&mut self, check: &'static str, finding: impl Into<String>, remedy: &str) {
        self.add(Level::Error, check, finding, remedy);
    }
}

/// Runs every check and prints the table (or JSON); returns the exit code.
pub async fn run(config: Result<Config, ConfigError>, args: &DoctorArgs) -> u8 {
    let mut r = Report::default();
    match config {
        Ok(config) => {
            r.ok("config", "valid");
            checks(&config, args, &mut r).await;
        }
        Err(e) => r.error(
            "config",
            e.to_string(),
            "fix what it names (`switchyard config check` prints the values in force); the \
             other checks need a valid config",
        ),
    }
    print(&r, args.json);
    match r.0.iter().map(|f| f.level).max() {
        Some(Level::Error) => 2,
        Some(Level::Warning) => 1,
        _ => 0,
    }
}

fn print(r: &Report, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r.0).unwrap_or_else(|e| format!("\"{e}\""))
        );
        return;
    }
    let rows =
        r.0.iter()
            .map(|f| {
                vec![
                    f.level.as_str().to_string(),
                    f.check.to_string(),
                    f.finding.clone(),
                    if f.remedy.is_empty() {
                        "-".into()
                    } else {
                        f.remedy.clone()
                    },
                ]
            })
            .collect();
    print!(
        "{}",
        super::table::table(&["STATUS", "CHECK", "FINDING", "REMEDY"], rows)
    );
    let count = |l: Level| r.0.iter().filter(|f| f.level == l).count();
    println!(
        "{} ok, {} warnings, {} errors",
        count(Level::Ok),
        count(Level::Warning),
        count(Level::Error)
    );
}

async fn checks(config: &Config, args: &DoctorArgs, r: &mut Report) {
    let dir = config.state_dir(&crate::config::process_env);
    let socket = config.admin_socket(&crate::config::process_env);
    let daemon =
        match AdminClient::connect(&socket).await {
            Ok(c) => match c.status().await {
                Ok(status) => {
                    daemon_version(&status, r);
                    Some(c)
                }
                Err(e) => {
                    r.error(
                    "daemon",
                    format!("something answers on {} but not as switchyard: {e}", socket.display()),
                    "check what listens there (`ss -xlp`), and the `[admin] socket` of the config",
                );
                    None
                }
            },
            Err(_) => {
                r.ok(
                    "daemon",
                    format!("not running (no answer on {})", socket.display()),
                );
                None
            }
        };
    files(&dir, r);
    let accounts = match &daemon {
        Some(c) => through_daemon(c, r).await,
        None => direct(&dir, r).await,
    };
    if let Some(accounts) = accounts {
        logins(&accounts, r);
    }
    if args.offline {
        r.ok("upstream", "not checked (--offline)");
    } else {
        upstream(config, r).await;
    }
    exposure(config, r);
    unit(config, args.unit_dir.as_deref(), r);
}

fn daemon_version(status: &wire::Status, r: &mut Report) {
    let mine = env!("CARGO_PKG_VERSION");
    if status.version == mine {
        r.ok(
            "daemon",
            format!(
                "running (pid {}, up {} s), this version",
                status.pid, status.uptime_s
            ),
        );
    } else {
        r.warn(
            "daemon",
            format!(
                "running switchyard {} (pid {}); this binary is {mine}",
                status.version, status.pid
            ),
            "restart it to run this binary (`systemctl restart switchyard`)",
        );
    }
}

fn mode(path: &Path) -> Option<u32> {
    std::fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o777)
}

/// The state directory and its files: there, and private.
fn files(dir: &Path, r: &mut Report) {
    let shown = dir.display();
    match std::fs::metadata(dir) {
        Err(_) => {
            r.warn(
                "state directory",
                format!("{shown} does not exist yet"),
                "it is created (0700) at the first start or import; check --config if one was expected",
            );
            return;
        }
        Ok(m) if !m.is_dir() => {
            r.error(
                "state directory",
                format!("{shown} is not a directory"),
                "point [storage] state_dir at a directory",
            );
            return;
        }
        Ok(_) => {}
    }
    match store::open_to_others(dir) {
        Some(m) => r.warn(
            "state directory",
            format!("{shown} has mode {m:04o}: other users may look inside"),
            &format!("chmod 700 {shown}"),
        ),
        None => r.ok("state directory", format!("{shown} (0700)")),
    }
    for f in [DB_FILE, KEY_FILE] {
        let path = dir.join(f);
        match mode(&path) {
            None => {}
            Some(m) if m & 0o077 != 0 => r.warn(
                "file modes",
                format!("{} has mode {m:04o}", path.display()),
                &format!("chmod 600 {}", path.display()),
            ),
            Some(m) => r.ok("file modes", format!("{f} {m:04o}")),
        }
    }
}

/// The store through the daemon: its scan and quarantine, and its accounts.
async fn through_daemon(c: &AdminClient, r: &mut Report) -> Option<Vec<wire::Account>> {
    match c.doctor().await {
        Ok(report) => {
            r.ok(
                "store integrity",
                "every page's checksum verified when the daemon opened it",
            );
            r.ok(
                "secret.key",
                format!("opens the store (key id {})", report.key_id),
            );
            store_findings(&report, r);
        }
        Err(e) => r.error(
            "store",
            format!("the daemon cannot read its store: {e}"),
            "see the daemon's log (`journalctl -u switchyard`)",
        ),
    }
    c.accounts().await.ok()
}

/// The store read directly (read-only), its integrity checked on a copy.
async fn direct(dir: &Path, r: &mut Report) -> Option<Vec<wire::Account>> {
    if !dir.join(DB_FILE).exists() {
        r.ok("store", "no store yet (nothing imported)");
        return None;
    }
    match store::check_integrity_of_copy(dir) {
        Ok(Integrity::Verified) => r.ok("store integrity", "every page's checksum verifies"),
        Ok(Integrity::NewestCommitDamaged) => r.warn(
            "store integrity",
            "the newest commit does not verify; the next start rolls back to the one before",
            "restore a backup if what the last commit held matters; otherwise start the daemon",
        ),
        Err(e) => {
            r.error(
                "store integrity",
                e.to_string(),
                "restore a backup (`switchyard restore FILE`)",
            );
            return None;
        }
    }
    let store = match Store::open_read_only(dir) {
        Ok(s) => s,
        Err(e) => {
            let check = match e {
                store::StoreError::SecretKeyMissing { .. }
                | store::StoreError::SecretKeyCorrupt { .. }
                | store::StoreError::SecretKeyMismatch { .. } => "secret.key",
                _ => "store",
            };
            r.error(
                check,
                e.to_string(),
                "see the finding; restore both files from one backup",
            );
            return None;
        }
    };
    r.ok(
        "secret.key",
        format!("opens the store (key id {})", store.key_id()),
    );
    // The fleet's own reading (stored names this binary knows) quarantines too.
    let fleet = Fleet::load(store.clone(), crate::base::clock::system());
    match store.scan() {
        Ok(scan) => store_findings(&view::store_report(&store, scan), r),
        Err(e) => r.error("store", e.to_string(), "restore a backup"),
    }
    let accounts = fleet.ok().map(|f| view::accounts(&f.list()));
    let _ = store.close().await;
    accounts
}

fn store_findings(report: &wire::StoreReport, r: &mut Report) {
    let rows: u64 = report.rows.iter().map(|(_, n)| n).sum();
    let tokens: Vec<&wire::QuarantinedRow> = report
        .quarantined
        .iter()
        .filter(|q| q.table == "account_secrets" || q.table == "account_proxies")
        .collect();
    let others: Vec<&wire::QuarantinedRow> = report
        .quarantined
        .iter()
        .filter(|q| q.table != "account_secrets" && q.table != "account_proxies")
        .collect();
    if others.is_empty() {
        r.ok("unreadable rows", format!("none ({rows} rows read)"));
    } else {
        let list: Vec<String> = others
            .iter()
            .map(|q| format!("{}/{} ({})", q.table, q.key, q.error))
            .collect();
        r.warn(
            "unreadable rows",
            format!(
                "{} left out, the rest serves: {}",
                others.len(),
                list.join("; ")
            ),
            "restore a backup to get them back, or make them again (a key: create and revoke; \
             an account: log it in again)",
        );
    }
    for q in tokens {
        let what = if q.table == "account_proxies" {
            "egress proxy"
        } else {
            "tokens"
        };
        r.error(
            "account tokens",
            format!("the {what} of account {} cannot be opened ({})", q.key, q.error),
            &format!(
                "switchyard account login --account {} (or restore the backup and key that go together)",
                q.key
            ),
        );
    }
    for id in &report.without_tokens {
        r.error(
            "account tokens",
            format!("account {id} has no tokens"),
            &format!("switchyard account login --account {id}"),
        );
    }
    if report
        .quarantined
        .iter()
        .all(|q| q.table != "account_secrets")
        && report.without_tokens.is_empty()
    {
        r.ok("account tokens", "every account's tokens open");
    }
}

fn logins(accounts: &[wire::Account], r: &mut Report) {
    let dead: Vec<&wire::Account> = accounts
        .iter()
        .filter(|a| a.state == wire::AccountState::NeedsReauth)
        .collect();
    if dead.is_empty() {
        r.ok(
            "logins",
            format!("{} accounts, none needs a new login", accounts.len()),
        );
    }
    for a in dead {
        r.warn(
            "logins",
            format!(
                "account {} ({}) needs a new login: {}",
                a.id,
                a.email.as_deref().unwrap_or(&a.label),
                a.detail.as_deref().unwrap_or("its login is dead")
            ),
            &format!("switchyard account login --account {}", a.id),
        );
    }
}

/// DNS, TLS and an HTTP answer from each upstream origin; the clock against the backend's
/// `Date`.
async fn upstream(config: &Config, r: &mut Report) {
    crate::upstream::install_crypto_provider();
    let up = &config.upstream;
    let http = match crate::upstream::http_client(up)
        .timeout(std::time::Duration::from_secs(10))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            r.error("upstream", format!("no HTTP client: {e}"), "");
            return;
        }
    };
    let mut checked = Vec::new();
    for url in [&up.base_url, &up.oauth_token_url] {
        let Ok(uri) = url.parse::<axum::http::Uri>() else {
            continue;
        };
        let Some(host) = uri.host().map(str::to_string) else {
            continue;
        };
        if checked.contains(&host) {
            continue;
        }
        checked.push(host.clone());
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme_str() == Some("http") {
                80
            } else {
                443
            });
        if up.proxy.is_none()
            && let Err(e) = tokio::net::lookup_host((host.as_str(), port)).await
        {
            r.error(
                "upstream",
                format!("cannot resolve {host}: {e}"),
                "check the host's DNS, or set [upstream] proxy",
            );
            continue;
        }
        match http.get(url.as_str()).send().await {
            Ok(resp) => {
                r.ok(
                    "upstream",
                    format!("{host} answers (HTTP {})", resp.status().as_u16()),
                );
                if let Some(date) = resp
                    .headers()
                    .get("date")
                    .and_then(|d| d.to_str().ok())
                    .and_then(|d| httpdate::parse_http_date(d).ok())
                {
                    clock(date, &host, r);
                }
            }
            Err(e) => r.error(
                "upstream",
                format!("cannot reach {url}: {e}"),
                "check the network, a firewall, or [upstream] proxy",
            ),
        }
    }
}

fn clock(date: std::time::SystemTime, host: &str, r: &mut Report) {
    let now = std::time::SystemTime::now();
    let skew = match now.duration_since(date) {
        Ok(d) => d.as_secs(),
        Err(e) => e.duration().as_secs(),
    };
    // `Date` has whole seconds, and the answer took some time.
    if skew <= 5 {
        r.ok("clock", format!("within {skew} s of {host}"));
    } else {
        let level = if skew > 300 {
            Level::Error
        } else {
            Level::Warning
        };
        r.add(
            level,
            "clock",
            format!("{skew} s off {host}'s clock: token expiries and cooldowns go wrong"),
            "turn time synchronisation on (`timedatectl set-ntp true`)",
        );
    }
}

/// Who can reach the listener, and what they get there.
fn exposure(config: &Config, r: &mut Report) {
    let listen = config.server.listen;
    let loopback = listen.ip().is_loopback();
    if loopback {
        r.ok("listener", format!("{listen}: loopback only"));
    } else {
        r.warn(
            "listener",
            format!("{listen} is reachable from the network, in plain HTTP"),
            "put TLS (a reverse proxy) or a trusted network in front, or listen on 127.0.0.1",
        );
        if config.admin.token.is_some() {
            r.warn(
                "listener",
                "the admin API is served there too ([admin] token), in plain HTTP",
                "keep the admin API on the socket (remove [admin] token), or put TLS in front",
            );
        }
    }
    match (&config.admin.metrics_token, loopback) {
        (Some(_), _) => r.ok("metrics", "/metrics needs [admin] metrics_token"),
        (None, true) => r.ok(
            "metrics",
            "/metrics is open to local users (set [admin] metrics_token to restrict it)",
        ),
        (None, false) => r.warn(
            "metrics",
            "/metrics is open to the network: account ids and states, per-key counters",
            "set [admin] metrics_token and scrape with it",
        ),
    }
}

/// The unit this release ships, to compare an installed one with.
const PACKAGED_UNIT: &str = include_str!("../../packaging/systemd/switchyard.service");

/// The unit's directives without comments, with the binary's path taken out of the command
/// lines (an installation may put it anywhere).
fn directives(unit: &str) -> Vec<String> {
    unit.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .map(|l| match exec_binary(l) {
            Some(bin) => l.replacen(&bin, "BINARY", 1),
            None => l.to_string(),
        })
        .collect()
}

/// The program of an `ExecStart=`/`ExecReload=` line.
fn exec_binary(line: &str) -> Option<String> {
    let rest = line
        .strip_prefix("ExecStart=")
        .or_else(|| line.strip_prefix("ExecReload="))?;
    let rest = rest.trim_start_matches(['+', '-', '!', '@', ':']);
    rest.split_whitespace().next().map(str::to_string)
}

fn unit(config: &Config, dir: Option<&Path>, r: &mut Report) {
    let dirs: Vec<PathBuf> = match dir {
        Some(d) => vec![d.to_path_buf()],
        None => [
            "/etc/systemd/system",
            "/lib/systemd/system",
            "/usr/lib/systemd/system",
        ]
        .iter()
        .map(PathBuf::from)
        .collect(),
    };
    let Some(path) = dirs
        .iter()
        .map(|d| d.join("switchyard.service"))
        .find(|p| p.exists())
    else {
        r.ok("systemd unit", "none installed (serve runs by hand)");
        return;
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            r.warn(
                "systemd unit",
                format!("cannot read {}: {e}", path.display()),
                "run doctor as root",
            );
            return;
        }
    };
    let this = std::env::current_exe()
        .ok()
        .and_then(|p| p.canonicalize().ok());
    let runs = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("ExecStart=").map(|_| l.trim()))
        .and_then(exec_binary)
        .map(PathBuf::from);
    match (&runs, &this) {
        (Some(bin), Some(me)) if bin.canonicalize().ok().as_ref() == Some(me) => {}
        (Some(bin), _) => r.warn(
            "systemd unit",
            format!(
                "{} runs {}, not this binary ({})",
                path.display(),
                bin.display(),
                this.as_ref()
                    .map_or_else(|| "?".into(), |p| p.display().to_string())
            ),
            "install this binary where the unit expects it (install.sh, or the .deb), or run \
             the doctor of the installed binary",
        ),
        (None, _) => r.warn(
            "systemd unit",
            format!("{} has no ExecStart=", path.display()),
            "reinstall the unit",
        ),
    }
    if directives(&text) == directives(PACKAGED_UNIT) {
        r.ok(
            "systemd unit",
            format!("{} is this release's", path.display()),
        );
    } else {
        r.warn(
            "systemd unit",
            format!(
                "{} differs from the unit this release ships",
                path.display()
            ),
            "reinstall it (install.sh or the .deb; local changes belong in `systemctl edit \
             switchyard`), then `systemctl daemon-reload`",
        );
    }
    let socket = path.with_file_name("switchyard.socket");
    if let Ok(text) = std::fs::read_to_string(&socket)
        && let Some(addr) = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("ListenStream="))
        && addr != config.server.listen.to_string()
    {
        r.warn(
            "systemd unit",
            format!(
                "{} listens on {addr}, the config on {}",
                socket.display(),
                config.server.listen
            ),
            "make ListenStream= (`systemctl edit switchyard.socket`) and [server] listen the same",
        );
    }
}
