//! The clients our users run, against the gateway in front of the simulator: the official
//! OpenAI Python SDK and Codex CLI. `.ci/run` installs them (`.ci/.venv`, `.ci/.node`); set
//! `SWITCHYARD_TEST_PYTHON` / `SWITCHYARD_TEST_CODEX` to use others.

use std::path::PathBuf;
use std::process::Command;

use crate::common::gw::Gw;
use serde_json::Value;
use switchyard::sim::FaultKind;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tool(env: &str, installed: &str, fallback: Option<&str>) -> PathBuf {
    if let Ok(p) = std::env::var(env) {
        return PathBuf::from(p);
    }
    let local = repo().join(installed);
    if local.exists() {
        return local;
    }
    match fallback {
        Some(f) => PathBuf::from(f),
        None => panic!(
            "{} is not installed: run `bash .ci/run` once (it installs it), or set {env}",
            local.display()
        ),
    }
}

fn python() -> PathBuf {
    tool(
        "SWITCHYARD_TEST_PYTHON",
        ".ci/.venv/bin/python",
        Some("python3"),
    )
}

pub(crate) fn codex() -> PathBuf {
    tool(
        "SWITCHYARD_TEST_CODEX",
        ".ci/.node/node_modules/.bin/codex",
        None,
    )
}

/// Runs one of `tests/clients/*.py` against the gateway's `/v1` with model `gpt-5.5` and
/// returns the JSON it prints.
async fn python_client(gw: &Gw, script: &str) -> Value {
    python_script(script, &[&gw.url("/v1"), &gw.key, "gpt-5.5"]).await
}

