//! Bad input gets a one-line error naming the problem, a non-zero exit, and nothing
//! half-written.

use crate::common::*;
use serde_json::Value;

#[test]
fn unknown_config_key_is_named_with_its_line() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("bad.toml");
    std::fs::write(
        &cfg,
        "[server]\nlisten = \"127.0.0.1:9000\"\nlisten_port = 1\n",
    )
    .unwrap();
    let out = cli(
        tmp.path(),
        &["--config", cfg.to_str().unwrap(), "config", "check"],
    );
    assert_one_line_error(&out, &["bad.toml:3", "server.listen_port", "unknown field"]);
}

/// A rule whose cooldown could never take effect (its class does not cool the account) is
/// refused by `config check`, naming the rule, instead of being accepted and ignored.
#[test]
fn a_rule_cooldown_that_cannot_take_effect_is_refused_by_config_check() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("rules.toml");
    std::fs::write(
        &cfg,
        "[[rules]]\nname = \"fix the client\"\nstatus = 400\nclass = \"caller\"\ncooldown = \"1m\"\n",
    )
    .unwrap();
    let out = cli(
        tmp.path(),
        &["--config", cfg.to_str().unwrap(), "config", "check"],
    );
    assert_one_line_error(
        &out,
        &[
            "fix the client",
            "cooldown takes no effect with class `caller`",
        ],
    );
    // With a class that cools, the same cooldown is taken.
    std::fs::write(
        &cfg,
        "[[rules]]\nname = \"shed\"\nstatus = 503\nclass = \"transient\"\ncooldown = \"1m\"\n",
    )
    .unwrap();
    let ok = cli(
        tmp.path(),
        &["--config", cfg.to_str().unwrap(), "config", "check"],
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
}

#[test]
fn malformed_config_is_named_with_its_line() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("bad.toml");
    std::fs::write(&cfg, "[upstream]\nconnect_timeout = \"ten seconds\"\n").unwrap();
    let out = cli(
        tmp.path(),
        &["--config", cfg.to_str().unwrap(), "config", "check"],
    );
    assert_one_line_error(
        &out,
        &["bad.toml:2", "upstream.connect_timeout", "not a duration"],
    );
    std::fs::write(&cfg, "[server\nlisten = 1\n").unwrap();
    let out = cli(
        tmp.path(),
        &["--config", cfg.to_str().unwrap(), "config", "check"],
    );
    assert_one_line_error(&out, &["bad.toml:1"]);
    // The daemon refuses the same config before touching the state dir.
    let state = tmp.path().join("state");
    let out = cli(&state, &["--config", cfg.to_str().unwrap(), "serve"]);
    assert_one_line_error(&out, &["bad.toml:1"]);
    assert!(!state.exists());
}

#[test]
fn config_default_is_accepted_by_check_which_masks_secrets() {
    let tmp = tempfile::tempdir().unwrap();
    let out = cli(tmp.path(), &["config", "default"]);
    assert!(out.status.success());
    let cfg = tmp.path().join("default.toml");
    let text = stdout(&out).replace(
        "# token = \"change-me-to-a-long-random-string\"",
        "token = \"a-very-secret-admin-token\"",
    );
    std::fs::write(&cfg, text).unwrap();
    let check = cli(
        tmp.path(),
        &["--config", cfg.to_str().unwrap(), "config", "check"],
    );
    assert!(check.status.success(), "{}", stderr(&check));
    let printed = stdout(&check);
    assert!(printed.contains("listen = \"127.0.0.1:8080\""), "{printed}");
    assert!(printed.contains("token = \"***\""), "{printed}");
    assert!(!printed.contains("a-very-secret-admin-token"));
}

#[test]
fn env_overrides_apply_and_bad_ones_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = cli_env(
        tmp.path(),
        &["config", "check"],
        &[(
            "SWITCHYARD_UPSTREAM_BASE_URL",
            "http://127.0.0.1:9/backend-api/codex",
        )],
    );
    assert!(stdout(&out).contains("base_url = \"http://127.0.0.1:9/backend-api/codex\""));
    let out = cli_env(
        tmp.path(),
        &["config", "check"],
        &[("SWITCHYARD_OAUTH_TOKEN_URL", "not a url")],
    );
    assert_one_line_error(&out, &["SWITCHYARD_OAUTH_TOKEN_URL"]);
}

