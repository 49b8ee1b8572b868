//! What an appliance owner does to a running daemon: reload its configuration, guard
//! `/metrics`, restart it without refusing a client, back it up and restore it, ask `doctor`.

use std::path::PathBuf;
use std::time::Instant;

use crate::common;
use crate::common::{Daemon, DaemonOptions, cli, gw, stderr, stdout};
use serde_json::Value;
use switchyard::sim::{Fault, FaultKind, Sim, SimHandle, SimOptions};

/// A simulator, a config pointing at it (plus `extra`), and a state directory with its accounts
/// imported and one client key.
struct Setup {
    sim: SimHandle,
    _tmp: tempfile::TempDir,
    state: PathBuf,
    cfg: PathBuf,
    key: String,
}

impl Setup {
    async fn new(accounts: u32, extra: &str) -> Setup {
        switchyard::upstream::install_crypto_provider();
        let sim = Sim::start(SimOptions {
            accounts,
            ..SimOptions::default()
        })
        .await
        .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let cfg = tmp.path().join("switchyard.toml");
        let s = Setup {
            sim,
            state,
            cfg,
            key: String::new(),
            _tmp: tmp,
        };
        s.write_config(extra);
        let mut s = s;
        for acct in s.sim.sim.account_ids() {
            let auth = s._tmp.path().join(format!("{acct}.json"));
            std::fs::write(&auth, s.sim.sim.auth_json(&acct).unwrap().to_string()).unwrap();
            let out = s.cli(&["account", "import", "--no-refresh", auth.to_str().unwrap()]);
            assert!(out.status.success(), "{}", stderr(&out));
        }
        let out = s.cli(&["key", "create", "ops"]);
        assert!(out.status.success(), "{}", stderr(&out));
        s.key = stdout(&out).trim().to_string();
        s
    }

    fn write_config(&self, extra: &str) {
        std::fs::write(
            &self.cfg,
            format!(
                "{extra}\n[upstream]\nbase_url = \"{}\"\nusage_url = \"{}\"\noauth_token_url = \"{}\"\n",
                self.sim.base_url(),
                self.sim.usage_url(),
                self.sim.oauth_token_url()
            ),
        )
        .unwrap();
    }

    fn cli(&self, args: &[&str]) -> std::process::Output {
        let mut all = vec!["--config", self.cfg.to_str().unwrap()];
        all.extend_from_slice(args);
        cli(&self.state, &all)
    }

    fn daemon(&self) -> Daemon {
        Daemon::start_with(
            &self.state,
            DaemonOptions {
                config: Some(&self.cfg),
                ..Default::default()
            },
        )
    }
}

/// Waits until the daemon has proved every account (new accounts are probed first).
async fn until_ready(d: &Daemon) {
    let socket = d.socket.clone();
    gw::until("every account proved", || {
        let socket = socket.clone();
        async move {
            let accounts = common::http_unix(&socket, "GET", "/api/admin/accounts", &[], None);
            accounts
                .json()
                .as_array()
                .unwrap()
                .iter()
                .all(|a| a["state"] == "ready")
        }
    })
    .await;
}

