//! The appliance foundation end to end: the real binary, its store, its admin socket, its
//! signals and its notifications.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::common::*;
use serde_json::Value;

/// The accounts' ChatGPT ids, sorted (accounts created in the same second have no defined
/// order among themselves).
fn ids(list: &Value) -> Vec<String> {
    let mut v: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["chatgpt_account_id"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn import_two_accounts_then_list_shows_both_with_email_plan_and_account_id() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let a = write_auth(tmp.path(), 1, "t");
    let b = write_auth(tmp.path(), 2, "t");
    let out = cli(
        &state,
        &[
            "account",
            "import",
            "--no-refresh",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out)
            .lines()
            .filter(|l| l.starts_with("imported "))
            .count(),
        2
    );

    let list = cli(&state, &["account", "list"]);
    assert!(list.status.success(), "{}", stderr(&list));
    let text = stdout(&list);
    for needle in [
        "user1@example.com",
        "plus",
        "acc-0001",
        "user2@example.com",
        "pro",
        "acc-0002",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    }

    let json: Value =
        serde_json::from_str(&stdout(&cli(&state, &["account", "list", "--json"]))).unwrap();
    assert_eq!(ids(&json), ["acc-0001", "acc-0002"]);
    assert_eq!(json[1]["email"], "user2@example.com");
    assert_eq!(json[1]["plan"], "pro");
    // New accounts are proved by the daemon before they take requests.
    assert_eq!(json[0]["state"], "probing");
    for field in [
        "id",
        "label",
        "email",
        "plan",
        "chatgpt_account_id",
        "enabled",
        "state",
        "created_at",
    ] {
        assert!(json[0].get(field).is_some(), "account JSON lacks {field}");
    }
}

#[test]
fn reimporting_an_account_updates_it_instead_of_duplicating() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let a = write_auth(tmp.path(), 1, "old");
    assert!(
        cli(
            &state,
            &["account", "import", "--no-refresh", a.to_str().unwrap()]
        )
        .status
        .success()
    );
    let a2 = write_auth(tmp.path(), 1, "new");
    let out = cli(
        &state,
        &["account", "import", "--no-refresh", a2.to_str().unwrap()],
    );
    assert!(stdout(&out).starts_with("updated "), "{}", stdout(&out));
    let json: Value =
        serde_json::from_str(&stdout(&cli(&state, &["account", "list", "--json"]))).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 1);
}

#[test]
fn with_a_daemon_running_management_goes_through_the_socket_and_everything_survives_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let files: Vec<_> = (1..=3).map(|n| write_auth(tmp.path(), n, "t")).collect();
    assert!(
        cli(
            &state,
            &[
                "account",
                "import",
                "--no-refresh",
                files[0].to_str().unwrap(),
                files[1].to_str().unwrap()
            ]
        )
        .status
        .success()
    );
    let key1 = cli(&state, &["key", "create", "laptop"]);
    assert!(key1.status.success());

    let daemon = Daemon::start(&state);
    // The daemon holds the store's lock, so this import can only succeed through the socket.
    let out = cli(
        &state,
        &[
            "account",
            "import",
            "--no-refresh",
            files[2].to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("imported "), "{}", stdout(&out));
    let listed = daemon.admin("GET", "/api/admin/accounts", None);
    assert_eq!(listed.0, 200);
    assert_eq!(ids(&listed.json()), ["acc-0001", "acc-0002", "acc-0003"]);
    let key2 = cli(&state, &["key", "create", "ci"]);
    assert!(key2.status.success(), "{}", stderr(&key2));
    // The key is alone on its stdout line.
    let key2_text = stdout(&key2);
    assert_eq!(key2_text.lines().count(), 1);
    assert!(
        key2_text.trim().starts_with("sk-sy-") && key2_text.trim().len() == 38,
        "{key2_text}"
    );

    // The same command prints the same thing through the socket as directly.
    let via_socket = stdout(&cli(&state, &["account", "list", "--json"]));

    let status = daemon.terminate();
    assert!(status.success(), "exit after SIGTERM: {status:?}");
    assert!(
        !state.join("admin.sock").exists(),
        "socket file removed on shutdown"
    );

    let direct = stdout(&cli(&state, &["account", "list", "--json"]));
    assert_eq!(via_socket, direct);

    let daemon = Daemon::start(&state);
    assert_eq!(
        ids(&daemon.admin("GET", "/api/admin/accounts", None).json()),
        ["acc-0001", "acc-0002", "acc-0003"]
    );
    let keys = daemon.admin("GET", "/api/admin/keys", None).json();
    let names: Vec<&str> = keys
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["ci", "laptop"]);
    assert!(
        !keys.to_string().contains("sk-sy-") || keys.to_string().matches("sk-sy-").count() == 2
    );
    assert!(daemon.terminate().success());
}

