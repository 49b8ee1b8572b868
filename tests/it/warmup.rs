//! Warm-up: at the configured time (on the test clock), exactly one minimal request per
//! eligible account — never one whose window runs or that is cooling.

use std::sync::Arc;

use crate::common::gw::{Gw, GwOptions, body_plain, until};
use switchyard::base::clock::{Clock, ManualClock};
use switchyard::config::Config;
use switchyard::sim::{Fault, FaultKind};

fn at_seven(c: &mut Config) {
    c.warmup.at = vec!["07:00".into()];
    c.warmup.utc_offset = Some("+00:00".into());
}

/// The warm-up (probe) requests an account got.
fn pings(gw: &Gw, account: &str) -> usize {
    gw.sim
        .sim
        .requests(account)
        .iter()
        .filter(|r| r.body["input"][0]["content"][0]["text"] == "ping")
        .count()
}

#[tokio::test]
async fn at_its_time_each_idle_ready_account_gets_one_request() {
    // The test starts the day at least an hour away from 07:00 UTC: a start within the
    // slot's half-hour grace would fire that day's warm-up before the accounts are set up.
    let real = switchyard::base::clock::SystemClock.now_ms();
    let since_seven = (real + 17 * 3_600_000) % 86_400_000; // ms past the last 07:00 UTC
    let start = if since_seven < 3_600_000 {
        real + 3_600_000
    } else {
        real
    };
    let clock = ManualClock::new(start);
    let gw = Gw::start_opts(GwOptions {
        accounts: 3,
        configure: at_seven,
        clock: Arc::new(clock.clone()),
        ..Default::default()
    })
    .await;
    let order = gw.rr_order();
    let (cooling, idle, running) = (order[0].clone(), order[1].clone(), order[2].clone());
    // The first account cools on quota (its request moves to the second one).
    assert!(gw.sim.sim.push_fault(
        &cooling,
        Fault::always(FaultKind::Quota {
            resets_in_seconds: 3 * 86_400
        })
    ));
    let sse = gw.stream(&body_plain("gpt-5.5", "hi", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed");
    assert_eq!(gw.account(&cooling).await["state"], "cooling");
    assert!(gw.sim.sim.set_usage(&idle, 0.0, 10.0));
    assert!(gw.sim.sim.set_usage(&running, 35.0, 10.0));

    // Just past the next 07:00 UTC.
    let now = clock.now_ms();
    let day = 86_400_000;
    let seven = now - now % day + 7 * 3_600_000;
    let next = if seven > now { seven } else { seven + day };
    clock.set_ms(next + 10_000);
    until("the warm-up of the idle account", || {
        std::future::ready(pings(&gw, &idle) == 1)
    })
    .await;
    until("its record in /metrics", || async {
        gw.metrics_text()
            .await
            .contains("switchyard_warmups_total{class=\"success\"} 1\n")
    })
    .await;
    assert_eq!(pings(&gw, &running), 0, "its window runs");
    assert_eq!(pings(&gw, &cooling), 0, "it cools");

    // The next day's, once more, for the account that is idle again.
    assert!(gw.sim.sim.set_usage(&idle, 0.0, 10.0));
    clock.set_ms(next + day + 10_000);
    until("the next day's warm-up", || {
        std::future::ready(pings(&gw, &idle) == 2)
    })
    .await;
    until("its record in /metrics", || async {
        gw.metrics_text()
            .await
            .contains("switchyard_warmups_total{class=\"success\"} 2\n")
    })
    .await;
    assert_eq!(pings(&gw, &idle), 2, "one per day");
    assert_eq!(pings(&gw, &running), 0);
    assert_eq!(pings(&gw, &cooling), 0);
}