/// Runs one of `tests/clients/*.py` with these arguments and returns the JSON it prints.
async fn python_script(script: &str, args: &[&str]) -> Value {
    let mut cmd = Command::new(python());
    cmd.arg(repo().join("tests/clients").join(script))
        .args(args);
    let out = run(cmd).await;
    assert!(
        out.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

async fn run(mut cmd: Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_streams_and_not_while_the_first_account_fails_over() {
    let gw = Gw::start(2).await;
    let first = gw.rr_order()[0].clone();
    gw.fault(
        &first,
        FaultKind::Quota {
            resets_in_seconds: 3600,
        },
        None,
    );
    let v = python_client(&gw, "openai_sdk.py").await;
    assert_eq!(v["json_status"], "completed", "{v}");
    assert!(v["json_text"].as_str().unwrap().contains("sim-acct"), "{v}");
    assert!(v["json_usage_input"].as_u64().unwrap() > 0);
    let kinds: Vec<&str> = v["stream_kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"response.created"));
    assert_eq!(kinds.last(), Some(&"response.completed"));
    assert_eq!(
        kinds.iter().filter(|k| **k == "response.created").count(),
        1
    );
    assert!(!v["stream_text"].as_str().unwrap().is_empty());
    assert_eq!(v["bad_key"], "AuthenticationError");
    assert_eq!(
        gw.served(&first),
        1,
        "the quota answer cooled the first account once"
    );
    assert_eq!(gw.account(&first).await["state"], "cooling");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_websocket_two_turns_with_previous_response_id() {
    let gw = Gw::start(2).await;
    let v = python_client(&gw, "openai_ws.py").await;
    let turns = v["turns"].as_array().unwrap();
    for t in &turns[..2] {
        assert_eq!(t["status"], "completed", "{v}");
        assert!(t["text"].as_str().unwrap().contains("sim-acct"), "{v}");
    }
    assert_ne!(turns[0]["id"], turns[1]["id"]);
    assert!(
        turns[2]["error"]
            .to_string()
            .contains("previous_response_not_found"),
        "{v}"
    );
    let recs = gw.requests(5).await;
    let served: Vec<&Value> = recs
        .iter()
        .rev()
        .filter(|r| r["ws"] == true && r["outcome"] == "success")
        .collect();
    assert_eq!(served.len(), 2);
    // The SDK sends no session header: the connection is the session, so the continuation
    // stays on its account and upstream socket instead of replaying the history elsewhere.
    assert_eq!(served[0]["account"], served[1]["account"], "{v}");
    assert_eq!(
        (
            served[0]["transport"].as_str(),
            served[1]["transport"].as_str()
        ),
        (Some("ws_connected"), Some("ws_reused"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_cli_over_websocket_completes_a_tool_call_turn_without_falling_back() {
    let gw = Gw::start(2).await;
    let first = gw.rr_order()[0].clone();
    gw.fault(
        &first,
        FaultKind::Quota {
            resets_in_seconds: 3600,
        },
        None,
    );
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = codex_exec_ws(&gw, tmp.path(), "please run: echo switchyard-ws-ok", true);
    cmd.env("RUST_LOG", "codex_core=info,codex_api=info");
    let out = run(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "codex failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("switchyard-ws-ok"), "{stdout}\n{stderr}");
    assert!(
        !stderr.to_lowercase().contains("falling back to http"),
        "codex fell back to HTTP:\n{stderr}"
    );
    let recs = gw.requests(10).await;
    let ws_turns = recs
        .iter()
        .filter(|r| r["ws"] == true && r["outcome"] == "success")
        .count();
    assert!(
        ws_turns >= 2,
        "the tool call and its follow-up came over the WebSocket: {recs:?}"
    );
    assert!(
        recs.iter().all(|r| r["ws"] == true),
        "no HTTP turn: {recs:?}"
    );
}

/// A `codex exec` run against the gateway, in its own home and work directory.
fn codex_exec(gw: &Gw, tmp: &std::path::Path, prompt: &str) -> Command {
    codex_exec_ws(gw, tmp, prompt, false)
}

fn codex_exec_ws(gw: &Gw, tmp: &std::path::Path, prompt: &str, websockets: bool) -> Command {
    let home = tmp.join("codex-home");
    let work = tmp.join("work");
    // Codex runs its tool calls in a login shell: with the machine's own HOME, that shell's
    // profile runs too, and its output (a version manager failing to rehash its shims while
    // another test's shell does the same) lands in front of the command's and pushes it out of
    // the simulated reply.
    let user_home = tmp.join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&user_home).unwrap();
    let provider = format!(
        "model_providers.gw={{name=\"gw\",base_url=\"{}\",env_key=\"SWITCHYARD_KEY\",wire_api=\"responses\",supports_websockets={websockets}}}",
        gw.url("/v1")
    );
    let mut cmd = Command::new(codex());
    cmd.current_dir(&work)
        .env("CODEX_HOME", &home)
        .env("HOME", &user_home)
        .env("SWITCHYARD_KEY", &gw.key)
        .env_remove("OPENAI_API_KEY")
        .args([
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "-m",
            "gpt-5.5",
        ])
        .args(["-c", "model_provider=\"gw\"", "-c", &provider])
        .arg(prompt);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_codex_sessions_share_two_single_slot_accounts_and_each_stays_on_one() {
    let gw = Gw::start_with(2, |c| c.scheduling.max_concurrency = 1).await;
    // Slow answers, so the three sessions overlap and one has to wait for a slot.
    for a in gw.rr_order() {
        gw.fault(&a, FaultKind::SlowFirstToken { ms: 700 }, Some(6));
    }
    let tmp = tempfile::tempdir().unwrap();
    let runs: Vec<_> = (0..3)
        .map(|i| {
            let dir = tmp.path().join(format!("s{i}"));
            let cmd = codex_exec(&gw, &dir, &format!("please run: echo session-{i}-ok"));
            tokio::spawn(run(cmd))
        })
        .collect();
    for (i, r) in runs.into_iter().enumerate() {
        let out = r.await.unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "session {i} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("session-{i}-ok")),
            "session {i}:\n{stdout}"
        );
    }
    // Every session's turns went to one account.
    let mut by_session: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for a in gw.rr_order() {
        for r in gw.sim.sim.requests(&a) {
            let session = r
                .headers
                .get("session-id")
                .cloned()
                .expect("codex sends session-id");
            by_session.entry(session).or_default().insert(a.clone());
        }
    }
    assert_eq!(by_session.len(), 3, "{by_session:?}");
    for (s, accounts) in &by_session {
        assert_eq!(accounts.len(), 1, "session {s} moved: {accounts:?}");
    }
    let records = gw.requests(20).await;
    assert!(
        records.iter().all(|r| r["outcome"] == "success"),
        "{records:?}"
    );
    assert!(
        records.iter().any(|r| r["queue"]["outcome"] == "acquired"),
        "one session waited: {records:?}"
    );
    assert_eq!(gw.status().await["in_flight"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_cli_completes_a_tool_call_turn_while_the_first_account_fails_over() {
    let gw = Gw::start(2).await;
    let first = gw.rr_order()[0].clone();
    let second = gw.rr_order()[1].clone();
    gw.fault(
        &first,
        FaultKind::Quota {
            resets_in_seconds: 3600,
        },
        None,
    );
    let tmp = tempfile::tempdir().unwrap();
    let cmd = codex_exec(&gw, tmp.path(), "please run: echo switchyard-tool-ok");
    let out = run(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "codex failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("switchyard-tool-ok"),
        "final answer lacks the tool output:\n{stdout}\n{stderr}"
    );

    // Two turns reached the backend: the tool call, then its output.
    let served = gw.sim.sim.requests(&second);
    assert!(
        served.len() >= 2,
        "{} requests on the healthy account",
        served.len()
    );
    let last_input = served.last().unwrap().body["input"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        last_input
            .iter()
            .any(|i| i["type"] == "function_call_output"
                && i["output"]
                    .as_str()
                    .is_some_and(|o| o.contains("switchyard-tool-ok"))),
        "the follow-up carries the command's output"
    );
    assert!(
        served.iter().all(|r| r.headers.contains_key("session-id")),
        "session headers passed through"
    );
    assert_eq!(
        gw.served(&first),
        1,
        "one quota answer, then the account was left alone"
    );
    let records = gw.requests(10).await;
    assert!(
        records.iter().all(|r| r["outcome"] == "success"),
        "{records:?}"
    );
    assert!(records.iter().any(|r| r["attempts"][0]["class"] == "quota"));
}

/// The SDK meets a key's limits as OpenAI errors: `PermissionDeniedError` (403
/// `model_not_allowed`) and `RateLimitError` (429 `key_rate_limited` with `Retry-After`) over
/// HTTP, `error` events over the WebSocket, whose connection stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_meets_a_keys_limits_over_http_and_websocket() {
    let gw = Gw::start(2).await;
    let (_, key) = gw
        .make_key("sdk", serde_json::json!({"models": ["gpt-5.5"], "rpm": 3}))
        .await;
    let mut cmd = Command::new(python());
    cmd.arg(repo().join("tests/clients/openai_key_limits.py"))
        .arg(gw.url("/v1"))
        .arg(&key)
        .arg("gpt-5.5")
        .arg("gpt-5.4-mini");
    let out = run(cmd).await;
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["http_denied"]["class"], "PermissionDeniedError", "{v}");
    assert_eq!(v["http_denied"]["status"], 403);
    assert_eq!(v["http_denied"]["code"], "model_not_allowed");
    assert_eq!(v["http_allowed"]["ok"], true, "{v}");
    let ws: Vec<(&str, Option<&str>)> = v["ws"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["type"].as_str().unwrap(), t["code"].as_str()))
        .collect();
    assert_eq!(
        ws,
        [
            ("error", Some("model_not_allowed")),
            ("response.completed", None),
            ("response.completed", None),
            ("error", Some("key_rate_limited")),
            ("error", Some("model_not_allowed")),
        ],
        "{v}"
    );
    assert_eq!(v["http_limited"]["class"], "RateLimitError", "{v}");
    assert_eq!(v["http_limited"]["code"], "key_rate_limited");
    let retry: u64 = v["http_limited"]["retry_after"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(v["usage"]["key"]["name"], "sdk");
    assert_eq!(v["usage"]["usage"]["today"]["requests"], 8, "{v}");
    assert_eq!(v["usage"]["limits"]["rpm"]["remaining"], 0, "{v}");
    // Three requests reached the backend (and one WebSocket handshake); no refusal did.
    let served: usize = gw.ids.keys().map(|a| gw.served(a)).sum();
    assert_eq!(served, 4);
}

/// The names on Codex's wire, as the backend saw them through the gateway: request header
/// names, body keys, `client_metadata` keys and the turn metadata's keys.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
struct Wire {
    headers: std::collections::BTreeSet<String>,
    body: std::collections::BTreeSet<String>,
    client_metadata: std::collections::BTreeSet<String>,
    turn_metadata: std::collections::BTreeSet<String>,
}

impl Wire {
    fn of(recorded: &[switchyard::sim::RecordedRequest]) -> Wire {
        let mut w = Wire::default();
        let keys = |v: &Value| -> Vec<String> {
            v.as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default()
        };
        let turn = |text: &str| serde_json::from_str::<Value>(text).unwrap_or(Value::Null);
        for r in recorded.iter().filter(|r| r.path.contains("/responses")) {
            w.headers.extend(r.headers.keys().cloned());
            w.body.extend(keys(&r.body));
            let meta = &r.body["client_metadata"];
            w.client_metadata.extend(keys(meta));
            for text in [
                meta["x-codex-turn-metadata"].as_str(),
                r.headers.get("x-codex-turn-metadata").map(String::as_str),
            ]
            .into_iter()
            .flatten()
            {
                w.turn_metadata.extend(keys(&turn(text)));
            }
        }
        w
    }

    /// What this one has that `known` has not, named by where it is.
    fn new_against(&self, known: &Wire) -> Vec<String> {
        let mut out = Vec::new();
        for (what, mine, theirs) in [
            ("header", &self.headers, &known.headers),
            ("body key", &self.body, &known.body),
            (
                "client_metadata key",
                &self.client_metadata,
                &known.client_metadata,
            ),
            (
                "turn metadata key",
                &self.turn_metadata,
                &known.turn_metadata,
            ),
        ] {
            out.extend(mine.difference(theirs).map(|n| format!("{what} `{n}`")));
        }
        out
    }
}

/// The pinned Codex CLI through the gateway, over HTTP and the WebSocket, a tool turn each and
/// a compaction: every name the backend saw is on the committed list for the pinned version
/// (`tests/fixtures/codex-wire-0.171.json`; `scripts/codex-drift.sh` runs this with the newest
/// release and prints what changed), and the CLI's own device id reached the backend nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_cli_reaches_the_backend_with_the_committed_wire_names_and_no_device_id() {
    let gw = Gw::start(1).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut homes = Vec::new();
    // A tool turn over each transport, and one more over the WebSocket with an auto-compaction
    // limit its first answer passes: Codex compacts on a second connection of the session.
    for (name, websockets, compact) in [
        ("http", false, false),
        ("ws", true, false),
        ("compact", true, true),
    ] {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = codex_exec_ws(
            &gw,
            &dir,
            &format!("please run: echo wire-{name}-ok"),
            websockets,
        );
        if compact {
            cmd.args(["-c", "model_auto_compact_token_limit=2000"]);
        }
        let out = run(cmd).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "codex ({name}) failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if !compact {
            assert!(stdout.contains(&format!("wire-{name}-ok")), "{stdout}");
        }
        homes.push(dir.join("codex-home"));
    }
    let recorded = gw.sim.sim.all_requests();
    // The device id each CLI keeps in its home, found nowhere upstream.
    for home in &homes {
        let id = std::fs::read_to_string(home.join("installation_id")).unwrap();
        let id = id.trim();
        assert_eq!(id.len(), 36, "{id}");
        for r in &recorded {
            let text = format!("{:?} {}", r.headers, r.body);
            assert!(
                !text.contains(id),
                "the CLI's device id reached the backend: {text}"
            );
        }
    }
    let seen = Wire::of(&recorded);
    if let Ok(path) = std::env::var("SWITCHYARD_WIRE_OUT") {
        std::fs::write(&path, serde_json::to_string_pretty(&seen).unwrap()).unwrap();
    }
    let fixture = std::env::var("SWITCHYARD_WIRE_FIXTURE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo().join("tests/fixtures/codex-wire-0.171.json"));
    let known: Wire = serde_json::from_slice(&std::fs::read(&fixture).unwrap()).unwrap();
    let new = seen.new_against(&known);
    if std::env::var_os("SWITCHYARD_WIRE_ALLOW_NEW").is_none() {
        assert!(
            new.is_empty(),
            "names on the wire not in {}: {}",
            fixture.display(),
            new.join(", ")
        );
    }
    // The compaction came, on a second connection of the session.
    let upgrades = recorded.iter().filter(|r| r.method == "GET").count();
    assert!(upgrades >= 2, "{upgrades} WebSocket connections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_chat_completions_plain_streamed_and_with_a_tool_while_an_account_fails()
{
    let gw = Gw::start(2).await;
    let first = gw.rr_order()[0].clone();
    gw.fault(&first, FaultKind::ServerError { status: 503 }, Some(1));
    let v = python_client(&gw, "openai_chat.py").await;
    assert_eq!(v["plain_object"], "chat.completion", "{v}");
    assert!(
        v["plain_text"].as_str().unwrap().contains("sim-acct"),
        "{v}"
    );
    assert_eq!(v["plain_finish"], "stop");
    assert!(
        v["plain_usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{v}"
    );
    assert!(
        v["stream_text"].as_str().unwrap().contains("simulated"),
        "{v}"
    );
    assert_eq!(v["stream_finish"], "stop");
    assert!(
        v["stream_usage"]["total_tokens"].as_u64().unwrap() > 0,
        "{v}"
    );
    assert_eq!(v["tool_finish"], "tool_calls", "{v}");
    assert_eq!(v["tool_name"], "exec_command");
    assert_eq!(v["tool_args"]["cmd"], "echo hello");
    assert!(v["tool_reply"].as_str().unwrap().contains("hello"), "{v}");
    assert_eq!(v["n2"], "unsupported_value", "{v}");
    // The failing account was invisible; each request is one record, named by its front door.
    let recs = gw.requests(10).await;
    let chats: Vec<_> = recs
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), 4, "{recs:?}");
    assert!(chats.iter().all(|r| r["outcome"] == "success"), "{chats:?}");
    assert!(
        chats
            .iter()
            .any(|r| r["attempts"].as_array().unwrap().len() == 2),
        "one failed over"
    );
}

/// Runs `tests/clients/anthropic_messages.py` against the gateway's origin.
async fn anthropic_client(gw: &Gw, model: &str) -> Value {
    python_script("anthropic_messages.py", &[&gw.url(""), &gw.key, model]).await
}

fn claude_on_the_pool(c: &mut switchyard::config::Config) {
    c.front_doors
        .anthropic
        .models
        .insert("claude-sonnet-*".into(), "gpt-5.5".into());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_python_sdk_messages_plain_streamed_with_thinking_and_a_tool_while_an_account_fails()
 {
    let gw = Gw::start_with(2, claude_on_the_pool).await;
    let first = gw.rr_order()[0].clone();
    gw.fault(&first, FaultKind::ServerError { status: 503 }, Some(1));
    let v = anthropic_client(&gw, "claude-sonnet-4-5").await;
    assert_eq!(v["plain_type"], "message", "{v}");
    assert!(
        v["plain_text"].as_str().unwrap().contains("sim-acct"),
        "{v}"
    );
    assert_eq!(v["plain_stop"], "end_turn");
    assert!(
        v["plain_usage"]["input_tokens"].as_u64().unwrap() > 0,
        "{v}"
    );
    let kinds: Vec<&str> = v["stream_kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"message_start"), "{v}");
    assert_eq!(kinds.last(), Some(&"message_stop"), "{v}");
    assert!(kinds.contains(&"content_block_start") && kinds.contains(&"message_delta"));
    assert_eq!(v["stream_blocks"][0], "thinking", "{v}");
    assert!(
        v["stream_text"].as_str().unwrap().contains("simulated"),
        "{v}"
    );
    assert_eq!(v["tool_stop"], "tool_use", "{v}");
    assert_eq!(v["tool_name"], "exec_command");
    assert_eq!(v["tool_input"]["cmd"], "echo hello");
    assert!(v["tool_reply"].as_str().unwrap().contains("hello"), "{v}");
    assert!(v["count"].as_u64().unwrap() > 0);
    assert_eq!(v["bad_key"], "authentication_error", "{v}");
    let recs = gw.requests(10).await;
    let doors: Vec<_> = recs
        .iter()
        .filter(|r| r["path"] == "/v1/messages")
        .collect();
    assert_eq!(
        doors.len(),
        4,
        "count_tokens and the refused key touch no account"
    );
    assert!(
        doors
            .iter()
            .all(|r| r["outcome"] == "success" && r["model"] == "gpt-5.5")
    );
    assert!(
        doors
            .iter()
            .any(|r| r["attempts"].as_array().unwrap().len() == 2),
        "one failed over"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_generates_and_edits_images_while_an_account_fails() {
    let gw = Gw::start(2).await;
    let first = gw.rr_order()[0].clone();
    gw.fault(&first, FaultKind::ServerError { status: 503 }, Some(1));
    let v = python_script("openai_images.py", &[&gw.url("/v1"), &gw.key]).await;
    assert_eq!(v["generated_png"], true, "{v}");
    assert!(
        v["revised_prompt"].as_str().unwrap().contains("lighthouse"),
        "{v}"
    );
    assert_eq!(v["edited_png"], true, "{v}");
    assert!(v["edit_prompt"].as_str().unwrap().contains("boat"), "{v}");
    assert_eq!(v["small"], "unsupported_value", "{v}");
    // The edit reached the backend with the image as an input image.
    let sent: Vec<_> = gw
        .sim
        .sim
        .all_requests()
        .into_iter()
        .filter(|r| r.body["tools"][0]["type"] == "image_generation")
        .collect();
    assert!(
        sent.iter()
            .any(|r| r.body["input"][0]["content"][1]["type"] == "input_image"),
        "{sent:?}"
    );
    let recs = gw.requests(10).await;
    let paths: Vec<&str> = recs.iter().filter_map(|r| r["path"].as_str()).collect();
    assert!(
        paths.contains(&"/v1/images/generations") && paths.contains(&"/v1/images/edits"),
        "{paths:?}"
    );
    assert!(recs.iter().all(|r| r["outcome"] == "success"));
}

fn claude_code() -> PathBuf {
    tool(
        "SWITCHYARD_TEST_CLAUDE",
        ".ci/.node/node_modules/.bin/claude",
        None,
    )
}

fn every_claude_on_the_pool(c: &mut switchyard::config::Config) {
    c.front_doors.anthropic.default = Some("gpt-5.5".into());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_runs_a_tool_turn_on_the_pool() {
    let gw = Gw::start_with(2, every_claude_on_the_pool).await;
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(claude_code());
    cmd.args([
        "-p",
        "run: echo hello",
        "--allowedTools",
        "Bash",
        "--output-format",
        "json",
    ])
    .current_dir(home.path())
    .env_clear()
    .env("PATH", std::env::var("PATH").unwrap_or_default())
    .env("HOME", home.path())
    .env("ANTHROPIC_BASE_URL", gw.url(""))
    .env("ANTHROPIC_API_KEY", &gw.key)
    .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    .env("DISABLE_AUTOUPDATER", "1")
    .env("DISABLE_TELEMETRY", "1");
    let out = run(cmd).await;
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "claude failed:\n{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(said.trim()).unwrap_or(Value::Null);
    assert!(
        v["result"].as_str().unwrap_or("").contains("hello"),
        "{said}"
    );
    // It reached the backend as Messages turns: the command, then its output.
    let sent = gw.sim.sim.all_requests();
    assert!(
        sent.iter().any(|r| r.body["input"]
            .as_array()
            .is_some_and(|i| i.iter().any(|x| x["type"] == "function_call_output"))),
        "the tool's output went back"
    );
    let recs = gw.requests(20).await;
    assert!(recs.iter().any(|r| r["path"] == "/v1/messages"));
}