fn assert_no_accounts(state: &std::path::Path) {
    let out = cli(state, &["account", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        serde_json::from_str::<Value>(&stdout(&out)).unwrap(),
        serde_json::json!([])
    );
}

#[test]
fn bad_auth_files_are_refused_and_nothing_is_imported() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let good = write_auth(tmp.path(), 1, "t");
    let not_json = tmp.path().join("not.json");
    std::fs::write(&not_json, "hello").unwrap();
    let no_tokens = tmp.path().join("apikey.json");
    std::fs::write(
        &no_tokens,
        r#"{"auth_mode":"apikey","OPENAI_API_KEY":"sk-x","tokens":null}"#,
    )
    .unwrap();
    let bad_jwt = tmp.path().join("badjwt.json");
    let mut v = switchyard::sim::auth::auth_json(&spec(2, "t"));
    v["tokens"]["id_token"] = "not-a-jwt".into();
    std::fs::write(&bad_jwt, v.to_string()).unwrap();

    for (file, needle) in [
        (&not_json, "not a JSON auth file"),
        (&no_tokens, "no ChatGPT tokens"),
        (&bad_jwt, "id_token"),
    ] {
        // The good file comes first: it must not be imported either.
        let out = cli(
            &state,
            &[
                "account",
                "import",
                "--no-refresh",
                good.to_str().unwrap(),
                file.to_str().unwrap(),
            ],
        );
        assert_one_line_error(&out, &[file.file_name().unwrap().to_str().unwrap(), needle]);
    }
    let missing = cli(
        &state,
        &[
            "account",
            "import",
            "--no-refresh",
            tmp.path().join("nope.json").to_str().unwrap(),
        ],
    );
    assert_one_line_error(&missing, &["nope.json"]);
    assert_no_accounts(&state);
}

#[test]
fn import_reads_stdin() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let good = write_auth(tmp.path(), 5, "t");
    let mut cmd = std::process::Command::new(BIN);
    clean_env(&mut cmd);
    let out = cmd
        .arg("--state-dir")
        .arg(&state)
        .args(["account", "import", "--no-refresh", "-"])
        .stdin(std::fs::File::open(&good).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("acc-0005"));
}

#[test]
fn a_state_dir_that_cannot_be_created_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let state = file.join("state");
    let out = cli(&state, &["key", "list"]);
    assert_one_line_error(&out, &["state directory", "not usable"]);
    let out = cli(&state, &["serve", "--listen", "127.0.0.1:0"]);
    assert_one_line_error(&out, &["state directory", "not usable"]);
}

#[test]
fn a_read_only_state_dir_is_a_clear_error() {
    // Root ignores permission bits; this check only means something for other users.
    if std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| stdout(&o).trim() == "0")
        .unwrap_or(true)
    {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("ro");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o500)).unwrap();
    let out = cli(&state, &["key", "list"]);
    assert_one_line_error(&out, &["not usable"]);
    assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);
}

#[test]
fn a_store_locked_by_another_process_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let cfg = tmp.path().join("elsewhere.toml");
    let socket = tmp.path().join("other").join("admin.sock");
    std::fs::write(
        &cfg,
        format!("[admin]\nsocket = \"{}\"\n", socket.display()),
    )
    .unwrap();
    // A daemon whose socket is not where a config-less command looks for it.
    let daemon = Daemon::start_with(
        &state,
        DaemonOptions {
            config: Some(&cfg),
            socket: Some(socket.clone()),
            ..Default::default()
        },
    );
    let out = cli(&state, &["account", "list"]);
    assert_one_line_error(&out, &["locked by another process", "admin socket"]);
    // With the same config the command goes through the socket.
    let ok = cli(
        &state,
        &["--config", cfg.to_str().unwrap(), "account", "list"],
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    drop(daemon);
}