fn request(d: &Daemon, key: &str, model: &str) -> common::HttpResponse {
    let auth = format!("Bearer {key}");
    common::http_tcp(
        d.http,
        "POST",
        "/v1/responses",
        &[("Authorization", auth.as_str())],
        Some(&gw::body_plain(model, "hello", false).to_string()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_config_while_a_stream_runs_and_the_next_request_follows_it() {
    let s = Setup::new(2, "[scheduling]\nstrategy = \"round_robin\"\n").await;
    let mut d = s.daemon();
    until_ready(&d).await;
    let accounts = s.sim.sim.account_ids();
    let counts = || -> Vec<usize> {
        accounts
            .iter()
            .map(|a| s.sim.sim.requests(a).len())
            .collect()
    };
    for acct in &accounts {
        s.sim.sim.push_fault(
            acct,
            Fault {
                kind: FaultKind::SlowDeltas { ms: 300 },
                times: Some(1),
            },
        );
    }
    // A stream in flight: its first output has arrived, the rest comes slowly.
    let before_stream = counts();
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let url = format!("http://{}/v1/responses", d.http);
    let key = s.key.clone();
    let reader = tokio::spawn(async move {
        use futures_util::StreamExt;
        let resp = reqwest::Client::new()
            .post(url)
            .header("authorization", format!("Bearer {key}"))
            .json(&gw::body_plain("gpt-5.5", "a long answer", true))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let mut body = String::new();
        let mut chunks_at = Vec::new();
        let mut first_tx = Some(first_tx);
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.unwrap();
            body.push_str(&String::from_utf8_lossy(&chunk));
            chunks_at.push(Instant::now());
            if body.contains(".delta")
                && let Some(tx) = first_tx.take()
            {
                let _ = tx.send(());
            }
        }
        (status, body, chunks_at)
    });
    if first_rx.await.is_err() {
        panic!(
            "the stream ended before its first output:\n{}",
            d.log_text()
        );
    }
    let streaming: Vec<bool> = counts()
        .iter()
        .zip(&before_stream)
        .map(|(now, before)| now > before)
        .collect();
    // The other account answers at once.
    for (acct, busy) in accounts.iter().zip(&streaming) {
        if !busy {
            s.sim.sim.clear_faults(acct);
        }
    }

    // One request at a time per account, and an alias for the model.
    s.write_config(
        "[scheduling]\nstrategy = \"round_robin\"\nmax_concurrency = 1\n\
         [models]\naliases = { \"fast\" = \"gpt-5.5\" }\n",
    );
    d.signal("HUP");
    d.expect_notify("RELOADING=1");
    d.expect_notify("READY=1");
    let reloaded = Instant::now();
    let listed = d.admin("GET", "/api/admin/accounts", None).json();
    assert!(
        listed.as_array().unwrap().iter().all(|a| a["limit"] == 1),
        "{listed}"
    );

    // The next requests follow the new settings: the alias resolves, and with the streaming
    // account's one slot taken, round robin has only the other account left.
    let before = counts();
    for _ in 0..3 {
        let r = request(&d, &s.key, "fast");
        assert_eq!(r.0, 200, "{}", r.1);
    }
    assert!(!reader.is_finished(), "the stream ended before the check");
    let grew: Vec<usize> = counts().iter().zip(&before).map(|(n, b)| n - b).collect();
    for (g, busy) in grew.iter().zip(&streaming) {
        assert_eq!(*g, if *busy { 0 } else { 3 }, "{grew:?} {streaming:?}");
    }
    // A streamed request, as Codex sends it, whose body would otherwise go upstream unchanged,
    // resolves the new alias too.
    let auth = format!("Bearer {}", s.key);
    let r = common::http_tcp(
        d.http,
        "POST",
        "/v1/responses",
        &[("Authorization", auth.as_str())],
        Some(&gw::body_plain("fast", "hello", true).to_string()),
    );
    assert_eq!(r.0, 200, "{}", r.1);
    let idle = accounts
        .iter()
        .zip(&streaming)
        .find_map(|(a, busy)| (!busy).then_some(a))
        .unwrap();
    let sent = s.sim.sim.requests(idle).pop().unwrap();
    assert_eq!(sent.body["model"], "gpt-5.5", "{}", sent.body);

    // The stream that was running through the reload ends as it would have.
    let (status, body, chunks_at) = reader.await.unwrap();
    assert_eq!(status, 200);
    let (events, _) = common::sse::parse_sse(&body);
    assert_eq!(
        events.last().map(|(k, _)| k.as_str()),
        Some("response.completed"),
        "{body}"
    );
    assert!(chunks_at.iter().any(|t| *t > reloaded));
    let log = d.log_text();
    assert!(log.contains("configuration reloaded"), "{log}");
    assert!(d.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_names_what_waits_for_a_restart_and_refuses_a_bad_file() {
    let s = Setup::new(1, "").await;
    let d = s.daemon();
    s.write_config("[server]\nmax_body_bytes = 1000\n[scheduling]\nqueue_wait = \"5s\"\n");
    let out = s.cli(&["reload"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("reloaded: scheduling"), "{text}");
    assert!(
        text.contains("applies at the next restart: server.max_body_bytes"),
        "{text}"
    );
    let log = d.log_text();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("apply only at the next restart")
            && l.contains("server.max_body_bytes")),
        "{log}"
    );
    // A file that does not parse changes nothing, and says where it is wrong.
    std::fs::write(&s.cfg, "[scheduling]\nstrategy = \"fastest\"\n").unwrap();
    let out = s.cli(&["reload"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("strategy"), "{}", stderr(&out));
    assert_eq!(
        d.admin("GET", "/api/admin/status", None).json()["strategy"],
        "quota_aware"
    );
    assert!(d.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_token_guards_metrics_and_without_one_they_stay_open() {
    let token = "metrics-0123456789abcdef";
    let s = Setup::new(1, &format!("[admin]\nmetrics_token = \"{token}\"\n")).await;
    let d = s.daemon();
    let bare = d.get("/metrics");
    assert_eq!(bare.0, 401, "{}", bare.1);
    assert_eq!(bare.json()["error"]["type"], "invalid_request_error");
    let wrong = common::http_tcp(
        d.http,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer not-the-token-at-all")],
        None,
    );
    assert_eq!(wrong.0, 401);
    let good = common::http_tcp(
        d.http,
        "GET",
        "/metrics",
        &[("Authorization", &format!("Bearer {token}"))],
        None,
    );
    assert_eq!(good.0, 200);
    assert!(good.1.contains("switchyard_"), "{}", good.1);
    // `config check` masks it.
    let check = s.cli(&["config", "check"]);
    assert!(!stdout(&check).contains(token), "{}", stdout(&check));
    // Removed by a reload: open again, as by default.
    s.write_config("");
    assert!(s.cli(&["reload"]).status.success());
    assert_eq!(d.get("/metrics").0, 200);
    assert!(d.terminate().success());
}

#[test]
fn a_listener_handed_over_by_systemd_keeps_connections_waiting_across_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    // The test holds the listening socket, as systemd's socket unit does.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let start = || {
        Daemon::start_with(
            &state,
            DaemonOptions {
                activation: Some(listener.try_clone().unwrap()),
                ..Default::default()
            },
        )
    };
    let first = start();
    assert_eq!(
        first.http, addr,
        "the daemon serves on the socket it was given"
    );
    assert_eq!(first.get("/healthz").0, 200);
    let log = first.log_text();
    assert!(
        log.contains("serving on the socket systemd passed"),
        "{log}"
    );
    assert!(first.terminate().success());

    // No daemon now: a client connects anyway (the socket is still listening) and waits.
    let mut waiting = std::net::TcpStream::connect(addr).unwrap();
    waiting
        .set_read_timeout(Some(common::SIGNAL_DEADLINE))
        .unwrap();
    {
        use std::io::Write;
        waiting
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
    }
    let second = start();
    let mut answer = String::new();
    {
        use std::io::Read;
        waiting.read_to_string(&mut answer).unwrap();
    }
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(second.terminate().success());

    // Without a socket handed over, the same moment refuses the connection.
    let own = Daemon::start(&state);
    let own_addr = own.http;
    assert!(own.terminate().success());
    let refused = std::net::TcpStream::connect(own_addr).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
}

/// The answer held open across a backup: larger than every buffer between the backend and
/// the client.
const HELD_KIB: u32 = 8 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_under_load_restores_every_account_key_setting_usage_and_record() {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The answer held open across the backup (below) waits on this test, not on a timer: the
    // gateway's write timeout must not cut it first.
    let s = Setup::new(2, "[server]\nclient_write_timeout = \"1h\"\n").await;
    let d = s.daemon();
    until_ready(&d).await;
    let settings = d.admin(
        "PUT",
        "/api/admin/settings",
        Some(r#"{"strategy":"least_loaded","queue_wait":"45s","max_concurrency":5}"#),
    );
    assert_eq!(settings.0, 200, "{}", settings.1);
    let limited = s.cli(&["key", "create", "carol", "--rpm", "1000", "--note", "kept"]);
    assert!(limited.status.success(), "{}", stderr(&limited));
    let id = d.admin("GET", "/api/admin/accounts", None).json()[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let set = s.cli(&[
        "account",
        "set",
        &id,
        "--priority",
        "3",
        "--label",
        "backup-me",
    ]);
    assert!(set.status.success(), "{}", stderr(&set));

    // An answer in flight across the whole backup: its first output is read before the backup
    // starts; its rest, larger than every buffer between the backend and this client, can only
    // be written as this client reads it, which it does once the backup has finished.
    let accounts = s.sim.sim.account_ids();
    for acct in &accounts {
        s.sim
            .sim
            .push_fault(acct, Fault::once(FaultKind::LongAnswer { kib: HELD_KIB }));
    }
    let mut held = common::small_socket(d.http).await;
    let body = gw::body_plain("gpt-5.5", "a long answer", true).to_string();
    held.write_all(
        format!(
            "POST /v1/responses HTTP/1.1\r\nhost: switchyard\r\nauthorization: Bearer {}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            s.key,
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let head = common::read_head(&mut held).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let first_output = b"response.output_text.delta";
    let mut held_body = Vec::new();
    while !held_body
        .windows(first_output.len())
        .any(|w| w == first_output)
    {
        let mut buf = [0u8; 1024];
        let n = held.read(&mut buf).await.unwrap();
        assert!(n > 0, "the held answer ended before its first output");
        held_body.extend_from_slice(&buf[..n]);
    }
    let writing: Vec<&String> = accounts
        .iter()
        .filter(|a| s.sim.sim.http_open(a) == 1)
        .collect();
    assert_eq!(writing.len(), 1, "one account writes the held answer");
    let holder = writing[0].clone();
    // The other account's long answer is not for the load, and the load goes to the other
    // account: the holder's one slot is the held answer's, so what the backend writes for the
    // holder is the held answer alone.
    s.sim.sim.clear_all_faults();
    let holder_id = d
        .admin("GET", "/api/admin/accounts", None)
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["chatgpt_account_id"] == holder.as_str())
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let capped = s.cli(&["account", "set", &holder_id, "--max-concurrency", "1"]);
    assert!(capped.status.success(), "{}", stderr(&capped));

    // Load: requests one after another until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let load = {
        let (stop, done) = (Arc::clone(&stop), Arc::clone(&done));
        let (http, key) = (d.http, s.key.clone());
        std::thread::spawn(move || {
            let auth = format!("Bearer {key}");
            for _ in 0..2000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let r = common::http_tcp(
                    http,
                    "POST",
                    "/v1/responses",
                    &[("Authorization", auth.as_str())],
                    Some(&gw::body_plain("gpt-5.5", "under load", false).to_string()),
                );
                assert_eq!(r.0, 200, "{}", r.1);
                done.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    gw::until("some load", || {
        let done = Arc::clone(&done);
        async move { done.load(Ordering::Relaxed) >= 10 }
    })
    .await;

    let get = |d: &Daemon, path: &str| d.admin("GET", path, None).json();
    let accounts = get(&d, "/api/admin/accounts");
    let keys = get(&d, "/api/admin/keys");
    let settings = get(&d, "/api/admin/settings");
    let records: Vec<String> = get(&d, "/api/admin/requests?limit=2000")
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    let usage = get(&d, "/api/admin/usage?from=0&to=9999999999");
    assert!(!records.is_empty() && !usage.as_array().unwrap().is_empty());

    let file = s._tmp.path().join("switchyard.backup");
    assert_eq!(s.sim.sim.http_open(&holder), 1, "the held answer runs");
    let out = s.cli(&["backup", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("does not hold secret.key"),
        "{}",
        stdout(&out)
    );
    // The backup is done and the backend is still writing the held answer: it was in flight
    // from before the backup started until after it finished.
    assert_eq!(
        s.sim.sim.http_open(&holder),
        1,
        "the held answer ended before the backup did"
    );
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    // Read to its end, it completed whole.
    held.read_to_end(&mut held_body).await.unwrap();
    let held_body = String::from_utf8(common::dechunk(&held_body)).unwrap();
    let (events, _) = common::sse::parse_sse(&held_body);
    assert_eq!(
        events.last().map(|(k, _)| k.as_str()),
        Some("response.completed")
    );
    let text: usize = events
        .iter()
        .filter(|(k, _)| k == "response.output_text.delta")
        .map(|(_, v)| v["delta"].as_str().unwrap().len())
        .sum();
    assert_eq!(text, HELD_KIB as usize * 1024);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let head = std::fs::read(&file).unwrap();
    let head = String::from_utf8_lossy(&head[..400]).into_owned();
    assert!(head.starts_with("switchyard backup 1\n"), "{head}");

    // Without its key it cannot be restored; with the wrong one neither.
    let restored = s._tmp.path().join("restored");
    let backup = file.to_str().unwrap();
    let out = cli(&restored, &["restore", backup]);
    common::assert_one_line_error(&out, &["does not hold secret.key", "--key"]);
    let wrong = s._tmp.path().join("wrong.key");
    std::fs::write(&wrong, [1u8; 32]).unwrap();
    let out = cli(
        &restored,
        &["restore", backup, "--key", wrong.to_str().unwrap()],
    );
    common::assert_one_line_error(&out, &["does not match this backup"]);
    assert!(!restored.join("switchyard.redb").exists());
    let key = s.state.join("secret.key");
    let out = cli(
        &restored,
        &["restore", backup, "--key", key.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // A directory that holds a store is not overwritten without --force.
    let out = cli(
        &restored,
        &["restore", backup, "--key", key.to_str().unwrap()],
    );
    common::assert_one_line_error(&out, &["not empty", "--force"]);
    let out = cli(
        &restored,
        &["restore", backup, "--key", key.to_str().unwrap(), "--force"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(d.terminate().success());

    // Served from the restored directory: everything taken before the backup is there.
    let r = Daemon::start_with(
        &restored,
        DaemonOptions {
            config: Some(&s.cfg),
            ..Default::default()
        },
    );
    let stored = |a: &Value| {
        let mut a = a.clone();
        let o = a.as_object_mut().unwrap();
        for live in [
            "state",
            "in_flight",
            "limit",
            "limit_exact",
            "waiting",
            "oldest_wait_ms",
            "quota",
            "cooldown_remaining_s",
            "draining",
            "level",
            "reason",
            "detail",
            "cooldown_until",
            "last_error",
            // Derived from the records, which go on after the backup.
            "error_rates",
        ] {
            o.remove(live);
        }
        a
    };
    let again = get(&r, "/api/admin/accounts");
    assert_eq!(
        again
            .as_array()
            .unwrap()
            .iter()
            .map(stored)
            .collect::<Vec<_>>(),
        accounts
            .as_array()
            .unwrap()
            .iter()
            .map(stored)
            .collect::<Vec<_>>()
    );
    assert_eq!(get(&r, "/api/admin/keys"), keys);
    assert_eq!(get(&r, "/api/admin/settings"), settings);
    let again: std::collections::HashSet<String> = get(&r, "/api/admin/requests?limit=2000")
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    let lost: Vec<&String> = records.iter().filter(|id| !again.contains(*id)).collect();
    assert!(lost.is_empty(), "records lost: {lost:?}");
    let again = get(&r, "/api/admin/usage?from=0&to=9999999999");
    let bucket = |b: &Value| {
        (
            b["hour"].as_u64().unwrap(),
            b["key_id"].as_str().unwrap().to_string(),
            b["account"].as_str().unwrap().to_string(),
            b["model"].as_str().unwrap().to_string(),
        )
    };
    for b in usage.as_array().unwrap() {
        let found = again
            .as_array()
            .unwrap()
            .iter()
            .find(|x| bucket(x) == bucket(b))
            .unwrap_or_else(|| panic!("usage bucket lost: {b}"));
        assert!(
            found["requests"].as_u64() >= b["requests"].as_u64(),
            "{found} < {b}"
        );
    }
    // The key's client still authenticates against the restored store.
    assert_eq!(request(&r, &s.key, "gpt-5.5").0, 200);
    assert!(r.terminate().success());
}

/// `doctor --json`: its exit code and findings as (level, check, finding, remedy).
fn doctor(out: &std::process::Output) -> (i32, Vec<(String, String, String, String)>) {
    let findings: Value = serde_json::from_str(&stdout(out))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", stdout(out), stderr(out)));
    let rows = findings
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let s = |k: &str| f[k].as_str().unwrap().to_string();
            (s("level"), s("check"), s("finding"), s("remedy"))
        })
        .collect();
    (out.status.code().unwrap(), rows)
}

/// A copy of the unit this release ships, running `bin`.
fn unit_dir(root: &std::path::Path, bin: &str) -> PathBuf {
    let dir = root.join("units");
    std::fs::create_dir_all(&dir).unwrap();
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("packaging/systemd/switchyard.service"),
    )
    .unwrap()
    .replace("/usr/bin/switchyard", bin);
    std::fs::write(dir.join("switchyard.service"), unit).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_finds_nothing_wrong_with_a_healthy_installation() {
    let s = Setup::new(2, "").await;
    let units = unit_dir(s._tmp.path(), common::BIN);
    let units = units.to_str().unwrap();
    // Without a daemon (the store read-only), against the simulator as the upstream.
    let before = std::fs::read(s.state.join("switchyard.redb")).unwrap();
    let out = s.cli(&["doctor", "--json", "--unit-dir", units]);
    let (code, findings) = doctor(&out);
    assert_eq!(code, 0, "{findings:#?}");
    assert!(findings.iter().all(|f| f.0 == "ok"), "{findings:#?}");
    for check in [
        "config",
        "state directory",
        "file modes",
        "store integrity",
        "secret.key",
        "unreadable rows",
        "account tokens",
        "logins",
        "upstream",
        "clock",
        "listener",
        "metrics",
        "systemd unit",
    ] {
        assert!(
            findings.iter().any(|f| f.1 == check),
            "no `{check}`: {findings:#?}"
        );
    }
    assert_eq!(
        std::fs::read(s.state.join("switchyard.redb")).unwrap(),
        before,
        "doctor wrote the store"
    );
    // Through the daemon, the same.
    let d = s.daemon();
    let out = s.cli(&["doctor", "--json", "--unit-dir", units]);
    let (code, findings) = doctor(&out);
    assert_eq!(code, 0, "{findings:#?}");
    assert!(
        findings
            .iter()
            .any(|f| f.1 == "daemon" && f.2.contains("running"))
    );
    // The table has a remedy column, and a summary.
    let out = s.cli(&["doctor", "--offline", "--unit-dir", units]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).starts_with("STATUS"), "{}", stdout(&out));
    assert!(stdout(&out).contains("REMEDY"));
    assert!(
        stdout(&out).trim_end().ends_with("0 warnings, 0 errors"),
        "{}",
        stdout(&out)
    );
    assert!(d.terminate().success());
}

#[tokio::test]
async fn doctor_names_each_problem_of_a_broken_state_directory_with_its_remedy() {
    use std::os::unix::fs::PermissionsExt;
    use switchyard::store::Store;
    use switchyard::store::schema::Table;
    use switchyard::store::writer::{Key, Mutation};
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-0.3.0");
    for f in ["switchyard.redb", "secret.key"] {
        std::fs::copy(fixture.join(f), state.join(f)).unwrap();
        std::fs::set_permissions(state.join(f), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    {
        let store = Store::open(&state).unwrap();
        let garbage = |t: Table, k: &str| Mutation::Put(t, Key::Text(k.into()), vec![2, 0xff]);
        store
            .write(vec![
                garbage(Table::ClientKeys, "key_broken"),
                garbage(Table::AccountSecrets, "00508cd4"),
            ])
            .await
            .unwrap();
        store.close().await.unwrap();
    }
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = tmp.path().join("exposed.toml");
    std::fs::write(&cfg, "[server]\nlisten = \"0.0.0.0:8080\"\n").unwrap();
    let units = unit_dir(tmp.path(), "/opt/elsewhere/switchyard");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "--config",
            cfg.to_str().unwrap(),
            "doctor",
            "--offline",
            "--json",
            "--unit-dir",
            units.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        cli(&state, &args)
    };
    let (code, findings) = doctor(&run(&[]));
    assert_eq!(code, 2, "{findings:#?}");
    let has = |level: &str, check: &str, finding: &str, remedy: &str| {
        assert!(
            findings.iter().any(|f| f.0 == level
                && f.1 == check
                && f.2.contains(finding)
                && f.3.contains(remedy)),
            "no {level} `{check}` with `{finding}` / `{remedy}`: {findings:#?}"
        );
    };
    has("warning", "state directory", "0755", "chmod 700");
    has(
        "warning",
        "unreadable rows",
        "client_keys/key_broken",
        "restore a backup",
    );
    has(
        "error",
        "account tokens",
        "00508cd4",
        "account login --account 00508cd4",
    );
    has(
        "warning",
        "logins",
        "needs a new login",
        "account login --account",
    );
    has("warning", "listener", "0.0.0.0:8080", "TLS");
    has("warning", "metrics", "open to the network", "metrics_token");
    has(
        "warning",
        "systemd unit",
        "/opt/elsewhere/switchyard",
        "install this binary",
    );
    has("ok", "store integrity", "verifies", "");

    // A key that does not open the store, and a config that does not load: errors too.
    std::fs::write(state.join("secret.key"), [5u8; 32]).unwrap();
    std::fs::set_permissions(
        state.join("secret.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let (code, findings) = doctor(&run(&[]));
    assert_eq!(code, 2);
    assert!(
        findings
            .iter()
            .any(|f| f.0 == "error" && f.1 == "secret.key" && f.2.contains("does not match")),
        "{findings:#?}"
    );
    std::fs::write(&cfg, "[server]\nlisten = \"nowhere\"\n").unwrap();
    let (code, findings) = doctor(&run(&[]));
    assert_eq!(code, 2);
    assert!(
        findings
            .iter()
            .any(|f| f.0 == "error" && f.1 == "config" && f.2.contains("server.listen")),
        "{findings:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_brings_in_new_operator_rules() {
    let s = Setup::new(2, "").await;
    let mut d = s.daemon();
    until_ready(&d).await;
    let overloaded = || {
        for acct in s.sim.sim.account_ids() {
            s.sim.sim.push_fault(
                &acct,
                Fault {
                    kind: FaultKind::ServerError { status: 503 },
                    times: Some(1),
                },
            );
        }
    };
    // Without a rule both accounts fail over into exhaustion.
    overloaded();
    let r = request(&d, &s.key, "gpt-5.5");
    assert_eq!(r.0, 503);
    assert!(r.1.contains("no_available_account"), "{}", r.1);
    for acct in s.sim.sim.account_ids() {
        s.sim.sim.clear_faults(&acct);
    }
    let listed = d.admin("GET", "/api/admin/accounts", None).json();
    for a in listed.as_array().unwrap() {
        let id = a["id"].as_str().unwrap();
        d.admin(
            "POST",
            &format!("/api/admin/accounts/{id}/clear-cooldown"),
            None,
        );
    }
    // With the rule the first answer goes back as it is.
    s.write_config(
        "[[rules]]\nname = \"overload as it is\"\ncode = \"server_is_overloaded\"\npass_through = true\n",
    );
    d.signal("HUP");
    d.expect_notify("RELOADING=1");
    d.expect_notify("READY=1");
    overloaded();
    let r = request(&d, &s.key, "gpt-5.5");
    assert_eq!(r.0, 503);
    assert!(r.1.contains("server_is_overloaded"), "{}", r.1);
    let recs = d.admin("GET", "/api/admin/requests?limit=1", None).json();
    assert_eq!(
        recs[0]["attempts"][0]["rule"], "overload as it is",
        "{recs}"
    );
    assert!(
        d.log_text().contains("rules"),
        "the reload names what it applied"
    );
    assert!(d.terminate().success());
}
