//! `switchyard report` on a workload whose every section has a known answer, in JSON and in
//! text, through the daemon and read straight from the store once it has stopped.

use std::sync::Arc;
use std::time::Duration;

use crate::common::gw::{Gw, GwOptions, body_plain};
use crate::common::{cli, stderr, stdout};
use axum::http::Method;
use serde_json::{Value, json};
use switchyard::base::clock::{Clock, ManualClock};
use switchyard::sim::FaultKind;

async fn report(gw_dir: std::path::PathBuf, format: &str) -> String {
    let format = format.to_string();
    tokio::task::spawn_blocking(move || {
        let out = cli(&gw_dir, &["report", "--format", &format, "--slow", "200ms"]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    })
    .await
    .unwrap()
}

fn window(r: &Value, minutes: u64) -> &Value {
    r["windows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["minutes"] == minutes)
        .unwrap()
}

fn failures(w: &Value, account: &str) -> Vec<(String, Option<u64>, u64)> {
    let a = w["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["account"] == account)
        .unwrap_or_else(|| panic!("no {account} in {w}"));
    a["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["class"].as_str().unwrap().to_string(),
                f["status"].as_u64(),
                f["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_finds_every_section_of_a_known_workload() {
    let real_now = switchyard::base::clock::SystemClock.now_ms();
    let clock = ManualClock::new(real_now - 50 * 60_000);
    let mut gw = Gw::start_opts(GwOptions {
        accounts: 2,
        clock: Arc::new(clock.clone()),
        ..Default::default()
    })
    .await;
    let order = gw.rr_order();
    let (a, b) = (order[0].clone(), order[1].clone());
    let label = |acct: &str| format!("sim{}@example.com", &acct[acct.len() - 1..]);
    let (la, lb) = (label(&a), label(&b));
    // A goes first every time.
    let a_id = gw.ids[&a].clone();
    gw.admin_call(
        Method::PUT,
        &format!("/api/admin/accounts/{a_id}"),
        Some(json!({"priority": -1})),
    )
    .await;
    let status = |model: &'static str| {
        let gw = &gw;
        async move { gw.stream(&body_plain(model, "q", true), &[]).await }
    };

    // 50 minutes ago: two successes and a caller's error.
    for _ in 0..2 {
        assert_eq!(status("gpt-5.5").await.status, 200);
    }
    gw.fault(
        &a,
        FaultKind::UnsupportedParameter {
            param: "temperature".into(),
        },
        Some(1),
    );
    assert_eq!(status("gpt-5.5").await.status, 400);
    clock.advance(Duration::from_secs(40 * 60));

    // The last few minutes: a model no account serves...
    gw.fault(&a, FaultKind::ModelUnsupported, Some(1));
    gw.fault(&b, FaultKind::ModelUnsupported, Some(1));
    assert_eq!(status("gpt-9-test").await.status, 404);
    // ...three overloads of A, each saved by B (A climbs its ladder)...
    for wait in [0, 31, 121] {
        clock.advance(Duration::from_secs(wait));
        gw.fault(&a, FaultKind::ServerError { status: 503 }, Some(1));
        let s = status("gpt-5.5").await;
        assert_eq!(s.last().0, "response.completed", "{:?}", s.kinds());
    }
    // ...a stream that broke after it began (on B: A cools)...
    gw.fault(&b, FaultKind::ResetMidStream { after_deltas: 2 }, Some(1));
    let broken = status("gpt-5.5").await;
    assert_eq!(
        broken.last().1["response"]["error"]["code"],
        "upstream_stream_error"
    );
    // ...and, B half-open again, a slow 502 that leaves nothing to try.
    clock.advance(Duration::from_secs(31));
    gw.fault(
        &b,
        FaultKind::SlowServerError {
            status: 502,
            ms: 300,
        },
        Some(1),
    );
    assert_eq!(status("gpt-5.5").await.status, 503);

    let r: Value = serde_json::from_str(&report(gw.dir.clone(), "json").await).unwrap();
    let w20 = window(&r, 20);
    let want = json!({
        "requests": 6, "client_errors": 3, "upstream_errors": 7,
        "failovers": 4, "failovers_saved": 3, "exhausted": 1,
    });
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&w20[k], v, "20m {k}: {w20}");
    }
    assert_eq!(w20["client_error_rate"], 0.5);
    assert_eq!(
        w20["exhaustion_chains"],
        json!([{"chain": format!("{lb} 502 transient → none left"), "count": 1,
                "requests": w20["exhaustion_chains"][0]["requests"].clone()}])
    );
    assert_eq!(
        w20["model_not_found"],
        json!([{"model": "gpt-9-test", "count": 1}])
    );
    let post = w20["post_commit_failures"].as_array().unwrap();
    assert_eq!(post.len(), 1);
    assert_eq!(post[0]["outcome"], "stream_error");
    assert_eq!(post[0]["account"], lb.as_str());
    let slow = w20["slow_failures"].as_array().unwrap();
    assert_eq!(slow.len(), 1, "{w20}");
    assert_eq!(
        (
            slow[0]["account"].as_str(),
            slow[0]["failed_over"].as_bool()
        ),
        (Some(lb.as_str()), Some(false))
    );
    assert!(slow[0]["ms"].as_u64().unwrap() >= 300);
    let mut fa = failures(w20, &la);
    fa.sort();
    assert_eq!(
        fa,
        [
            ("model_unsupported".to_string(), Some(400), 1),
            ("transient".to_string(), Some(503), 3)
        ]
    );
    let mut fb = failures(w20, &lb);
    fb.sort();
    assert_eq!(fb.iter().map(|f| f.2).sum::<u64>(), 3, "{fb:?}");
    assert!(
        fb.contains(&("transient".to_string(), Some(502), 1)),
        "{fb:?}"
    );

    let w60 = window(&r, 60);
    for (k, v) in [
        ("requests", 9),
        ("client_errors", 4),
        ("upstream_errors", 7),
        ("failovers", 4),
    ] {
        assert_eq!(w60[k], v, "60m {k}: {w60}");
    }

    // What the numbers suggest: A carried most overloads; A's 503 message has no rule.
    let sug = r["suggestions"].as_array().unwrap();
    let lower = sug.iter().find(|s| s["kind"] == "lower_priority").unwrap();
    assert_eq!(
        lower["action"],
        format!("switchyard account set {a_id} --priority 0")
    );
    assert!(
        lower["text"]
            .as_str()
            .unwrap()
            .contains(&format!("{la} had 3 of the 4 overload errors"))
    );
    let rule = sug.iter().find(|s| s["kind"] == "add_rule").unwrap();
    let toml_text = rule["action"].as_str().unwrap();
    assert!(toml_text.contains("status = [503]"), "{toml_text}");
    assert!(
        toml_text.contains("code = \"server_is_overloaded\""),
        "{toml_text}"
    );
    // The suggested rule is one `config check` accepts, and it matches the answers it was
    // made from.
    #[derive(serde::Deserialize)]
    struct Rules {
        rules: Vec<switchyard::fleet::rules::Rule>,
    }
    let suggested = toml::from_str::<Rules>(toml_text).unwrap().rules.remove(0);
    let answer = switchyard::upstream::failure::Facts {
        status: Some(503),
        error_code: Some("server_is_overloaded".into()),
        message: Some("Our servers are currently overloaded. Please try again later.".into()),
        ..Default::default()
    };
    assert!(suggested.matches(&answer, "gpt-5.5"), "{toml_text}");

    // The same as text.
    let text = report(gw.dir.clone(), "text").await;
    for line in [
        "== last 20 minutes ==",
        "requests 6 · client errors 3 (50.0%) · upstream errors 7 (116.7% per request)",
        "failovers 4 · saved 3 (75.0%)",
        &format!("1× {lb} 502 transient → none left"),
        "1× gpt-9-test: no account supports gpt-9-test: fix the client's config, do not map it",
        "failures after the answer began: 1",
        "failures slower than 0.2 s: 1",
        &format!("{la}: 4 attempts, 4 failed"),
        "3× transient 503 server_is_overloaded",
        "== last 60 minutes ==",
        "== suggestions ==",
        &format!("switchyard account set {a_id} --priority 0"),
    ] {
        assert!(text.contains(line), "`{line}` missing from:\n{text}");
    }

    // Read from the store once the daemon has stopped: the same figures.
    gw.shutdown().await;
    let direct: Value = serde_json::from_str(&report(gw.dir.clone(), "json").await).unwrap();
    for minutes in [20, 60] {
        let (d, w) = (window(&direct, minutes), window(&r, minutes));
        for k in [
            "requests",
            "client_errors",
            "upstream_errors",
            "failovers",
            "exhausted",
        ] {
            assert_eq!(d[k], w[k], "{minutes}m {k}");
        }
    }
}
