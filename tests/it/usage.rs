//! Usage accounting end to end: `switchyard usage` totals equal the sum of the request records
//! on a generated workload, for every grouping and format; usage and budgets survive a SIGKILL
//! of the real daemon.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common;
use crate::common::gw::{Gw, body, read_sse};
use crate::common::{Daemon, DaemonOptions, SIGNAL_DEADLINE, cli, http_tcp, stderr, stdout};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard::sim::{Fault, FaultKind, Sim, SimOptions};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The counters a report row and a group of records are compared on.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Sums {
    requests: u64,
    errors: u64,
    input: u64,
    cached: u64,
    output: u64,
    reasoning: u64,
    duration_ms: u64,
}

impl Sums {
    fn of_row(r: &Value) -> Sums {
        let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
        Sums {
            requests: n("requests"),
            errors: n("errors"),
            input: n("input_tokens"),
            cached: n("cached_tokens"),
            output: n("output_tokens"),
            reasoning: n("reasoning_tokens"),
            duration_ms: n("duration_ms"),
        }
    }

    fn add_record(&mut self, r: &Value) {
        let u = |k: &str| r["usage"][k].as_u64().unwrap_or(0);
        self.requests += 1;
        let quiet = [
            "success",
            "incomplete",
            "client_cancelled",
            "client_stalled",
        ];
        self.errors += u64::from(!quiet.contains(&r["outcome"].as_str().unwrap()));
        self.input += u("input_tokens");
        self.cached += u("cached_tokens");
        self.output += u("output_tokens");
        self.reasoning += u("reasoning_tokens");
        self.duration_ms += r["duration_ms"].as_u64().unwrap();
    }
}

