//! `switchyard account login` against the simulator's auth server: the device-code flow
//! (approved, denied, expired, slowed down, interrupted), the browser flow with a pasted
//! redirect URL, and logging an existing account in again.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

use crate::common;
use crate::common::gw::{Gw, until};
use crate::common::{BIN, SIGNAL_DEADLINE, clean_env};
use axum::http::Method;
use serde_json::Value;
use switchyard::sim::DeviceCode;
use tokio::sync::watch;

/// A login command running in the background, its stderr collected as it comes.
struct Login {
    child: Child,
    stderr: watch::Receiver<Stderr>,
    reader: std::thread::JoinHandle<()>,
}

/// What the command wrote to stderr so far, and whether it has closed it (it ended).
#[derive(Default)]
struct Stderr {
    text: String,
    ended: bool,
}

impl Login {
    fn start(gw: &Gw, args: &[&str]) -> Login {
        Self::start_with(gw, args, false)
    }

    /// `auth_from_env`: the auth server comes from `SWITCHYARD_AUTH_BASE_URL`, not the config.
    fn start_with(gw: &Gw, args: &[&str], auth_from_env: bool) -> Login {
        let cfg = gw.dir.with_extension("login.toml");
        let auth_base = gw
            .sim
            .oauth_token_url()
            .trim_end_matches("/oauth/token")
            .to_string();
        let mut text = format!(
            "[upstream]\nbase_url = \"{}\"\nusage_url = \"{}\"\noauth_token_url = \"{}\"\n",
            gw.sim.base_url(),
            gw.sim.usage_url(),
            gw.sim.oauth_token_url(),
        );
        if !auth_from_env {
            text.push_str(&format!("auth_base_url = \"{auth_base}\"\n"));
        }
        std::fs::write(&cfg, text).unwrap();
        let mut cmd = Command::new(BIN);
        clean_env(&mut cmd);
        if auth_from_env {
            cmd.env("SWITCHYARD_AUTH_BASE_URL", &auth_base);
        }
        cmd.arg("--config")
            .arg(&cfg)
            .arg("--state-dir")
            .arg(&gw.dir)
            .args(["account", "login"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let (sink, stderr) = watch::channel(Stderr::default());
        let pipe = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                sink.send_modify(|s| {
                    s.text.push_str(&line);
                    s.text.push('\n');
                });
            }
            sink.send_modify(|s| s.ended = true);
        });
        Login {
            child,
            stderr,
            reader,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.borrow().text.clone()
    }

    /// Waits for the command to write what `seen` finds on stderr, and returns its stderr;
    /// fails as soon as the command ends without it.
    async fn wait_stderr(&self, what: &str, seen: impl Fn(&str) -> bool) -> String {
        let mut rx = self.stderr.clone();
        let _ = tokio::time::timeout(SIGNAL_DEADLINE, rx.wait_for(|s| s.ended || seen(&s.text)))
            .await
            .unwrap_or_else(|_| panic!("no {what} in {SIGNAL_DEADLINE:?}:\n{}", self.stderr()));
        let text = self.stderr();
        assert!(seen(&text), "the command ended before {what}:\n{text}");
        text
    }

    /// Waits for the command to end: (success, stdout, stderr).
    async fn finish(self) -> (bool, String, String) {
        let Login {
            mut child,
            stderr,
            reader,
        } = self;
        let stdout = child.stdout.take().unwrap();
        let (status, out) = tokio::task::spawn_blocking(move || {
            let mut out = String::new();
            std::io::Read::read_to_string(&mut BufReader::new(stdout), &mut out).unwrap();
            let status = child.wait().unwrap();
            // The stderr reader ends with the process.
            reader.join().unwrap();
            (status, out)
        })
        .await
        .unwrap();
        let err = stderr.borrow().text.clone();
        (status.success(), out, err)
    }
}

