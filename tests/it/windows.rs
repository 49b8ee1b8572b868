//! Error rates over the last 20 and 60 minutes, pool-wide and per account, against a workload
//! whose rates are known: in the admin API, the console's status, and `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use crate::common::gw::{Gw, GwOptions, body_plain};
use axum::http::Method;
use serde_json::{Value, json};
use switchyard::base::clock::{Clock, ManualClock};
use switchyard::config::Config;
use switchyard::sim::FaultKind;

/// A 503 fails over without cooling anything (a session-scoped rule, and no session), so a
/// workload can hold upstream errors at known places.
fn soft_overload(c: &mut Config) {
    #[derive(serde::Deserialize)]
    struct Rules {
        rules: Vec<switchyard::fleet::rules::Rule>,
    }
    c.rules = toml::from_str::<Rules>(
        "[[rules]]\nname = \"soft overload\"\ncode = \"server_is_overloaded\"\nscope = \"session\"\n",
    )
    .unwrap()
    .rules;
}

fn rates(v: &Value, minutes: u64) -> (Option<f64>, Option<f64>, u64, u64) {
    let r = v["error_rates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["window_minutes"] == minutes)
        .unwrap_or_else(|| panic!("no {minutes}m window in {v}"));
    (
        r["client_error_rate"].as_f64(),
        r["upstream_error_rate"].as_f64(),
        r["requests"].as_u64().unwrap(),
        r["attempts"].as_u64().unwrap(),
    )
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_and_sixty_minute_rates_match_a_known_workload() {
    let clock = ManualClock::new(switchyard::base::clock::SystemClock.now_ms());
    let gw = Gw::start_opts(GwOptions {
        accounts: 2,
        clock: Arc::new(clock.clone()),
        configure: soft_overload,
        ..Default::default()
    })
    .await;
    let order = gw.rr_order();
    let (a, b) = (order[0].clone(), order[1].clone());
    // A goes first every time.
    gw.admin_call(
        Method::PUT,
        &format!("/api/admin/accounts/{}", gw.ids[&a]),
        Some(json!({"priority": -1})),
    )
    .await;
    let sse = || async {
        let s = gw.stream(&body_plain("gpt-5.5", "q", true), &[]).await;
        s.status
    };

    // 40 minutes ago: three failovers, a caller error, two plain successes.
    gw.fault(&a, FaultKind::ServerError { status: 503 }, Some(3));
    for _ in 0..3 {
        assert_eq!(sse().await, 200);
    }
    gw.fault(
        &a,
        FaultKind::UnsupportedParameter {
            param: "temperature".into(),
        },
        Some(1),
    );
    assert_eq!(sse().await, 400);
    for _ in 0..2 {
        assert_eq!(sse().await, 200);
    }
    clock.advance(Duration::from_secs(40 * 60));
    // Now: one failover, three successes, and a key refusal that never reached the pool.
    gw.fault(&a, FaultKind::ServerError { status: 503 }, Some(1));
    for _ in 0..4 {
        assert_eq!(sse().await, 200);
    }
    let (_, narrow) = gw.make_key("narrow", json!({"models": ["gpt-5.4"]})).await;
    let refused = gw
        .http
        .post(gw.url("/v1/responses"))
        .header("authorization", format!("Bearer {narrow}"))
        .json(&body_plain("gpt-5.5", "q", true))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    for acct in gw.accounts().await {
        assert_eq!(acct["state"], "ready", "nothing cooled: {acct}");
    }

    // Pool-wide: per request.
    let status = gw.status().await;
    let (c20, u20, n20, t20) = rates(&status, 20);
    assert_eq!((n20, t20), (4, 5));
    assert!(close(c20, 0.0) && close(u20, 0.25), "{status}");
    let (c60, u60, n60, t60) = rates(&status, 60);
    assert_eq!((n60, t60), (10, 14));
    assert!(close(c60, 0.1) && close(u60, 0.4), "{status}");

    // Per account: the client rate over the requests that ended there, the upstream rate
    // over its attempts.
    let va = gw.account(&a).await;
    let (c, u, n, t) = rates(&va, 20);
    assert_eq!((n, t), (3, 4));
    assert!(close(c, 0.0) && close(u, 0.25), "{va}");
    let (c, u, n, t) = rates(&va, 60);
    assert_eq!((n, t), (6, 10));
    assert!(close(c, 1.0 / 6.0) && close(u, 0.4), "{va}");
    let vb = gw.account(&b).await;
    let (c, u, n, t) = rates(&vb, 60);
    assert_eq!((n, t), (4, 4));
    assert!(close(c, 0.0) && close(u, 0.0), "{vb}");

    // The same as gauges.
    let m = gw.metrics_text().await;
    for line in [
        "switchyard_client_error_rate{window=\"20m\"} 0\n",
        "switchyard_upstream_error_rate{window=\"20m\"} 0.25\n",
        "switchyard_client_error_rate{window=\"60m\"} 0.1\n",
        "switchyard_upstream_error_rate{window=\"60m\"} 0.4\n",
        &format!("switchyard_account_upstream_error_rate{{account=\"{a}\",window=\"60m\"}} 0.4\n"),
        &format!("switchyard_account_upstream_error_rate{{account=\"{b}\",window=\"20m\"}} 0\n"),
    ] {
        assert!(m.contains(line), "{line} not in:\n{m}");
    }

    // A restart carries the windows on from the stored records.
    let mut gw = gw;
    gw.restart().await;
    let status = gw.status().await;
    assert_eq!(rates(&status, 20).2, 4, "{status}");
    assert!(close(rates(&status, 60).1, 0.4), "{status}");

    // An hour later both windows are empty again.
    clock.advance(Duration::from_secs(61 * 60));
    let status = gw.status().await;
    assert_eq!(rates(&status, 60).2, 0);
    assert_eq!(rates(&status, 60).0, None);
}
