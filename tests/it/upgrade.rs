//! Upgrades: a state directory written by each release opens with today's binary, with every
//! account (and its tokens), key, setting and request record intact.
//!
//! Each release commits a fixture made by `tests/fixtures/make-state.sh` (accounts with tokens,
//! one disabled, one cooling on quota; keys, one revoked; changed settings; request records with
//! failovers, a caller error and sessions) beside what its admin API reported before it stopped
//! (`expected.json`), and a test here. Later releases keep every test and add their own.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common;
use axum::http::Method;
use serde_json::Value;
use switchyard::base::clock::{ManualClock, SharedClock};
use switchyard::config::Config;
use switchyard::daemon::systemd::Notifier;
use switchyard::daemon::{self, ShutdownKind};
use switchyard::store::Store;
use switchyard_admin::AdminClient;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A private copy of a fixture's state directory (the test may write to it).
fn copy_state(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    for f in ["switchyard.redb", "secret.key"] {
        std::fs::copy(fixture(name).join(f), dir.join(f)).unwrap();
        std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    (tmp, dir)
}

fn expected(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(fixture(name).join("expected.json")).unwrap()).unwrap()
}

/// The time the fixture was written: its newest request's start (request ids are
/// `req_<unix ms << 16 | seq>` in hex), plus a second.
fn written_at_ms(expected: &Value) -> u64 {
    expected["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let hex = r["id"].as_str().unwrap().trim_start_matches("req_");
            u64::from_str_radix(hex, 16).unwrap() >> 16
        })
        .max()
        .unwrap()
        + 1000
}

/// The fields of an account that survive a restart (quota and in-flight figures are live).
fn stored_view(a: &Value) -> Value {
    // `detail` is advice in words, which releases reword: only whether there is one counts.
    let keep = [
        "id",
        "label",
        "email",
        "plan",
        "chatgpt_account_id",
        "enabled",
        "state",
        "created_at",
        "reason",
        "cooldown_until",
        "level",
        "last_error",
        "max_concurrency",
        "priority",
        "proxy",
    ];
    Value::Object(
        keep.iter()
            .map(|k| (k.to_string(), a.get(*k).cloned().unwrap_or(Value::Null)))
            .chain([(
                "has_detail".to_string(),
                Value::Bool(a.get("detail").is_some_and(|d| !d.is_null())),
            )])
            .collect(),
    )
}

fn by_id(list: &Value) -> std::collections::BTreeMap<String, Value> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|v| (v["id"].as_str().unwrap().to_string(), v.clone()))
        .collect()
}

/// Opens the fixture with today's code and compares what the admin API shows with what the
/// release that wrote it showed.
/// The keys as the release listed them, each with every field it had; a field added later (a
/// key's policy, 0.3.0; its service tiers, 0.5.0) has its default: no limits.
fn assert_keys(listed: &Value, want: &Value) {
    let (listed, want) = (listed.as_array().unwrap(), want.as_array().unwrap());
    assert_eq!(listed.len(), want.len());
    for (got, want) in listed.iter().zip(want) {
        for (field, value) in want.as_object().unwrap() {
            if field == "policy" {
                // Each field it listed as it listed it; one added since (tiers) is empty.
                let got_policy = got[field].as_object().unwrap();
                for (k, v) in got_policy {
                    match value.get(k) {
                        Some(w) => assert_eq!(v, w, "policy.{k} of {got}"),
                        None => assert_eq!(v, &serde_json::json!([]), "policy.{k} of {got}"),
                    }
                }
                assert!(
                    value
                        .as_object()
                        .unwrap()
                        .keys()
                        .all(|k| got_policy.contains_key(k))
                );
                continue;
            }
            assert_eq!(&got[field], value, "{field} of {got}");
        }
        if want.get("policy").is_none() {
            let policy = got["policy"].as_object().unwrap();
            assert!(
                policy.iter().all(|(k, v)| v.is_null()
                    || (matches!(k.as_str(), "models" | "tiers") && v == &serde_json::json!([]))),
                "{got}"
            );
        }
    }
}

/// The request records as the release listed them, each with every field it had; a field added
/// later (the terminal source and each attempt's rule, 0.4.0) was not recorded then and is null.
fn assert_requests(listed: &Value, want: &Value) {
    let (listed, want) = (listed.as_array().unwrap(), want.as_array().unwrap());
    assert_eq!(listed.len(), want.len());
    for (got, want) in listed.iter().zip(want) {
        let want = want.as_object().unwrap();
        for (field, value) in got.as_object().unwrap() {
            match want.get(field) {
                Some(w) => assert_eq!(value, w, "{field} of {got}"),
                None => assert!(value.is_null(), "{field} of {got}"),
            }
        }
        for field in want.keys() {
            assert!(got.get(field).is_some(), "{field} missing from {got}");
        }
    }
}