#[test]
fn no_token_appears_in_plain_text_anywhere_in_the_state_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let files: Vec<_> = (1..=2)
        .map(|n| write_auth(tmp.path(), n, "plain"))
        .collect();
    assert!(
        cli(
            &state,
            &[
                "account",
                "import",
                "--no-refresh",
                files[0].to_str().unwrap(),
                files[1].to_str().unwrap()
            ]
        )
        .status
        .success()
    );
    let daemon = Daemon::start(&state);
    let files3 = write_auth(tmp.path(), 3, "plain");
    assert!(
        cli(
            &state,
            &[
                "account",
                "import",
                "--no-refresh",
                files3.to_str().unwrap()
            ]
        )
        .status
        .success()
    );
    assert!(daemon.terminate().success());

    let mut needles = Vec::new();
    for n in 1..=3 {
        let spec = spec(n, "plain");
        needles.push(switchyard::sim::auth::access_token(&spec));
        needles.push(switchyard::sim::auth::refresh_token(&spec));
        needles.push(switchyard::sim::auth::id_token(&spec));
        needles.push(spec.token_tag.clone());
    }
    let mut checked = 0;
    for entry in std::fs::read_dir(&state).unwrap() {
        let path = entry.unwrap().path();
        if !path.is_file() {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        for n in &needles {
            assert!(
                !bytes.windows(n.len()).any(|w| w == n.as_bytes()),
                "{} contains a token in plain text",
                path.display()
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 2,
        "expected switchyard.redb and secret.key, checked {checked}"
    );
    assert!(state.join("switchyard.redb").exists());
}

#[test]
fn sigkill_during_a_write_burst_keeps_every_acknowledged_write() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let daemon = Daemon::start(&state);
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let socket = daemon.socket.clone();
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let acked = Arc::clone(&acked);
            let socket = socket.clone();
            std::thread::spawn(move || {
                for i in 0.. {
                    let body = format!("{{\"name\":\"k-{w}-{i}\"}}");
                    let Ok(s) = std::os::unix::net::UnixStream::connect(&socket) else {
                        break;
                    };
                    drop(s);
                    let r = std::panic::catch_unwind(|| {
                        http_unix(&socket, "POST", "/api/admin/keys", &[], Some(&body))
                    });
                    match r {
                        Ok(resp) if resp.0 == 201 => acked
                            .lock()
                            .unwrap()
                            .push(resp.json()["id"].as_str().unwrap().to_string()),
                        _ => break,
                    }
                }
            })
        })
        .collect();
    // Kill once a good number of writes have been acknowledged, while the writers keep going.
    let deadline = std::time::Instant::now() + SIGNAL_DEADLINE;
    loop {
        if acked.lock().unwrap().len() >= 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "writes were not acknowledged in time:\n{}",
            daemon.log_text()
        );
        std::thread::yield_now();
    }
    daemon.kill9();
    for w in writers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 200);

    let out = cli(&state, &["key", "list", "--json"]);
    assert!(
        out.status.success(),
        "store must open after SIGKILL: {}",
        stderr(&out)
    );
    let stored: HashSet<String> = serde_json::from_str::<Value>(&stdout(&out))
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_str().unwrap().to_string())
        .collect();
    let missing: Vec<_> = acked.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged writes lost: {missing:?}",
        missing.len()
    );
}

