//! Rate-limit reset credits spent by the autopilot when the pool is dry: once per need, once
//! for many concurrent needs, never twice across a timeout or a restart, never on an account
//! with a single window.

use std::time::Duration;

use crate::common::gw::{Gw, body_plain, until};
use serde_json::Value;
use switchyard::config::Config;
use switchyard::dispatch::credits::Auto;
use switchyard::sim::FaultKind;

const MONTH: Duration = Duration::from_secs(30 * 86_400);

fn when_dry(c: &mut Config) {
    c.credits.auto = Auto::WhenDry;
}

fn when_dry_short_timeout(c: &mut Config) {
    c.credits.auto = Auto::WhenDry;
    c.credits.consume_timeout = Duration::from_millis(300);
}

/// The consume calls the simulator got for an account, with their redeem ids.
fn consumes(gw: &Gw, account: &str) -> Vec<String> {
    gw.sim
        .sim
        .all_requests()
        .into_iter()
        .filter(|r| r.account_id.as_deref() == Some(account))
        .filter(|r| r.path.ends_with("/rate-limit-reset-credits/consume"))
        .map(|r| {
            r.body["redeem_request_id"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

fn available(gw: &Gw, account: &str) -> u64 {
    gw.sim.sim.reset_credits(account).unwrap()["available_count"]
        .as_u64()
        .unwrap()
}

/// Both accounts' 5-hour windows spent; `credits` banked on the second one.
fn dry_pool(gw: &Gw, credits: u32) -> (String, String) {
    let order = gw.rr_order();
    let (a, b) = (order[0].clone(), order[1].clone());
    for id in [&a, &b] {
        assert!(gw.sim.sim.set_usage(id, 100.0, 40.0));
    }
    gw.sim.sim.grant_credits(&b, credits, MONTH).unwrap();
    (a, b)
}

#[tokio::test]
async fn a_dry_pool_spends_one_credit_and_the_request_is_served() {
    let gw = Gw::start_with(2, when_dry).await;
    let (a, b) = dry_pool(&gw, 2);
    let sse = gw.stream(&body_plain("gpt-5.5", "hi", true), &[]).await;
    assert_eq!(sse.status, 200, "{}", sse.body);
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    assert_eq!(consumes(&gw, &b).len(), 1);
    assert!(consumes(&gw, &a).is_empty(), "the account with no credit");
    assert_eq!(available(&gw, &b), 1);
    // The request that needed it names the spend; the account is back.
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["outcome"], "success", "{rec}");
    assert_eq!(rec["credit_spend"]["outcome"], "reset", "{rec}");
    assert_eq!(rec["credit_spend"]["windows_reset"], 1);
    assert_eq!(gw.account(&b).await["state"], "ready");
    assert!(
        gw.metrics_text()
            .await
            .contains("switchyard_credit_spends_total{outcome=\"reset\"} 1\n")
    );
    // The next request needs no credit.
    let again = gw.stream(&body_plain("gpt-5.5", "again", true), &[]).await;
    assert_eq!(again.last().0, "response.completed");
    assert_eq!(consumes(&gw, &b).len(), 1);
    // The report lists the spend with the request it served.
    let dir = gw.dir.clone();
    let out = tokio::task::spawn_blocking(move || crate::common::cli(&dir, &["report"]))
        .await
        .unwrap();
    let text = crate::common::stdout(&out);
    let line = text
        .lines()
        .find(|l| l.contains("(when_dry): reset"))
        .unwrap_or_else(|| panic!("no spend in:\n{text}"));
    assert!(line.contains(rec["id"].as_str().unwrap()), "{line}");
}

#[tokio::test]
async fn twenty_concurrent_requests_on_a_dry_pool_share_one_spend() {
    let gw = Gw::start_with(2, when_dry).await;
    let (_, b) = dry_pool(&gw, 3);
    let tasks: Vec<_> = (0..20)
        .map(|i| gw.spawn_stream(body_plain("gpt-5.5", &format!("burst {i}"), true)))
        .collect();
    for t in tasks {
        let sse = t.await.unwrap();
        assert_eq!(sse.last().0, "response.completed", "{}", sse.body);
    }
    assert_eq!(consumes(&gw, &b).len(), 1, "one spend for every need");
    assert_eq!(available(&gw, &b), 2);
    let spent: Vec<Value> = gw
        .requests(20)
        .await
        .into_iter()
        .filter(|r| !r["credit_spend"].is_null())
        .collect();
    assert_eq!(spent.len(), 1, "one record names the spend");
}

#[tokio::test]
async fn a_consume_that_times_out_is_asked_again_with_its_id_never_another() {
    let gw = Gw::start_with(2, when_dry_short_timeout).await;
    let (_, b) = dry_pool(&gw, 2);
    // The backend spends the credit but answers after the gateway stopped waiting.
    gw.fault(&b, FaultKind::SlowConsume { ms: 1_500 }, Some(1));
    let first = gw.stream(&body_plain("gpt-5.5", "hi", true), &[]).await;
    assert_eq!(first.status, 429, "{}", first.body);
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["credit_spend"]["outcome"], "unsettled", "{rec}");
    let redeem = rec["credit_spend"]["redeem_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(available(&gw, &b), 1, "the slow consume did spend one");
    // The next need settles that spend with the same redeem id: no second credit goes.
    let second = gw.stream(&body_plain("gpt-5.5", "again", true), &[]).await;
    assert_eq!(second.last().0, "response.completed", "{}", second.body);
    let ids = consumes(&gw, &b);
    assert!(ids.len() >= 2, "{ids:?}");
    assert!(ids.iter().all(|id| *id == redeem), "{ids:?}");
    assert_eq!(available(&gw, &b), 1);
    // Settled by this request's need, or by the poller before it came.
    let rec = &gw.requests(1).await[0];
    assert!(
        rec["credit_spend"].is_null() || rec["credit_spend"]["outcome"] == "already_redeemed",
        "{rec}"
    );
}

#[tokio::test]
async fn a_restart_in_the_middle_of_a_consume_never_spends_a_second_credit() {
    let mut gw = Gw::start_with(2, when_dry).await;
    let (_, b) = dry_pool(&gw, 2);
    // A consume that is carried out but not answered before the gateway is stopped.
    gw.fault(&b, FaultKind::SlowConsume { ms: 60_000 }, Some(1));
    let pending = gw.spawn_stream(body_plain("gpt-5.5", "hi", true));
    let sim = gw.sim.sim.clone();
    let b2 = b.clone();
    until("the consume to reach the backend", || {
        let n = sim
            .all_requests()
            .iter()
            .filter(|r| r.account_id.as_deref() == Some(b2.as_str()))
            .filter(|r| r.path.ends_with("/consume"))
            .count();
        std::future::ready(n == 1)
    })
    .await;
    gw.restart_fast().await;
    drop(pending);
    assert_eq!(available(&gw, &b), 1, "the cut consume did spend one");
    let sse = gw.stream(&body_plain("gpt-5.5", "after", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{}", sse.body);
    let ids = consumes(&gw, &b);
    assert!(ids.len() >= 2, "settled by asking again: {ids:?}");
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(available(&gw, &b), 1, "no second credit");
}

#[tokio::test]
async fn a_single_window_account_is_never_consumed_on() {
    let gw = Gw::start_with(2, when_dry).await;
    let order = gw.rr_order();
    let (a, b) = (order[0].clone(), order[1].clone());
    assert!(gw.sim.sim.set_single_window(&a, true));
    for id in [&a, &b] {
        assert!(gw.sim.sim.set_usage(id, 100.0, 40.0));
    }
    gw.sim.sim.grant_credits(&a, 2, MONTH).unwrap();
    let sse = gw.stream(&body_plain("gpt-5.5", "hi", true), &[]).await;
    assert_eq!(sse.status, 429, "{}", sse.body);
    assert!(sse.body.contains("usage_limit_reached"), "{}", sse.body);
    assert!(consumes(&gw, &a).is_empty());
    assert!(consumes(&gw, &b).is_empty());
    assert_eq!(available(&gw, &a), 2);
}

#[tokio::test]
async fn with_the_autopilot_off_a_dry_pool_spends_nothing() {
    let gw = Gw::start(2).await;
    let (_, b) = dry_pool(&gw, 1);
    let sse = gw.stream(&body_plain("gpt-5.5", "hi", true), &[]).await;
    assert_eq!(sse.status, 429, "{}", sse.body);
    assert!(consumes(&gw, &b).is_empty());
    assert_eq!(available(&gw, &b), 1);
}

#[tokio::test]
async fn an_operator_resets_a_spent_window_from_the_command_line() {
    let gw = Gw::start(2).await;
    let (a, b) = dry_pool(&gw, 1);
    let dir = gw.dir.clone();
    let run = |args: Vec<String>| {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            crate::common::cli(&dir, &args)
        })
    };
    // Without --yes and without a terminal to confirm on, nothing is spent.
    let out = run(vec![
        "account".into(),
        "reset-window".into(),
        gw.ids[&b].clone(),
    ])
    .await
    .unwrap();
    assert!(!out.status.success());
    assert!(crate::common::stderr(&out).contains("not confirmed"));
    assert_eq!(available(&gw, &b), 1);
    // An account whose windows are not spent is refused, nothing spent.
    assert!(gw.sim.sim.set_usage(&a, 10.0, 10.0));
    gw.sim.sim.grant_credits(&a, 1, MONTH).unwrap();
    let out = run(vec![
        "account".into(),
        "reset-window".into(),
        gw.ids[&a].clone(),
        "--yes".into(),
    ])
    .await
    .unwrap();
    assert!(!out.status.success());
    assert!(
        crate::common::stderr(&out).contains("not spent"),
        "{}",
        crate::common::stderr(&out)
    );
    assert_eq!(available(&gw, &a), 1);
    assert!(consumes(&gw, &a).is_empty());
    // The spent one is reset.
    let out = run(vec![
        "account".into(),
        "reset-window".into(),
        gw.ids[&b].clone(),
        "--yes".into(),
    ])
    .await
    .unwrap();
    let said = crate::common::stdout(&out);
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    assert!(said.contains("reset 1 usage window "), "{said}");
    assert_eq!(available(&gw, &b), 0);
    assert_eq!(consumes(&gw, &b).len(), 1);
}

fn before_expiry(c: &mut Config) {
    c.credits.auto = Auto::BeforeExpiry;
}

#[tokio::test]
async fn a_credit_that_would_lapse_before_its_window_resets_is_spent() {
    let gw = Gw::start_with(1, before_expiry).await;
    let a = gw.rr_order()[0].clone();
    assert!(gw.sim.sim.set_usage(&a, 100.0, 40.0));
    // It expires in an hour; the spent 5-hour window resets later than that.
    gw.sim
        .sim
        .grant_credits(&a, 1, Duration::from_secs(3600))
        .unwrap();
    let sse = gw.stream(&body_plain("gpt-5.5", "hi", true), &[]).await;
    assert_eq!(sse.status, 429, "not when_dry: the request gets its answer");
    assert_eq!(gw.account(&a).await["state"], "cooling");
    assert!(consumes(&gw, &a).is_empty());
    // The poller reads the credit, sees it would lapse, and spends it.
    let sim = gw.sim.sim.clone();
    let a2 = a.clone();
    until("the credit to be spent", || {
        let n = sim
            .reset_credits(&a2)
            .map_or(1, |l| l["available_count"].as_u64().unwrap_or(1));
        std::future::ready(n == 0)
    })
    .await;
    assert_eq!(consumes(&gw, &a).len(), 1);
    until("the account to be back", || async {
        gw.account(&a).await["state"] == "ready"
    })
    .await;
    let again = gw.stream(&body_plain("gpt-5.5", "after", true), &[]).await;
    assert_eq!(again.last().0, "response.completed");
}