/// The `n`th device code the simulator issued, once the command has asked for it; fails as
/// soon as the command ends without asking.
async fn issued(gw: &Gw, login: &Login, n: usize) -> DeviceCode {
    let mut ended = login.stderr.clone();
    let asked = async {
        tokio::select! {
            biased;
            codes = gw.sim.sim.wait_device_codes(n) => codes,
            _ = ended.wait_for(|s| s.ended) => panic!(
                "the command ended before it asked for a device code:\n{}",
                login.stderr()
            ),
        }
    };
    tokio::time::timeout(SIGNAL_DEADLINE, asked)
        .await
        .expect("the command asks for a device code")
        .remove(n - 1)
}

/// The authorize URL the command printed.
async fn authorize_url(login: &Login) -> String {
    login
        .wait_stderr("the authorize URL", |e| e.contains("/oauth/authorize?"))
        .await
        .split_whitespace()
        .find(|w| w.contains("/oauth/authorize?"))
        .unwrap()
        .to_string()
}

/// The browser: opens a URL without following its redirect.
async fn browse(url: &str) -> reqwest::Response {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(url)
        .send()
        .await
        .unwrap()
}

/// When the command polled for its device code's token (sim clock, ms).
fn poll_times(gw: &Gw) -> Vec<u64> {
    gw.sim
        .sim
        .all_requests()
        .iter()
        .filter(|r| r.path == "/api/accounts/deviceauth/token")
        .map(|r| r.at_ms)
        .collect()
}

/// A gateway over two simulated accounts, the second not (or no longer) in it, and device
/// codes polled every second: (gateway, the second account's id in the simulator).
async fn one_account_logged_out() -> (Gw, String) {
    let gw = Gw::start(2).await;
    gw.sim.sim.set_device_interval(1);
    let second = gw.rr_order()[1].clone();
    remove_account(&gw, &second).await;
    (gw, second)
}

async fn remove_account(gw: &Gw, sim_account: &str) {
    let id = gw.ids[sim_account].clone();
    gw.admin_call(Method::DELETE, &format!("/api/admin/accounts/{id}"), None)
        .await;
}