async fn ws_turns(gw: &Gw, key: &str, models: &[&str]) {
    let mut req = format!("ws://{}/v1/responses", gw.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    for model in models {
        let frame =
            json!({"type": "response.create", "model": model, "input": "hi", "store": false});
        ws.send(Message::Text(frame.to_string().into()))
            .await
            .unwrap();
        loop {
            let next = tokio::time::timeout(std::time::Duration::from_secs(30), ws.next()).await;
            let Ok(Some(Ok(msg))) = next else {
                let accts: Vec<String> = gw
                    .accounts()
                    .await
                    .iter()
                    .map(|a| {
                        format!(
                            "{} {} {} {}/{} w{}",
                            a["chatgpt_account_id"],
                            a["state"],
                            a["reason"],
                            a["in_flight"],
                            a["limit"],
                            a["waiting"]
                        )
                    })
                    .collect();
                let status = gw.status().await;
                let recs: Vec<String> = gw
                    .requests(5)
                    .await
                    .iter()
                    .map(|r| {
                        format!(
                            "{} {} {} {}",
                            r["key"], r["model"], r["outcome"], r["transport"]
                        )
                    })
                    .collect();
                panic!(
                    "turn {model} of {key}: no terminal frame: {next:?}\n{accts:#?}\n{status}\n{recs:#?}"
                );
            };
            let Message::Text(t) = msg else {
                continue;
            };
            let v: Value = serde_json::from_str(&t).unwrap();
            if matches!(
                v["type"].as_str(),
                Some("response.completed" | "response.failed" | "error")
            ) {
                break;
            }
        }
    }
}

/// Runs the CLI off the runtime (the gateway it talks to runs on it).
async fn run_cli(dir: &Path, args: &[&str]) -> String {
    let dir = dir.to_path_buf();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&dir, &args)
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

/// The report's rows by their group values joined with `|`.
fn rows_by_group(report: &Value, by: &[&str]) -> BTreeMap<String, Sums> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let g: Vec<&str> = by.iter().map(|k| r[*k].as_str().unwrap()).collect();
            (g.join("|"), Sums::of_row(r))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_totals_equal_the_records_for_every_grouping_and_format() {
    let gw = Gw::start(3).await;
    let alpha = gw.make_key("alpha", json!({})).await.1;
    let beta = gw
        .make_key("beta", json!({"models": ["gpt-5.5"], "rpm": 2}))
        .await
        .1;
    let accts: Vec<String> = gw.ids.keys().cloned().collect();
    // Failures of several kinds: a failover, a caller error, a stream cut after output.
    let push = |i: usize, kind: FaultKind| {
        assert!(gw.sim.sim.push_fault(
            &accts[i],
            Fault {
                kind,
                times: Some(1)
            }
        ));
    };
    push(
        0,
        FaultKind::Quota {
            resets_in_seconds: 1,
        },
    );
    push(
        1,
        FaultKind::UnsupportedParameter {
            param: "temperature".into(),
        },
    );
    push(2, FaultKind::ResetMidStream { after_deltas: 1 });
    let keys = [gw.key.clone(), alpha.clone(), beta.clone()];
    let models = ["gpt-5.5", "gpt-5.4-mini"];
    let mut sent = 0;
    for i in 0..18 {
        let key = &keys[i % 3];
        let model = models[(i / 3) % 2];
        let stream = i % 2 == 0;
        let resp = gw
            .http
            .post(gw.url("/v1/responses"))
            .header("authorization", format!("Bearer {key}"))
            .json(&body(model, &format!("question {i}"), stream))
            .send()
            .await
            .unwrap();
        if stream && resp.status().is_success() {
            read_sse(resp).await;
        } else {
            resp.bytes().await.unwrap();
        }
        sent += 1;
    }
    ws_turns(&gw, &alpha, &["gpt-5.5", "gpt-5.4-mini", "gpt-5.5"]).await;
    ws_turns(&gw, &beta, &["gpt-5.4-mini", "gpt-5.5"]).await;
    sent += 5;

    let records = gw.requests(1000).await;
    assert_eq!(records.len(), sent);
    let outcomes: std::collections::BTreeSet<&str> = records
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    // The workload has successes, upstream failures and refusals alike.
    for o in [
        "success",
        "caller_error",
        "model_not_allowed",
        "key_rate_limited",
    ] {
        assert!(outcomes.contains(o), "{o} not in {outcomes:?}");
    }
    let emails: BTreeMap<String, String> = gw
        .accounts()
        .await
        .iter()
        .map(|a| {
            (
                a["chatgpt_account_id"].as_str().unwrap().to_string(),
                a["email"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let group_of = |r: &Value, g: &str| -> String {
        let started = r["started_at"].as_str().unwrap();
        match g {
            "key" => r["key"].as_str().unwrap().to_string(),
            "model" => r["model"].as_str().unwrap().to_string(),
            "account" => r["account"]
                .as_str()
                .map_or("(none)".to_string(), |a| emails[a].clone()),
            "day" => started[..10].to_string(),
            "hour" => format!("{}:00Z", &started[..13]),
            _ => unreachable!(),
        }
    };
    let expected = |by: &[&str], only_key: Option<&str>| -> BTreeMap<String, Sums> {
        let mut m: BTreeMap<String, Sums> = BTreeMap::new();
        for r in records
            .iter()
            .filter(|r| only_key.is_none_or(|k| r["key"] == k))
        {
            let g: Vec<String> = by.iter().map(|b| group_of(r, b)).collect();
            m.entry(g.join("|")).or_default().add_record(r);
        }
        m
    };
    let total = expected(&[], None)[""];
    assert!(total.input > 0 && total.output > 0 && total.errors > 0);

    for by in [
        vec!["key"],
        vec!["model"],
        vec!["account"],
        vec!["day"],
        vec!["hour"],
        vec!["key", "model", "account"],
        vec!["day", "key"],
    ] {
        let joined = by.join(",");
        let json_text = run_cli(&gw.dir, &["usage", "--by", &joined, "--format", "json"]).await;
        let report: Value = serde_json::from_str(&json_text).unwrap();
        assert_eq!(
            rows_by_group(&report, &by),
            expected(&by, None),
            "--by {joined}"
        );
        assert_eq!(Sums::of_row(&report["total"]), total, "--by {joined}");

        // CSV: the same rows, one line each, the group columns first.
        let csv = run_cli(&gw.dir, &["usage", "--by", &joined, "--format", "csv"]).await;
        let mut lines = csv.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        assert_eq!(&header[..by.len()], by.as_slice(), "{csv}");
        let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let from_csv: BTreeMap<String, (u64, u64, u64)> = lines
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (
                    f[..by.len()].join("|"),
                    (
                        f[col("requests")].parse().unwrap(),
                        f[col("errors")].parse().unwrap(),
                        f[col("output_tokens")].parse().unwrap(),
                    ),
                )
            })
            .collect();
        let want: BTreeMap<String, (u64, u64, u64)> = expected(&by, None)
            .into_iter()
            .map(|(g, s)| (g, (s.requests, s.errors, s.output)))
            .collect();
        assert_eq!(from_csv, want, "csv --by {joined}");

        // The table: every group, and a total line with the exact sums.
        let table = run_cli(&gw.dir, &["usage", "--by", &joined]).await;
        for g in expected(&by, None).keys() {
            let first = g.split('|').next().unwrap();
            assert!(table.contains(first), "{first} missing from\n{table}");
        }
        let total_line = table.lines().find(|l| l.starts_with("TOTAL")).unwrap();
        let numbers: Vec<u64> = total_line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert_eq!(
            &numbers[..6],
            &[
                total.requests,
                total.errors,
                total.input,
                total.cached,
                total.output,
                total.reasoning
            ],
            "{table}"
        );
    }

    // One key, by id or name.
    let only = run_cli(
        &gw.dir,
        &[
            "usage", "--key", "alpha", "--by", "model", "--format", "json",
        ],
    )
    .await;
    let only: Value = serde_json::from_str(&only).unwrap();
    assert_eq!(
        rows_by_group(&only, &["model"]),
        expected(&["model"], Some("alpha"))
    );

    // A period by dates: today holds everything, yesterday nothing.
    let today = &records[0]["started_at"].as_str().unwrap()[..10];
    let dated = run_cli(
        &gw.dir,
        &["usage", "--from", today, "--to", today, "--format", "json"],
    )
    .await;
    let dated: Value = serde_json::from_str(&dated).unwrap();
    assert_eq!(Sums::of_row(&dated["total"]), total);
    let yesterday = run_cli(
        &gw.dir,
        &["usage", "--from", "2020-01-01", "--to", "2020-01-02"],
    )
    .await;
    assert!(yesterday.contains("no usage in this period"), "{yesterday}");

    // With a price for one model, the cost of that model's tokens.
    let cfg = gw.dir.with_extension("pricing.toml");
    std::fs::write(
        &cfg,
        "[pricing.\"gpt-5.5\"]\ninput = 2.0\ncached_input = 0.5\noutput = 8.0\n",
    )
    .unwrap();
    let priced = run_cli(
        &gw.dir,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "usage",
            "--by",
            "model",
            "--format",
            "json",
        ],
    )
    .await;
    let priced: Value = serde_json::from_str(&priced).unwrap();
    let s = expected(&["model"], None)["gpt-5.5"];
    let want =
        ((s.input - s.cached) as f64 * 2.0 + s.cached as f64 * 0.5 + s.output as f64 * 8.0) / 1e6;
    let row = priced["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["model"] == "gpt-5.5")
        .unwrap();
    assert!(
        (row["cost_usd"].as_f64().unwrap() - want).abs() < 1e-9,
        "{row} vs {want}"
    );
    assert_eq!(priced["unpriced_models"], json!(["gpt-5.4-mini"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_since_a_duration_leaves_out_the_hours_before_it() {
    use std::sync::Arc;
    use std::time::Duration;
    use switchyard::base::clock::{Clock, ManualClock, SystemClock};
    const HOUR: Duration = Duration::from_secs(3600);
    // The gateway's clock starts four hours ago; `usage` counts from the real now.
    let clock = ManualClock::new(SystemClock.now_ms() - 4 * 3_600_000);
    let gw = Gw::start_opts(common::gw::GwOptions {
        accounts: 1,
        clock: Arc::new(clock.clone()),
        ..Default::default()
    })
    .await;
    let ask = |text: &'static str| {
        let gw = &gw;
        async move {
            let (status, _) = gw.json(&body("gpt-5.5", text, false)).await;
            assert_eq!(status, 200);
        }
    };
    ask("four hours ago").await;
    ask("four hours ago, again").await;
    clock.advance(HOUR * 5 / 2);
    ask("ninety minutes ago").await;
    clock.advance(HOUR * 3 / 2);
    ask("now").await;
    ask("now, again").await;

    let records = gw.requests(10).await;
    assert_eq!(records.len(), 5);
    let mut recent = Sums::default();
    for r in &records[..3] {
        recent.add_record(r);
    }
    let mut all = recent;
    for r in &records[3..] {
        all.add_record(r);
    }
    let report = |since: &'static str| {
        let dir = gw.dir.clone();
        async move {
            let text = run_cli(&dir, &["usage", "--since", since, "--format", "json"]).await;
            let v: Value = serde_json::from_str(&text).unwrap();
            Sums::of_row(&v["total"])
        }
    };
    // The last two hours: the three recent requests only.
    let last_two = report("2h").await;
    assert_eq!(last_two, recent);
    assert_eq!(last_two.requests, 3);
    assert!(last_two.input > 0 && last_two.output > 0);
    // Five hours reach back to the first two.
    assert_eq!(report("5h").await, all);
    // The table says so too.
    let table = run_cli(&gw.dir, &["usage", "--since", "2h", "--by", "hour"]).await;
    let total_line = table.lines().find(|l| l.starts_with("TOTAL")).unwrap();
    assert_eq!(total_line.split_whitespace().nth(1), Some("3"), "{table}");
}

#[test]
fn usage_and_budgets_survive_a_sigkill_of_the_daemon() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sim = rt
        .block_on(Sim::start(SimOptions {
            accounts: 1,
            ..SimOptions::default()
        }))
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let cfg = tmp.path().join("switchyard.toml");
    std::fs::write(
        &cfg,
        format!(
            "[upstream]\nbase_url = \"{}\"\nusage_url = \"{}\"\noauth_token_url = \"{}\"\n",
            sim.base_url(),
            sim.usage_url(),
            sim.oauth_token_url()
        ),
    )
    .unwrap();
    let acct = sim.sim.account_ids().remove(0);
    let auth = tmp.path().join("auth.json");
    std::fs::write(&auth, sim.sim.auth_json(&acct).unwrap().to_string()).unwrap();
    let with_cfg = |args: &[&str]| {
        let mut all = vec!["--config", cfg.to_str().unwrap()];
        all.extend_from_slice(args);
        cli(&state, &all)
    };
    assert!(
        with_cfg(&["account", "import", auth.to_str().unwrap()])
            .status
            .success()
    );
    let created = with_cfg(&["key", "create", "daily", "--tokens-per-day", "1"]);
    assert!(created.status.success(), "{}", stderr(&created));
    let key = stdout(&created).trim().to_string();
    let auth_header = format!("Bearer {key}");
    let request = |d: &Daemon| {
        http_tcp(
            d.http,
            "POST",
            "/v1/responses",
            &[
                ("Authorization", auth_header.as_str()),
                ("Content-Type", "application/json"),
            ],
            Some(&body("gpt-5.5", "hello", false).to_string()),
        )
    };
    let start = || {
        Daemon::start_with(
            &state,
            DaemonOptions {
                config: Some(&cfg),
                ..Default::default()
            },
        )
    };

    let daemon = start();
    assert_eq!(request(&daemon).0, 200);
    let refused = request(&daemon);
    assert_eq!(refused.0, 429, "{}", refused.1);
    assert_eq!(refused.json()["error"]["code"], "key_budget_exhausted");
    // Written: two flushes completed after both requests ended, and nothing left to write.
    let metric = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap()
            .parse()
            .unwrap()
    };
    let first = metric(&daemon.get("/metrics").1, "switchyard_usage_flushes_total");
    let deadline = std::time::Instant::now() + SIGNAL_DEADLINE;
    loop {
        let text = daemon.get("/metrics").1;
        if metric(&text, "switchyard_usage_flushes_total") >= first + 2
            && metric(&text, "switchyard_usage_unflushed_buckets") == 0
            && metric(&text, "switchyard_store_unsynced") == 0
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "usage never written:\n{text}"
        );
        std::thread::yield_now();
    }
    daemon.kill9();

    let daemon = start();
    let again = request(&daemon);
    assert_eq!(again.0, 429, "{}", again.1);
    assert_eq!(again.json()["error"]["code"], "key_budget_exhausted");
    let report = with_cfg(&["usage", "--by", "key", "--format", "json"]);
    assert!(report.status.success(), "{}", stderr(&report));
    let report: Value = serde_json::from_str(&stdout(&report)).unwrap();
    // The one that ran and the two refused, one on each side of the kill.
    assert_eq!(report["total"]["requests"], 3, "{report}");
    assert_eq!(report["total"]["errors"], 2, "{report}");
    assert!(report["total"]["output_tokens"].as_u64().unwrap() > 0);
    // The record of the request that ran is durable too, though nothing was written after it
    // (records are committed without an fsync, and made durable within a second on their own).
    let report = with_cfg(&["report", "--format", "json"]);
    assert!(report.status.success(), "{}", stderr(&report));
    let report: Value = serde_json::from_str(&stdout(&report)).unwrap();
    let served: Vec<&Value> = report["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| &w["requests"])
        .collect();
    assert!(served.iter().all(|r| *r == 1), "{report}");
    assert!(daemon.terminate().success());
    rt.block_on(async { sim.stop() });
}
