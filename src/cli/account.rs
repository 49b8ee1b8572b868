//! `switchyard account …`: import, login, export, list, enable, disable, remove, set.

use std::io::Read;
use std::path::{Path, PathBuf};

use switchyard_admin::wire;

use super::CommandError;
use super::args::{AccountCommand, Setting};
use super::backend::{Access, Backend};
use super::login::{login, stop_signals};
use super::table::{table, to_json};
use crate::base::clock;
use crate::config::Config;

/// Writes a file only its owner may read (created 0600; an existing file is truncated and
/// set to 0600 first).
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), CommandError> {
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

/// An auth.json holding only a workspace access token (`-`: read from stdin).
fn access_token_auth(token: &str) -> Result<Vec<u8>, CommandError> {
    let token = if token == "-" {
        super::read_secret(Path::new("-"), "--access-token")?
    } else {
        token.trim().to_string()
    };
    if token.is_empty() {
        return Err(CommandError::Usage(
            "--access-token: the token is empty".into(),
        ));
    }
    Ok(serde_json::json!({"tokens": {"access_token": token}})
        .to_string()
        .into_bytes())
}

/// Reads every file first and checks it, so a bad file among several imports nothing.
pub(super) fn read_auth_files(files: &[PathBuf]) -> Result<Vec<(String, Vec<u8>)>, CommandError> {
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
        match crate::fleet::auth_file::parse(&bytes, 0) {
            // Validated by the auth server at import.
            Ok(_) | Err(crate::fleet::auth_file::AuthFileError::AccessTokenOnly(_)) => {}
            Err(source) => {
                return Err(CommandError::AuthFile {
                    path: name.clone(),
                    source,
                });
            }
        }
        out.push((name, bytes));
    }
    Ok(out)
}

pub(super) async fn account(config: &Config, cmd: AccountCommand) -> Result<(), CommandError> {
    let files = match &cmd {
        AccountCommand::Import {
            files,
            access_token,
            ..
        } => {
            let mut all = read_auth_files(files)?;
            if let Some(token) = access_token {
                all.push(("the access token".into(), access_token_auth(token)?));
            }
            all
        }
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

/// Asks a yes/no question on the terminal; a missing terminal is a no.
fn confirm(question: &str) -> Result<bool, CommandError> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| CommandError::Usage(format!("cannot read the answer: {e}")))?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}

/// One line on a spend's outcome.
fn describe_spend(s: &wire::CreditSpend) -> String {
    let what = match s.outcome.as_str() {
        "reset" => format!(
            "reset {} usage window{}",
            s.windows_reset,
            if s.windows_reset == 1 { "" } else { "s" }
        ),
        "already_redeemed" => "reset (the backend had already carried out this spend)".into(),
        "nothing_to_reset" => "nothing to reset: no window was spent, no credit was used".into(),
        "no_credit" => "the backend says the account holds no credit".into(),
        "unsettled" => format!(
            "no answer yet ({}); it is asked again with the same redeem id, never spent twice",
            s.error.as_deref().unwrap_or("timeout")
        ),
        _ => format!("failed: {}", s.error.as_deref().unwrap_or("unknown")),
    };
    format!("{}: {what} (redeem id {})", s.account, s.redeem_id)
}