/// A browser login listens on 127.0.0.1:1455 (the redirect the auth server knows), so the
/// tests that run one take turns with the port: each holds a lock on one file, which works
/// whether the tests share a process or each runs in its own. The turn ends when the returned
/// file is dropped.
async fn callback_port() -> std::fs::File {
    tokio::task::spawn_blocking(|| {
        let path = std::env::temp_dir().join("switchyard-tests-callback-1455.lock");
        let file =
            std::fs::File::create(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        file.lock()
            .unwrap_or_else(|e| panic!("lock {}: {e}", path.display()));
        file
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_code_login_adds_the_account_through_the_daemon() {
    let (gw, second) = one_account_logged_out().await;
    assert_eq!(gw.accounts().await.len(), 1);
    let login = Login::start(&gw, &[]);
    let code = issued(&gw, &login, 1).await;
    // The operator is shown where to go and the code to enter.
    login
        .wait_stderr("the code shown", |e| e.contains(&code.user_code))
        .await;
    assert!(
        login.stderr().contains("/codex/device"),
        "{}",
        login.stderr()
    );
    gw.sim
        .sim
        .approve_device_code(&code.user_code, &second)
        .unwrap();
    let (ok, out, err) = login.finish().await;
    assert!(ok, "{err}");
    assert!(out.starts_with("logged in: "), "{out}");
    assert!(out.contains(&second), "{out}");
    // The daemon has it at once, proves it, and serves with it.
    gw.until_proven(&second).await;
    let served = gw.served(&second);
    for i in 0..4 {
        let sse = gw
            .stream(
                &common::gw::body_plain("gpt-5.5", &format!("q{i}"), true),
                &[],
            )
            .await;
        assert_eq!(sse.last().0, "response.completed");
    }
    assert!(gw.served(&second) > served);
    // It polled no faster than the interval it was given.
    let polls = poll_times(&gw);
    assert!(!polls.is_empty());
    for w in polls.windows(2) {
        assert!(w[1] - w[0] >= 1000, "{polls:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_or_expired_device_code_stores_nothing() {
    let (gw, _) = one_account_logged_out().await;

    let login = Login::start(&gw, &[]);
    let code = issued(&gw, &login, 1).await;
    gw.sim.sim.deny_device_code(&code.user_code).unwrap();
    let (ok, _, err) = login.finish().await;
    assert!(!ok);
    assert!(err.contains("login failed: the login was denied"), "{err}");

    let login = Login::start(&gw, &[]);
    let code = issued(&gw, &login, 2).await;
    gw.sim.sim.expire_device_code(&code.user_code).unwrap();
    let (ok, _, err) = login.finish().await;
    assert!(!ok);
    assert!(err.contains("expired"), "{err}");
    assert_eq!(gw.accounts().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_down_makes_the_command_poll_five_seconds_slower() {
    let (gw, second) = one_account_logged_out().await;
    let login = Login::start(&gw, &[]);
    let code = issued(&gw, &login, 1).await;
    gw.sim.sim.slow_down_device_code(&code.user_code).unwrap();
    // Approve once the slowed poll has been answered.
    until("the slow_down answer", || async {
        gw.sim
            .sim
            .device_codes()
            .first()
            .is_some_and(|c| c.polls >= 1)
    })
    .await;
    gw.sim
        .sim
        .approve_device_code(&code.user_code, &second)
        .unwrap();
    let (ok, _, err) = login.finish().await;
    assert!(ok, "{err}");
    let polls = poll_times(&gw);
    // After the slow_down answer the next poll waited 1 + 5 seconds.
    assert!(polls.len() >= 2, "{polls:?}");
    assert!(polls[1] - polls[0] >= 6000, "{polls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_login_stores_nothing() {
    let (gw, second) = one_account_logged_out().await;
    let login = Login::start(&gw, &[]);
    let code = issued(&gw, &login, 1).await;
    let pid = login.child.id();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let (ok, _, err) = login.finish().await;
    assert!(!ok);
    assert!(
        err.contains("the login was interrupted; nothing was stored"),
        "{err}"
    );
    // Approved after the command is gone: nobody exchanges it, nothing is stored.
    gw.sim
        .sim
        .approve_device_code(&code.user_code, &second)
        .unwrap();
    assert_eq!(gw.accounts().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_login_completes_with_the_pasted_redirect_url() {
    let _port = callback_port().await;
    let gw = Gw::start(2).await;
    let second = gw.rr_order()[1].clone();
    remove_account(&gw, &second).await;
    gw.sim
        .sim
        .set_authorize_answer(switchyard::sim::AuthorizeAnswer::Approve {
            account_id: second.clone(),
        })
        .unwrap();
    let mut login = Login::start(&gw, &["--browser"]);
    let url = authorize_url(&login).await;
    assert!(url.contains("code_challenge_method=S256"), "{url}");
    // The browser: the auth server redirects to the local callback address.
    let resp = browse(&url).await;
    assert_eq!(resp.status().as_u16(), 302);
    let location = resp.headers()["location"].to_str().unwrap().to_string();
    assert!(
        location.starts_with("http://localhost:1455/auth/callback?"),
        "{location}"
    );
    // Over SSH the operator pastes it.
    let mut stdin = login.child.stdin.take().unwrap();
    writeln!(stdin, "{location}").unwrap();
    drop(stdin);
    let (ok, out, err) = login.finish().await;
    assert!(ok, "{err}");
    assert!(out.contains(&second), "{out}");
    gw.until_proven(&second).await;

    // A denial comes back the same way, and stores nothing.
    remove_account(&gw, &second).await;
    gw.sim
        .sim
        .set_authorize_answer(switchyard::sim::AuthorizeAnswer::deny())
        .unwrap();
    let mut login = Login::start(&gw, &["--browser"]);
    let url = authorize_url(&login).await;
    let resp = browse(&url).await;
    let location = resp.headers()["location"].to_str().unwrap().to_string();
    let mut stdin = login.child.stdin.take().unwrap();
    writeln!(stdin, "{location}").unwrap();
    drop(stdin);
    let (ok, _, err) = login.finish().await;
    assert!(!ok);
    assert!(err.contains("denied"), "{err}");
    assert_eq!(gw.accounts().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logging_an_account_in_again_keeps_its_id_and_history_and_ends_needs_reauth() {
    let gw = Gw::start(1).await;
    gw.sim.sim.set_device_interval(1);
    let acct = gw.ids.keys().next().unwrap().clone();
    let id = gw.ids[&acct].clone();
    // History: a request served by it.
    assert_eq!(
        gw.json(&common::gw::body("gpt-5.5", "before", false))
            .await
            .0,
        200
    );
    // Its login dies (revoked elsewhere).
    assert!(gw.sim.sim.revoke_tokens(&acct));
    let _ = gw
        .admin()
        .await
        .call::<Value>(
            Method::POST,
            &format!("/api/admin/accounts/{id}/refresh"),
            None,
        )
        .await;
    assert_eq!(gw.account(&acct).await["state"], "needs_reauth");

    let login = Login::start(&gw, &["--account", &id]);
    let code = issued(&gw, &login, 1).await;
    gw.sim
        .sim
        .approve_device_code(&code.user_code, &acct)
        .unwrap();
    let (ok, out, err) = login.finish().await;
    assert!(ok, "{err}");
    assert!(out.starts_with("logged in again: "), "{out}");
    // Logged in again, it is proved before it takes requests.
    gw.until_proven(&acct).await;
    assert_eq!(gw.account(&acct).await["id"], id.as_str());
    assert_eq!(gw.accounts().await.len(), 1);
    let records = gw.requests(10).await;
    assert!(records.iter().any(|r| r["account"] == acct.as_str()));
    assert_eq!(
        gw.json(&common::gw::body("gpt-5.5", "after", false))
            .await
            .0,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logging_in_again_as_another_chatgpt_account_is_refused() {
    let gw = Gw::start(2).await;
    gw.sim.sim.set_device_interval(1);
    let order = gw.rr_order();
    let id = gw.ids[&order[0]].clone();
    let login = Login::start(&gw, &["--account", &id]);
    let code = issued(&gw, &login, 1).await;
    gw.sim
        .sim
        .approve_device_code(&code.user_code, &order[1])
        .unwrap();
    let (ok, _, err) = login.finish().await;
    assert!(!ok);
    assert!(
        err.contains(&format!("this login is ChatGPT account {} (", order[1]))
            && err.contains(&format!("), not {id} ({})", order[0]))
            && err.contains("nothing was stored"),
        "{err}"
    );
    assert_eq!(gw.accounts().await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_login_on_this_machine_completes_by_its_local_callback() {
    let _port = callback_port().await;
    let gw = Gw::start(2).await;
    let second = gw.rr_order()[1].clone();
    remove_account(&gw, &second).await;
    gw.sim
        .sim
        .set_authorize_answer(switchyard::sim::AuthorizeAnswer::Approve {
            account_id: second.clone(),
        })
        .unwrap();
    // The auth server's address comes from the environment this time.
    let login = Login::start_with(&gw, &["--browser"], true);
    let url = authorize_url(&login).await;
    assert!(url.starts_with(gw.sim.oauth_token_url().trim_end_matches("/oauth/token")));
    let resp = browse(&url).await;
    let location = resp.headers()["location"].to_str().unwrap().to_string();
    assert!(
        location.starts_with("http://localhost:1455/auth/callback?"),
        "{location}"
    );
    // The browser follows the redirect to the command's own callback on 127.0.0.1:1455.
    let callback = location.replace("http://localhost:1455", "http://127.0.0.1:1455");
    let page = reqwest::get(&callback).await.unwrap();
    assert!(page.status().is_success(), "{}", page.status());
    let (ok, out, err) = login.finish().await;
    assert!(ok, "{err}");
    assert!(out.contains(&second), "{out}");
    gw.until_proven(&second).await;
}