async fn opens_intact(name: &str) {
    switchyard::upstream::install_crypto_provider();
    let want = expected(name);
    let (_tmp, dir) = copy_state(name);

    // Every account's tokens open with the fixture's secret.key.
    {
        let store = Store::open(&dir).unwrap();
        for id in by_id(&want["accounts"]).keys() {
            assert!(
                store.account_secrets(id).unwrap().is_some(),
                "tokens of account {id}"
            );
        }
        store.close().await.unwrap();
    }

    // The gateway on it, at the time the fixture was written (its upstream is a closed port:
    // nothing is sent anywhere).
    let clock: SharedClock = Arc::new(ManualClock::new(written_at_ms(&want)));
    let socket = dir.join("admin.sock");
    let listeners = daemon::bind("127.0.0.1:0".parse().unwrap(), &socket)
        .await
        .unwrap();
    let http = listeners.http_addr().unwrap();
    let mut config = Config::default();
    config.upstream.base_url = "http://127.0.0.1:9/backend-api/codex".into();
    config.upstream.usage_url = "http://127.0.0.1:9/backend-api/wham/usage".into();
    config.upstream.oauth_token_url = "http://127.0.0.1:9/oauth/token".into();
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(daemon::run(
        Store::open(&dir).unwrap(),
        config,
        clock,
        listeners,
        Notifier::default(),
        async move { stopped.await.unwrap_or(ShutdownKind::Fast) },
    ));
    let admin = AdminClient::connect(&socket).await.unwrap();
    let get = |path: &'static str| {
        let admin = &admin;
        async move {
            admin
                .call::<Value>(Method::GET, path, None)
                .await
                .unwrap_or_else(|e| panic!("{path}: {e}"))
        }
    };

    let accounts = by_id(&get("/api/admin/accounts").await);
    let want_accounts = by_id(&want["accounts"]);
    assert_eq!(
        accounts.keys().collect::<Vec<_>>(),
        want_accounts.keys().collect::<Vec<_>>()
    );
    for (id, a) in &want_accounts {
        assert_eq!(stored_view(&accounts[id]), stored_view(a), "account {id}");
    }
    let states: Vec<&str> = want_accounts
        .values()
        .map(|a| a["state"].as_str().unwrap())
        .collect();
    assert!(
        states.contains(&"cooling") && states.contains(&"disabled"),
        "the fixture holds a cooling and a disabled account: {states:?}"
    );

    assert_keys(&get("/api/admin/keys").await, &want["keys"]);
    let keys = want["keys"].as_array().unwrap();
    assert!(keys.iter().any(|k| !k["revoked_at"].is_null()));
    assert_eq!(get("/api/admin/settings").await, want["settings"]);

    let requests = get("/api/admin/requests?limit=100").await;
    assert_requests(&requests, &want["requests"]);
    // From 0.3.0: the usage buckets, to the token.
    if let Some(usage) = want.get("usage") {
        assert_eq!(&get("/api/admin/usage?from=0&to=4102444800").await, usage);
        assert!(!usage.as_array().unwrap().is_empty());
    }
    assert!(requests.as_array().unwrap().len() >= 5);

    // Nothing was left out for being unreadable.
    let metrics = reqwest::get(format!("http://{http}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("switchyard_store_undecodable_rows_total 0"),
        "{metrics}"
    );

    stop.send(ShutdownKind::Graceful).unwrap();
    task.await.unwrap().unwrap();

    // The binary itself, on the same directory, without a daemon.
    let out = common::cli(&dir, &["key", "list", "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_keys(&listed, &want["keys"]);
    let out = common::cli(&dir, &["account", "list", "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let listed = by_id(&serde_json::from_slice(&out.stdout).unwrap());
    for (id, a) in &want_accounts {
        for field in ["label", "email", "enabled", "chatgpt_account_id"] {
            assert_eq!(listed[id][field], a[field], "account {id} {field}");
        }
    }
}

#[tokio::test]
async fn a_state_directory_written_by_0_1_0_opens_intact() {
    opens_intact("state-0.1.0").await;
}

#[tokio::test]
async fn a_state_directory_written_by_0_2_0_opens_intact() {
    opens_intact("state-0.2.0").await;
}

#[tokio::test]
async fn a_state_directory_written_by_0_3_0_opens_intact() {
    opens_intact("state-0.3.0").await;
}

#[tokio::test]
async fn a_state_directory_written_by_0_4_0_opens_intact() {
    // What 0.4.0 added is in the fixture, so the comparison covers it: an account's own proxy
    // (listed with its password hidden) and attempts judged by an operator rule.
    let want = expected("state-0.4.0");
    assert!(
        want["accounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["proxy"]
                .as_str()
                .is_some_and(|p| p.contains("fixture:***@") && !p.contains("secret"))),
        "{}",
        want["accounts"]
    );
    assert!(
        want["requests"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["attempts"].as_array().unwrap())
            .any(|a| a["rule"] == "fixture: a 503 moves the session"),
        "{}",
        want["requests"]
    );
    opens_intact("state-0.4.0").await;
}