#[test]
fn a_corrupted_secret_key_is_a_clear_error_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let good = write_auth(tmp.path(), 1, "t");
    assert!(
        cli(
            &state,
            &["account", "import", "--no-refresh", good.to_str().unwrap()]
        )
        .status
        .success()
    );
    std::fs::write(state.join("secret.key"), b"12345").unwrap();
    let out = cli(&state, &["account", "list"]);
    assert_one_line_error(
        &out,
        &["secret.key", "corrupted", "expected 32 bytes, found 5"],
    );
    let out = cli(&state, &["serve", "--listen", "127.0.0.1:0"]);
    assert_one_line_error(&out, &["secret.key", "corrupted"]);
    assert_eq!(std::fs::read(state.join("secret.key")).unwrap(), b"12345");
    // A key of the right size but the wrong value is refused too.
    std::fs::write(state.join("secret.key"), [7u8; 32]).unwrap();
    assert_one_line_error(
        &cli(&state, &["account", "list"]),
        &["secret.key", "does not match"],
    );
}

#[test]
fn admin_requests_with_bad_bodies_get_json_errors_and_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let daemon = Daemon::start(&state);
    let cases = [
        (
            "POST",
            "/api/admin/accounts",
            "not json",
            "invalid_auth_file",
        ),
        (
            "POST",
            "/api/admin/accounts",
            r#"{"tokens":null}"#,
            "invalid_auth_file",
        ),
        ("POST", "/api/admin/keys", "{", "invalid_json"),
        ("POST", "/api/admin/keys", "{}", "invalid_json"),
        ("POST", "/api/admin/keys", r#"{"name":""}"#, "invalid_name"),
    ];
    for (method, path, body, code) in cases {
        let r = daemon.admin(method, path, Some(body));
        assert_eq!(r.0, 400, "{method} {path} {body}: {}", r.1);
        assert_eq!(r.json()["error"]["code"], code, "{}", r.1);
        assert!(r.json()["error"]["message"].as_str().unwrap().len() > 5);
    }
    assert_eq!(
        daemon.admin("DELETE", "/api/admin/accounts/nobody", None).0,
        404
    );
    assert_eq!(
        daemon
            .admin("POST", "/api/admin/accounts/nobody/disable", None)
            .0,
        404
    );
    assert_eq!(daemon.admin("GET", "/api/admin/nothing-here", None).0, 404);
    assert_eq!(
        daemon.admin("GET", "/api/admin/accounts", None).json(),
        serde_json::json!([])
    );
    assert_eq!(
        daemon.admin("GET", "/api/admin/keys", None).json(),
        serde_json::json!([])
    );
    assert!(daemon.terminate().success());
}

#[test]
fn revoking_an_unknown_key_fails_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    assert_one_line_error(
        &cli(&state, &["key", "revoke", "key_nope"]),
        &["no key with id or name `key_nope`"],
    );
    let daemon = Daemon::start(&state);
    assert_one_line_error(
        &cli(&state, &["key", "revoke", "key_nope"]),
        &["no key with id or name `key_nope`"],
    );
    assert!(daemon.terminate().success());
}

#[test]
fn enable_disable_remove_by_id_or_account_id() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let a = write_auth(tmp.path(), 1, "t");
    assert!(
        cli(
            &state,
            &["account", "import", "--no-refresh", a.to_str().unwrap()]
        )
        .status
        .success()
    );
    let daemon = Daemon::start(&state);
    let out = cli(&state, &["account", "disable", "acc-0001"]);
    assert!(stdout(&out).starts_with("disabled "), "{}", stderr(&out));
    let listed = daemon.admin("GET", "/api/admin/accounts", None).json();
    assert_eq!(listed[0]["state"], "disabled");
    assert_eq!(listed[0]["enabled"], false);
    let id = listed[0]["id"].as_str().unwrap().to_string();
    // Enabled again, it is whatever its probe made it (no backend answers here).
    let enabled = daemon
        .admin("POST", &format!("/api/admin/accounts/{id}/enable"), None)
        .json();
    assert_eq!(enabled["enabled"], true);
    assert_ne!(enabled["state"], "disabled");
    assert!(daemon.terminate().success());
    let out = cli(&state, &["account", "remove", &id]);
    assert!(stdout(&out).starts_with("removed "), "{}", stderr(&out));
    assert_no_accounts(&state);
    assert_one_line_error(
        &cli(&state, &["account", "enable", &id]),
        &["no account matches"],
    );
}
