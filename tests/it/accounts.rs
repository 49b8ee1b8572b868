//! Accounts in and out the way operators need: `account set` (label, priority, own cap),
//! directly and through a running daemon.

use crate::common;
use crate::common::*;
use serde_json::Value;

fn listed(state: &std::path::Path, id: &str) -> Value {
    let out = cli(state, &["account", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str::<Value>(&stdout(&out))
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["chatgpt_account_id"] == id)
        .unwrap()
        .clone()
}

#[test]
fn account_set_changes_label_priority_and_cap_directly_and_through_the_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let files: Vec<_> = (1..=2).map(|n| write_auth(tmp.path(), n, "t")).collect();
    let import = cli(
        &state,
        &[
            "account",
            "import",
            "--no-refresh",
            files[0].to_str().unwrap(),
            files[1].to_str().unwrap(),
        ],
    );
    assert!(import.status.success(), "{}", stderr(&import));

    let out = cli(
        &state,
        &[
            "account",
            "set",
            "acc-0001",
            "--label",
            "stable",
            "--priority",
            "-5",
            "--max-concurrency",
            "2",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("priority -5 · max concurrency 2"),
        "{}",
        stdout(&out)
    );
    let a = listed(&state, "acc-0001");
    assert_eq!(
        (a["label"].as_str(), a["priority"].as_i64()),
        (Some("stable"), Some(-5))
    );
    assert_eq!(a["max_concurrency"], 2);
    let table = stdout(&cli(&state, &["account", "list"]));
    assert!(table.contains("stable") && table.contains("-5"), "{table}");

    // Through the daemon, by email; `none` gives the pool's cap back.
    let daemon = Daemon::start(&state);
    let out = cli(
        &state,
        &["account", "set", "user2@example.com", "--priority", "3"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = cli(
        &state,
        &["account", "set", "stable", "--max-concurrency", "none"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let accounts = daemon.admin("GET", "/api/admin/accounts", None).json();
    let by = |id: &str| {
        accounts
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["chatgpt_account_id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(by("acc-0002")["priority"], 3);
    assert_eq!(by("acc-0001")["max_concurrency"], Value::Null);
    assert_eq!(by("acc-0001")["label"], "stable");

    assert_one_line_error(
        &cli(&state, &["account", "set", "acc-0001"]),
        &["nothing to change"],
    );
    assert_one_line_error(
        &cli(&state, &["account", "set", "acc-0001", "--label", " "]),
        &["label"],
    );
    assert_one_line_error(
        &cli(&state, &["account", "set", "nobody", "--priority", "1"]),
        &["nobody"],
    );
    assert!(daemon.terminate().success());
    // Kept across the restart.
    assert_eq!(listed(&state, "acc-0002")["priority"], 3);
}

mod ownership {
    use super::*;
    use crate::common::gw::{Gw, body};
    use serde_json::json;

    /// A config for the CLI pointing at the gateway's simulator.
    fn config_for(gw: &Gw, dir: &std::path::Path) -> std::path::PathBuf {
        let cfg = dir.join("switchyard.toml");
        std::fs::write(
            &cfg,
            format!(
                "[upstream]\nbase_url = \"{}\"\nusage_url = \"{}\"\noauth_token_url = \"{}\"\n",
                gw.sim.base_url(),
                gw.sim.usage_url(),
                gw.sim.oauth_token_url()
            ),
        )
        .unwrap();
        cfg
    }

    /// `--config CFG --state-dir STATE REST…` (the config only when given).
    fn args(cfg: Option<&std::path::Path>, state: &std::path::Path, rest: &[&str]) -> Vec<String> {
        let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
        let mut v = Vec::new();
        if let Some(c) = cfg {
            v.extend(["--config".to_string(), path(c)]);
        }
        v.extend(["--state-dir".to_string(), path(state)]);
        v.extend(rest.iter().map(|r| r.to_string()));
        v
    }

    async fn run(args: Vec<String>) -> std::process::Output {
        tokio::task::spawn_blocking(move || {
            let mut cmd = std::process::Command::new(BIN);
            clean_env(&mut cmd);
            cmd.args(&args).output().unwrap()
        })
        .await
        .unwrap()
    }

    /// What the Codex CLI the login came from would do: refresh with the refresh token it has.
    async fn source_refreshes(gw: &Gw, refresh_token: &str) -> (u16, Value) {
        let resp = reqwest::Client::new()
            .post(gw.sim.oauth_token_url())
            .json(&json!({
                "client_id": "app_EMoamEEZ73f0CkXaXp7hrann",
                "grant_type": "refresh_token",
                "refresh_token": refresh_token,
            }))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }

    /// A workspace access token, imported with `--access-token`: the auth server names its
    /// account, nothing is refreshed, and the list says it is one and when it ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_workspace_access_token_is_imported_validated_and_never_refreshed() {
        let gw = Gw::start(1).await;
        let tmp = tempfile::tempdir().unwrap();
        let cfg = tmp.path().join("switchyard.toml");
        std::fs::write(
            &cfg,
            format!(
                "[upstream]\nbase_url = \"{}\"\nusage_url = \"{}\"\noauth_token_url = \"{}\"\nauth_base_url = \"{}\"\n",
                gw.sim.base_url(),
                gw.sim.usage_url(),
                gw.sim.oauth_token_url(),
                gw.sim.url()
            ),
        )
        .unwrap();
        let acct = gw.ids.keys().next().unwrap().clone();
        let token = gw
            .sim
            .sim
            .workspace_token(&acct, std::time::Duration::from_secs(3600))
            .unwrap();
        let state = tmp.path().join("ws-state");
        let refreshes = gw.sim.sim.refresh_count(&acct);
        let out = run(args(
            Some(&cfg),
            &state,
            &["account", "import", "--access-token", &token],
        ))
        .await;
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stdout(&out).starts_with("imported "), "{}", stdout(&out));
        assert!(stdout(&out).contains(&acct), "{}", stdout(&out));
        assert!(stderr(&out).contains("never refreshed"), "{}", stderr(&out));
        assert_eq!(
            gw.sim.sim.refresh_count(&acct),
            refreshes,
            "nothing was refreshed"
        );
        let list = run(args(Some(&cfg), &state, &["account", "list", "--json"])).await;
        let v: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
        assert_eq!(v[0]["login"], "access_token", "{v}");
        assert_eq!(v[0]["chatgpt_account_id"], acct.as_str());
        let table = run(args(Some(&cfg), &state, &["account", "list"])).await;
        assert!(
            stdout(&table).contains("a workspace access token, never refreshed"),
            "{}",
            stdout(&table)
        );
        // A token the auth server does not know is refused, and nothing is stored.
        let bad = run(args(
            Some(&cfg),
            &tmp.path().join("bad-state"),
            &["account", "import", "--access-token", "at-nobody"],
        ))
        .await;
        assert!(!bad.status.success());
        assert!(
            stderr(&bad).contains("refused the access token"),
            "{}",
            stderr(&bad)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn import_takes_the_login_and_the_source_finds_its_refresh_token_used() {
        let gw = Gw::start(1).await;
        let tmp = tempfile::tempdir().unwrap();
        let cfg = config_for(&gw, tmp.path());
        let acct = gw.ids.keys().next().unwrap().clone();
        let auth = gw.sim.sim.auth_json(&acct).unwrap();
        let file = tmp.path().join("auth.json");
        std::fs::write(&file, auth.to_string()).unwrap();
        let state = tmp.path().join("elsewhere");
        let out = run(args(
            Some(&cfg),
            &state,
            &["account", "import", file.to_str().unwrap()],
        ))
        .await;
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stdout(&out).starts_with("imported "), "{}", stdout(&out));
        assert!(
            stderr(&out).contains("the login now belongs to Switchyard")
                && stderr(&out).contains("must log in again"),
            "{}",
            stderr(&out)
        );
        // The source's refresh token was spent by the import.
        let old = auth["tokens"]["refresh_token"].as_str().unwrap();
        let (status, v) = source_refreshes(&gw, old).await;
        assert_eq!(status, 401, "{v}");
        assert_eq!(v["error"]["code"], "refresh_token_reused");

        // With --no-refresh nothing is refreshed, and it says what that means.
        let fresh = gw.sim.sim.auth_json(&acct).unwrap();
        std::fs::write(&file, fresh.to_string()).unwrap();
        let before = gw
            .sim
            .sim
            .all_requests()
            .iter()
            .filter(|r| r.path == "/oauth/token")
            .count();
        let out = run(args(
            Some(&cfg),
            &tmp.path().join("third"),
            &["account", "import", "--no-refresh", file.to_str().unwrap()],
        ))
        .await;
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stderr(&out).contains("not refreshed"), "{}", stderr(&out));
        let after = gw
            .sim
            .sim
            .all_requests()
            .iter()
            .filter(|r| r.path == "/oauth/token")
            .count();
        assert_eq!(after, before);
    }

    /// A provisioning script run again: the same auth.json imported a second time (its refresh
    /// token spent by the first import's ownership refresh), with the daemon stopped and then
    /// running, changes nothing and says so; the account keeps its working login and serves.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn importing_the_same_file_again_keeps_the_newer_login_and_says_so() {
        let gw = Gw::start(1).await;
        let tmp = tempfile::tempdir().unwrap();
        let cfg = config_for(&gw, tmp.path());
        let acct = gw.ids.keys().next().unwrap().clone();
        let file = tmp.path().join("auth.json");
        std::fs::write(&file, gw.sim.sim.auth_json(&acct).unwrap().to_string()).unwrap();
        let state = tmp.path().join("provisioned");
        let import = args(
            Some(&cfg),
            &state,
            &["account", "import", file.to_str().unwrap()],
        );
        let first = run(import.clone()).await;
        assert!(first.status.success(), "{}", stderr(&first));
        assert!(
            stdout(&first).starts_with("imported "),
            "{}",
            stdout(&first)
        );
        let refreshes = || {
            gw.sim
                .sim
                .all_requests()
                .iter()
                .filter(|r| r.path == "/oauth/token")
                .count()
        };
        let after_first = refreshes();
        // Again, the daemon stopped: nothing changes, and it says why.
        let again = run(import.clone()).await;
        assert!(again.status.success(), "{}", stderr(&again));
        let said = stdout(&again);
        assert!(
            said.starts_with("unchanged ")
                && said.contains("already imported; this file's tokens were replaced on")
                && said.contains("nothing changed"),
            "{said}"
        );
        assert_eq!(
            refreshes(),
            after_first,
            "no refresh for an unchanged login"
        );
        let listed: Value = serde_json::from_slice(
            &run(args(Some(&cfg), &state, &["account", "list", "--json"]))
                .await
                .stdout,
        )
        .unwrap();
        assert_ne!(listed[0]["state"], "needs_reauth", "{listed}");
        // Again, through the running daemon: the same.
        let daemon = crate::common::Daemon::start_with(
            &state,
            crate::common::DaemonOptions {
                config: Some(&cfg),
                ..Default::default()
            },
        );
        let third = run(import).await;
        assert!(third.status.success(), "{}", stderr(&third));
        assert!(
            stdout(&third).contains("already imported; this file's tokens were replaced on"),
            "{}",
            stdout(&third)
        );
        // The login it kept works: a request is served by it.
        let created = run(args(Some(&cfg), &state, &["key", "create", "ci"])).await;
        assert!(created.status.success(), "{}", stderr(&created));
        let resp = reqwest::Client::new()
            .post(format!("http://{}/v1/responses", daemon.http))
            .bearer_auth(stdout(&created).trim())
            .json(&body("gpt-5.5", "hello", false))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
        assert!(daemon.terminate().success());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_login_refreshed_first_by_its_source_shows_why_it_needs_a_new_login() {
        let gw = Gw::start(1).await;
        let acct = gw.ids.keys().next().unwrap().clone();
        let id = gw.ids[&acct].clone();
        // The gateway's copy came from a Codex CLI that refreshes before the gateway does.
        let secrets = gw.sim.sim.auth_json(&acct).unwrap();
        let imported = gw
            .admin()
            .await
            .call::<Value>(
                axum::http::Method::POST,
                "/api/admin/accounts",
                Some(secrets.to_string().into_bytes()),
            )
            .await
            .unwrap();
        assert_eq!(imported["id"], id.as_str());
        let rt = secrets["tokens"]["refresh_token"].as_str().unwrap();
        assert_eq!(source_refreshes(&gw, rt).await.0, 200);
        let refreshed = gw
            .admin()
            .await
            .call::<Value>(
                axum::http::Method::POST,
                &format!("/api/admin/accounts/{id}/refresh"),
                None,
            )
            .await;
        assert!(refreshed.is_err());
        let a = gw.account(&acct).await;
        assert_eq!(a["state"], "needs_reauth", "{a}");
        assert_eq!(a["reason"], "auth_dead");
        let detail = a["detail"].as_str().unwrap();
        assert!(
            detail.contains("refresh token had already been used"),
            "{detail}"
        );
        assert!(
            detail.ends_with(&format!("run `switchyard account login --account {id}`")),
            "{detail}"
        );
        // `account list` says it below its table too.
        let out = run(args(None, &gw.dir, &["account", "list"])).await;
        assert!(
            stdout(&out).contains(&format!(
                "{id}: this login's refresh token had already been used"
            )),
            "{}",
            stdout(&out)
        );
        // No request is sent to it any more.
        let served = gw.served(&acct);
        let (status, _) = gw.json(&body("gpt-5.5", "hi", false)).await;
        assert_eq!(status, 503);
        assert_eq!(gw.served(&acct), served);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_that_meets_a_login_used_elsewhere_says_why_in_its_record() {
        let gw = Gw::start(1).await;
        let acct = gw.ids.keys().next().unwrap().clone();
        let id = gw.ids[&acct].clone();
        let secrets = gw.sim.sim.auth_json(&acct).unwrap();
        gw.admin_call(
            axum::http::Method::POST,
            "/api/admin/accounts",
            Some(secrets.clone()),
        )
        .await;
        gw.until_proven(&acct).await;
        // The gateway's access token expires, and the source refreshes first.
        assert!(gw.sim.sim.expire_access_token(&acct));
        let rt = secrets["tokens"]["refresh_token"].as_str().unwrap();
        assert_eq!(source_refreshes(&gw, rt).await.0, 200);
        let (status, answer) = gw.json(&body("gpt-5.5", "hi", false)).await;
        assert_eq!(status, 503, "{answer}");
        let rec = &gw.requests(1).await[0];
        let error = rec["attempts"][1]["error"].as_str().unwrap_or("");
        assert_eq!(rec["attempts"][1]["class"], "auth_dead", "{rec}");
        assert!(
            error.contains("refresh_token_reused")
                && error.contains("had already been used")
                && error.contains(&format!("switchyard account login --account {id}")),
            "{rec}"
        );
        assert_eq!(gw.account(&acct).await["state"], "needs_reauth");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn export_writes_a_codex_auth_file_disables_the_account_and_serves_elsewhere() {
        let gw = Gw::start(2).await;
        let acct = gw.rr_order()[0].clone();
        // --keep: to stdout, and the account keeps serving here.
        let kept = run(args(None, &gw.dir, &["account", "export", &acct, "--keep"])).await;
        assert!(kept.status.success(), "{}", stderr(&kept));
        let auth: Value = serde_json::from_str(&stdout(&kept)).unwrap();
        assert_eq!(auth["tokens"]["account_id"], acct.as_str());
        assert!(
            stderr(&kept).contains("still enabled here"),
            "{}",
            stderr(&kept)
        );
        assert_eq!(gw.account(&acct).await["enabled"], true);
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("exported.json");
        let out = run(args(
            None,
            &gw.dir,
            &["account", "export", &acct, "--out", file.to_str().unwrap()],
        ))
        .await;
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("disabled it here"),
            "{}",
            stderr(&out)
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let auth: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(auth["auth_mode"], "chatgpt");
        assert_eq!(auth["OPENAI_API_KEY"], Value::Null);
        assert_eq!(auth["tokens"]["account_id"], acct.as_str());
        for t in ["id_token", "access_token", "refresh_token"] {
            assert!(!auth["tokens"][t].as_str().unwrap().is_empty(), "{t}");
        }
        assert!(auth["last_refresh"].as_str().unwrap().ends_with('Z'));
        assert_eq!(gw.account(&acct).await["state"], "disabled");
        // --keep of the exported, disabled account does not say it is enabled.
        let again = run(args(None, &gw.dir, &["account", "export", &acct, "--keep"])).await;
        assert!(again.status.success(), "{}", stderr(&again));
        assert!(
            stderr(&again).contains("stays disabled here")
                && !stderr(&again).contains("still enabled"),
            "{}",
            stderr(&again)
        );
        // The gateway keeps serving with the other account only.
        let other = gw.rr_order()[1].clone();
        let served = gw.served(&other);
        assert_eq!(gw.json(&body("gpt-5.5", "hi", false)).await.0, 200);
        assert_eq!(gw.served(&other), served + 1);

        // Imported elsewhere (it takes the login there) and served by a daemon.
        let cfg = config_for(&gw, tmp.path());
        let state = tmp.path().join("elsewhere");
        let import = run(args(
            Some(&cfg),
            &state,
            &["account", "import", file.to_str().unwrap()],
        ))
        .await;
        assert!(import.status.success(), "{}", stderr(&import));
        let key = run(args(None, &state, &["key", "create", "moved"])).await;
        let key = stdout(&key).trim().to_string();
        let (state2, cfg2) = (state.clone(), cfg.clone());
        let daemon = tokio::task::spawn_blocking(move || {
            Daemon::start_with(
                &state2,
                DaemonOptions {
                    config: Some(&cfg2),
                    ..Default::default()
                },
            )
        })
        .await
        .unwrap();
        // A login new to this daemon is proved (its usage, one minimal request) before it
        // takes requests.
        let start = std::time::Instant::now();
        loop {
            let listed = daemon.admin("GET", "/api/admin/accounts", None).json();
            if listed[0]["state"] == "ready" {
                break;
            }
            assert_eq!(listed[0]["state"], "probing", "{listed}");
            assert!(start.elapsed() < SIGNAL_DEADLINE, "never proved");
            tokio::task::yield_now().await;
        }
        let probes = gw.sim.sim.requests(&acct);
        assert_eq!(
            probes.last().unwrap().body["input"][0]["content"][0]["text"],
            "ping"
        );
        let served = gw.served(&acct);
        let resp = reqwest::Client::new()
            .post(format!("http://{}/v1/responses", daemon.http))
            .header("authorization", format!("Bearer {key}"))
            .json(&body("gpt-5.5", "from its new home", false))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert_eq!(gw.served(&acct), served + 1);
        tokio::task::spawn_blocking(move || assert!(daemon.terminate().success()))
            .await
            .unwrap();
    }

    /// Proxy variables meant for something else do not catch the gateway's traffic unless
    /// `use_env_proxy` says so.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn proxy_environment_variables_are_ignored_unless_asked_for() {
        let gw = Gw::start(1).await;
        let acct = gw.ids.keys().next().unwrap().clone();
        let tmp = tempfile::tempdir().unwrap();
        let cfg = config_for(&gw, tmp.path());
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let file = tmp.path().join("auth.json");
        std::fs::write(&file, gw.sim.sim.auth_json(&acct).unwrap().to_string()).unwrap();
        let answer = |cfg: std::path::PathBuf, state: std::path::PathBuf| {
            let dead = dead.clone();
            let file = file.clone();
            async move {
                let import = ["account", "import", "--no-refresh", file.to_str().unwrap()];
                assert!(
                    run(args(Some(&cfg), &state, &import))
                        .await
                        .status
                        .success()
                );
                let key = run(args(Some(&cfg), &state, &["key", "create", "k"])).await;
                let key = stdout(&key).trim().to_string();
                let daemon = tokio::task::spawn_blocking(move || {
                    let env = [
                        "HTTP_PROXY",
                        "HTTPS_PROXY",
                        "ALL_PROXY",
                        "http_proxy",
                        "https_proxy",
                    ]
                    .into_iter()
                    .map(|v| (v, dead.clone()))
                    .collect();
                    Daemon::start_with(
                        &state,
                        DaemonOptions {
                            config: Some(&cfg),
                            env,
                            ..Default::default()
                        },
                    )
                })
                .await
                .unwrap();
                let status = reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .unwrap()
                    .post(format!("http://{}/v1/responses", daemon.http))
                    .header("authorization", format!("Bearer {key}"))
                    .json(&body("gpt-5.5", "hi", false))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16();
                tokio::task::spawn_blocking(move || drop(daemon))
                    .await
                    .unwrap();
                status
            }
        };
        assert_eq!(answer(cfg.clone(), tmp.path().join("ignored")).await, 200);
        // Asked for, the dead proxy is used (and the request fails over to nothing).
        let honoured = tmp.path().join("honoured.toml");
        let text = std::fs::read_to_string(&cfg).unwrap();
        std::fs::write(&honoured, format!("{text}use_env_proxy = true\n")).unwrap();
        assert_ne!(answer(honoured, tmp.path().join("honoured")).await, 200);
    }

    /// With `use_env_proxy`, the environment's proxy carries HTTP and WebSocket traffic
    /// alike, as a tunnel; `NO_PROXY` lets a host go straight.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_environments_proxy_carries_http_and_websocket_traffic_when_asked_for() {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
        let gw = Gw::start(1).await;
        let acct = gw.ids.keys().next().unwrap().clone();
        let proxy = common::proxies::Proxy::connect(None).await;
        for no_proxy in ["", "127.0.0.1"] {
            let tmp = tempfile::tempdir().unwrap();
            let cfg = config_for(&gw, tmp.path());
            let text = std::fs::read_to_string(&cfg).unwrap();
            std::fs::write(&cfg, format!("{text}use_env_proxy = true\n")).unwrap();
            let file = tmp.path().join("auth.json");
            std::fs::write(&file, gw.sim.sim.auth_json(&acct).unwrap().to_string()).unwrap();
            let state = tmp.path().join("state");
            let import = ["account", "import", "--no-refresh", file.to_str().unwrap()];
            assert!(
                run(args(Some(&cfg), &state, &import))
                    .await
                    .status
                    .success()
            );
            let key = run(args(Some(&cfg), &state, &["key", "create", "k"])).await;
            let key = stdout(&key).trim().to_string();
            let before = gw.sim.sim.all_requests().len();
            let env = vec![
                ("HTTP_PROXY", proxy.url("http")),
                ("NO_PROXY", no_proxy.to_string()),
            ];
            let (state2, cfg2) = (state.clone(), cfg.clone());
            let daemon = tokio::task::spawn_blocking(move || {
                Daemon::start_with(
                    &state2,
                    DaemonOptions {
                        config: Some(&cfg2),
                        env,
                        ..Default::default()
                    },
                )
            })
            .await
            .unwrap();
            let status = reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap()
                .post(format!("http://{}/v1/responses", daemon.http))
                .header("authorization", format!("Bearer {key}"))
                .json(&body("gpt-5.5", "over http", false))
                .send()
                .await
                .unwrap()
                .status();
            assert_eq!(status.as_u16(), 200);
            let mut req = format!("ws://{}/v1/responses", daemon.http)
                .into_client_request()
                .unwrap();
            req.headers_mut()
                .insert("authorization", format!("Bearer {key}").parse().unwrap());
            let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
            let frame = json!({"type": "response.create", "model": "gpt-5.5", "store": false,
                "input": [{"type": "message", "role": "user",
                           "content": [{"type": "input_text", "text": "over ws"}]}]});
            ws.send(Message::Text(frame.to_string().into()))
                .await
                .unwrap();
            let mut last = Value::Null;
            while let Some(Ok(m)) = ws.next().await {
                if let Message::Text(t) = m {
                    last = serde_json::from_str(t.as_str()).unwrap();
                    if last["type"] == "response.completed" || last["type"] == "error" {
                        break;
                    }
                }
            }
            assert_eq!(last["type"], "response.completed", "{last}");
            let seen: Vec<_> = gw.sim.sim.all_requests()[before..]
                .iter()
                .filter(|r| r.account_id.as_deref() == Some(acct.as_str()))
                .cloned()
                .collect();
            assert!(seen.iter().any(|r| r.method == "WS"), "a WebSocket turn");
            let carried = seen.iter().filter(|r| proxy.carried(&r.peer)).count();
            if no_proxy.is_empty() {
                assert_eq!(carried, seen.len(), "everything through the proxy");
            } else {
                assert_eq!(carried, 0, "NO_PROXY lets the backend's host go straight");
            }
            tokio::task::spawn_blocking(move || assert!(daemon.terminate().success()))
                .await
                .unwrap();
        }
    }
}