#[test]
fn ready_is_sent_only_after_healthz_answers_and_stopping_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    // Daemon::start returns right after READY=1; ask /healthz immediately.
    let daemon = Daemon::start(&state);
    let h = daemon.get("/healthz");
    assert_eq!(h.0, 200, "{}", h.1);
    assert_eq!(h.json(), serde_json::json!({"status": "ok"}));
    let r = daemon.get("/readyz");
    assert_eq!(r.0, 200, "{}", r.1);
    // terminate() waits for STOPPING=1 before the exit.
    assert!(daemon.terminate().success());
}

#[test]
fn sigint_stops_fast_and_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let mut daemon = Daemon::start(&state);
    daemon.signal("INT");
    daemon.expect_notify("STOPPING=1");
    assert!(daemon.child.wait().unwrap().success());
    // The store is released: a direct command opens it.
    assert!(cli(&state, &["key", "list"]).status.success());
}

#[test]
fn admin_api_on_tcp_needs_the_configured_token() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let cfg = tmp.path().join("c.toml");
    std::fs::write(&cfg, "[admin]\ntoken = \"0123456789abcdef0123\"\n").unwrap();
    let daemon = Daemon::start_with(
        &state,
        DaemonOptions {
            config: Some(&cfg),
            ..Default::default()
        },
    );
    assert_eq!(daemon.get("/api/admin/status").0, 401);
    let wrong = http_tcp(
        daemon.http,
        "GET",
        "/api/admin/status",
        &[("Authorization", "Bearer nope")],
        None,
    );
    assert_eq!(wrong.0, 401);
    assert_eq!(wrong.json()["error"]["code"], "invalid_api_key");
    let ok = http_tcp(
        daemon.http,
        "GET",
        "/api/admin/status",
        &[("Authorization", "Bearer 0123456789abcdef0123")],
        None,
    );
    assert_eq!(ok.0, 200);
    assert_eq!(ok.json()["protocol"], 1);
    assert!(daemon.terminate().success());

    // Without a token the admin API is not on TCP at all.
    let daemon = Daemon::start(&state);
    assert_eq!(daemon.get("/api/admin/status").0, 404);
    assert!(daemon.terminate().success());
}

#[test]
fn the_access_log_has_a_line_per_request_only_when_asked_for() {
    for access in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let cfg = tmp.path().join("switchyard.toml");
        std::fs::write(
            &cfg,
            format!("[log]\nlevel = \"info\"\naccess = {access}\n"),
        )
        .unwrap();
        let key = cli(&state, &["key", "create", "laptop"]);
        assert!(key.status.success(), "{}", stderr(&key));
        let key = stdout(&key).trim().to_string();
        let daemon = Daemon::start_with(
            &state,
            DaemonOptions {
                config: Some(&cfg),
                ..Default::default()
            },
        );
        // No accounts: the request ends at once, as no_account.
        let resp = http_tcp(
            daemon.http,
            "POST",
            "/v1/responses",
            &[("authorization", &format!("Bearer {key}"))],
            Some(r#"{"model":"gpt-5.5","input":"hi"}"#),
        );
        assert_eq!(resp.0, 503, "{}", resp.1);
        let log = daemon.log_text();
        assert!(daemon.terminate().success());
        let lines = log.lines().filter(|l| l.contains("request_final")).count();
        assert_eq!(lines, usize::from(access), "access = {access}:\n{log}");
        if access {
            assert!(
                log.contains("switchyard::access") && log.contains("no_account"),
                "{log}"
            );
        }
    }
}
