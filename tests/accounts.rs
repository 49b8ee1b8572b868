//! Accounts in and out the way operators need: `account set` (label, priority, own cap),
//! directly and through a running daemon.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
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
