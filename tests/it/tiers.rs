//! Service tiers: the client's tier and routing hint reach the backend unchanged; the tier
//! asked for and the one the answer claims are recorded apart and reported as a claim.

use crate::common::gw::{Gw, body_plain};
use serde_json::json;

#[tokio::test]
async fn the_tier_asked_and_the_tier_claimed_are_kept_apart() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    // This account runs priority requests on the default tier, and says so.
    assert!(gw.sim.sim.set_priority_tier(&a, false));
    let mut body = body_plain("gpt-5.5", "fast please", true);
    body["service_tier"] = json!("priority");
    let hint = ("x-codex-routing-hint", "model=gpt-5.5;tier=priority");
    let sse = gw.stream(&body, &[hint]).await;
    assert_eq!(sse.last().0, "response.completed");
    assert_eq!(sse.last().1["response"]["service_tier"], "default");
    let sent = gw.sim.sim.requests(&a).pop().unwrap();
    assert_eq!(sent.body["service_tier"], "priority", "passed unchanged");
    assert_eq!(sent.headers["x-codex-routing-hint"], hint.1);
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["service_tier"], "priority", "{rec}");
    assert_eq!(rec["served_tier"], "default", "{rec}");

    // A raw `fast` is the backend's to refuse; the client gets its answer.
    body["service_tier"] = json!("fast");
    let sse = gw.stream(&body, &[]).await;
    assert_eq!(sse.status, 400, "{}", sse.body);
    assert!(sse.body.contains("service_tier"), "{}", sse.body);
    assert_eq!(gw.account(&a).await["state"], "ready");

    // The report counts tier usage and says what the answer's tier is worth.
    let dir = gw.dir.clone();
    let out = tokio::task::spawn_blocking(move || crate::common::cli(&dir, &["report"]))
        .await
        .unwrap();
    let text = crate::common::stdout(&out);
    assert!(text.contains("not proof of what ran"), "{text}");
    assert!(text.contains("priority → default: 1 requests"), "{text}");
}