pub(super) async fn account_with(
    backend: &Backend,
    config: &Config,
    cmd: AccountCommand,
    files: Vec<(String, Vec<u8>)>,
) -> Result<(), CommandError> {
    match cmd {
        AccountCommand::Import { no_refresh, .. } => {
            for (_, bytes) in files {
                let imported = backend.import_account(config, &bytes).await?;
                if let Some(why) = &imported.unchanged {
                    println!(
                        "unchanged {}: {why}; nothing changed",
                        describe_account(&imported.account)
                    );
                    continue;
                }
                let verb = if imported.created {
                    "imported"
                } else {
                    "updated"
                };
                println!("{verb} {}", describe_account(&imported.account));
                if imported.account.login == wire::Login::AccessToken {
                    eprintln!(
                        "a workspace access token: used until it expires ({}), never refreshed",
                        imported
                            .account
                            .token_expires_at
                            .as_deref()
                            .unwrap_or("the backend says when")
                    );
                    continue;
                }
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
            let imported = backend
                .import_account(config, auth.to_string().as_bytes())
                .await?;
            if let Some(why) = &imported.unchanged {
                println!(
                    "unchanged {}: {why}; nothing changed",
                    describe_account(&imported.account)
                );
                return Ok(());
            }
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
            if keep && exported.account.enabled {
                eprintln!(
                    "exported {account}; still enabled here (--keep): the two copies will refresh \
                     over each other, and one of them will need a new login"
                );
            } else if keep {
                eprintln!(
                    "exported {account}; it stays disabled here (it was already): the login lives \
                     where you import the file"
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
        AccountCommand::ResetWindow { id, yes } => {
            let Backend::Daemon(client) = backend else {
                return Err(CommandError::Usage(
                    "account reset-window needs the running daemon: it spends the credit with \
                     the account's login and brings the account back at once"
                        .into(),
                ));
            };
            if !yes
                && !confirm(&format!(
                    "Spend one rate-limit reset credit on {id}? It cannot be undone."
                ))?
            {
                return Err(CommandError::Usage(
                    "not confirmed; nothing spent (--yes skips the question)".into(),
                ));
            }
            let spend = client.reset_window(&id).await?;
            println!("{}", describe_spend(&spend));
        }
        AccountCommand::Set(mut args) => {
            if let Some(file) = &args.proxy_file {
                let url = super::read_secret(file, "--proxy-file")?;
                args.proxy = Some(
                    super::args::proxy_setting(&url)
                        .map_err(|e| CommandError::Usage(format!("--proxy-file: {e}")))?,
                );
            } else if let Some(Setting::Set(url)) = &args.proxy
                && crate::upstream::egress::ProxyUrl::parse(url).is_ok_and(|p| p.has_password())
            {
                eprintln!(
                    "warning: the proxy's password was on the command line, where other local \
                     users can read it while the command runs; --proxy-file FILE (or - for \
                     stdin) keeps it off"
                );
            }
            let max_concurrency = match args.max_concurrency {
                None => None,
                Some(Setting::Clear) => Some(None),
                Some(Setting::Set(n)) => Some(Some(u32::try_from(n).map_err(|_| {
                    CommandError::Usage(format!("--max-concurrency {n} is too large"))
                })?)),
            };
            let patch = wire::AccountPatch {
                label: args.label,
                priority: args.priority,
                max_concurrency,
                proxy: args.proxy.map(|p| match p {
                    Setting::Set(url) => Some(url),
                    Setting::Clear => None,
                }),
            };
            if patch.is_empty() {
                return Err(CommandError::Usage(
                    "nothing to change: give --label, --priority, --max-concurrency or --proxy"
                        .into(),
                ));
            }
            let a = backend.set_account(&args.id, patch).await?;
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

pub(super) fn describe_account(a: &wire::Account) -> String {
    format!(
        "{} {} (plan {}, account {})",
        a.id,
        a.email.as_deref().unwrap_or(&a.label),
        a.plan.as_deref().unwrap_or("unknown"),
        a.chatgpt_account_id
    )
}

pub(super) fn account_table(accounts: &[wire::Account]) -> String {
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
                    None => a.state.to_string(),
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
        if let Some(n) = a
            .quota
            .as_ref()
            .and_then(|q| q.reset_credits)
            .filter(|n| *n > 0)
        {
            let s = if n == 1 { "" } else { "s" };
            let soonest = a
                .quota
                .as_ref()
                .and_then(|q| q.reset_credit_expires_at.as_deref())
                .map_or(String::new(), |at| format!(" (the soonest expires {at})"));
            out.push_str(&format!(
                "{}: {n} rate-limit reset credit{s} banked{soonest}\n",
                a.id
            ));
        }
        if let Some(origin) = &a.origin {
            out.push_str(&format!("{}: its workspace is served at {origin}\n", a.id));
        }
        if let Some(why) = &a.routing_error {
            out.push_str(&format!(
                "{}: workspace routing unknown ({why}); the configured origin is used\n",
                a.id
            ));
        }
        if a.login == wire::Login::AccessToken {
            let until = a
                .token_expires_at
                .as_deref()
                .unwrap_or("when the backend says");
            out.push_str(&format!(
                "{}: a workspace access token, never refreshed; it ends {until}\n",
                a.id
            ));
        }
    }
    out
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
            reason: reason.map(wire::Class::from_name),
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
            login: Default::default(),
            token_expires_at: None,
            origin: None,
            routing_error: None,
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
}
