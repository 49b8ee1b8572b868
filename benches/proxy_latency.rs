#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Added latency of the gateway: the same short SSE turn against the simulator directly and
//! through the gateway, at 1 and 64 concurrent streams, in one run. Prints p50/p99 of time to
//! first byte and of the whole stream, and the gateway's added share as ratios — never
//! asserted, since this machine is shared and noisy.
//!
//! `cargo bench --bench proxy_latency` (env `REQUESTS` to change the count per level).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use switchyard::base::clock;
use switchyard::config::Config;
use switchyard::daemon::systemd::Notifier;
use switchyard::daemon::{self, ShutdownKind};
use switchyard::fleet::Fleet;
use switchyard::keys::KeyRing;
use switchyard::sim::{Sim, SimOptions};
use switchyard::store::Store;

struct Target {
    name: &'static str,
    url: String,
    headers: Vec<(String, String)>,
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[idx.min(v.len() - 1)]
}

async fn one(client: &reqwest::Client, t: &Target, body: &Value) -> (Duration, Duration, usize) {
    let start = Instant::now();
    let mut req = client.post(&t.url).json(body);
    for (k, v) in &t.headers {
        req = req.header(k, v);
    }
    let resp = req.send().await.expect("request");
    assert!(resp.status().is_success(), "{}: {}", t.name, resp.status());
    let mut s = resp.bytes_stream();
    let mut ttfb = None;
    let mut bytes = 0;
    while let Some(c) = s.next().await {
        let c = c.expect("chunk");
        ttfb.get_or_insert_with(|| start.elapsed());
        bytes += c.len();
    }
    (ttfb.unwrap_or_default(), start.elapsed(), bytes)
}

async fn level(
    client: &reqwest::Client,
    t: &Arc<Target>,
    body: &Arc<Value>,
    concurrency: usize,
    total: usize,
) -> (Vec<Duration>, Vec<Duration>, f64) {
    let per = total.div_ceil(concurrency);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, t, body) = (client.clone(), Arc::clone(t), Arc::clone(body));
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for _ in 0..per {
                out.push(one(&client, &t, &body).await);
            }
            out
        }));
    }
    let mut ttfb = Vec::new();
    let mut full = Vec::new();
    for task in tasks {
        for (a, b, _) in task.await.expect("task") {
            ttfb.push(a);
            full.push(b);
        }
    }
    let rps = full.len() as f64 / started.elapsed().as_secs_f64();
    (ttfb, full, rps)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        switchyard::upstream::install_crypto_provider();
        let total: usize = std::env::var("REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(640);
        let sim = Sim::start(SimOptions { accounts: 4, ..SimOptions::default() }).await.expect("sim");
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("state");
        let store = Store::open(&dir).expect("store");
        let fleet = Fleet::load(store.clone(), clock::system()).expect("fleet");
        for a in sim.sim.account_ids() {
            let auth = sim.sim.auth_json(&a).expect("auth");
            let id = fleet.import(fleet.parse_auth(auth.to_string().as_bytes()).expect("parse")).await.expect("import").account.id;
            fleet.proven(&id);
        }
        store.flush().await.expect("flush");
        // A key with every limit set (too high to refuse), so that each request goes through
        // every admission check and is accounted: the hot path as a limited key meets it.
        let policy = switchyard::keys::policy::PolicyPatch {
            models: Some(vec!["gpt-*".into()]), max_concurrency: Some(Some(100_000)), rpm: Some(Some(100_000_000)),
            tokens_per_5h: Some(Some(1_000_000_000_000)), tokens_per_day: Some(Some(1_000_000_000_000)),
            tokens_per_week: Some(Some(1_000_000_000_000)), expires_at: Some(Some("2100-01-01T00:00:00Z".into())),
            note: None, tiers: Some(vec!["default".into(), "priority".into()]),
        };
        let key = KeyRing::load(store.clone(), clock::system()).expect("keys").create("bench", &policy).await.expect("key").key;
        let mut config = Config::default();
        config.upstream.base_url = sim.base_url();
        config.upstream.usage_url = sim.usage_url();
        config.upstream.oauth_token_url = sim.oauth_token_url();
        config.log.level = "warn".into();
        let listeners = daemon::bind("127.0.0.1:0".parse().expect("addr"), &dir.join("admin.sock")).await.expect("bind");
        let gw_addr = listeners.http_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<ShutdownKind>();
        let server = tokio::spawn(daemon::run(store, config, clock::system(), listeners, Notifier::default(), async move {
            stopped.await.unwrap_or(ShutdownKind::Fast)
        }));

        let acct = sim.sim.account_ids()[0].clone();
        let auth = sim.sim.auth_json(&acct).expect("auth");
        let direct = Arc::new(Target {
            name: "direct",
            url: format!("{}/responses", sim.base_url()),
            headers: vec![
                ("authorization".into(), format!("Bearer {}", auth["tokens"]["access_token"].as_str().unwrap_or_default())),
                ("chatgpt-account-id".into(), acct.clone()),
            ],
        });
        let gateway = Arc::new(Target {
            name: "gateway",
            url: format!("http://{gw_addr}/v1/responses"),
            headers: vec![("authorization".into(), format!("Bearer {key}"))],
        });
        let body = Arc::new(json!({"model": "gpt-5.5", "input": "hi", "stream": true, "store": false}));
        let client = reqwest::Client::builder().pool_max_idle_per_host(256).build().expect("client");
        // Warm both paths.
        level(&client, &direct, &body, 4, 40).await;
        level(&client, &gateway, &body, 4, 40).await;

        println!("{} streamed turns per run; times in ms", total);
        println!("{:<10} {:>4} {:>9} {:>9} {:>9} {:>9} {:>9}", "target", "conc", "ttfb p50", "ttfb p99", "full p50", "full p99", "req/s");
        for conc in [1usize, 64] {
            let n = if conc == 1 { total / 4 } else { total };
            let mut rows = Vec::new();
            for t in [&direct, &gateway] {
                let (mut ttfb, mut full, rps) = level(&client, t, &body, conc, n).await;
                let row = (percentile(&mut ttfb, 0.5), percentile(&mut ttfb, 0.99), percentile(&mut full, 0.5), percentile(&mut full, 0.99), rps);
                println!("{:<10} {:>4} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.0}", t.name, conc, ms(row.0), ms(row.1), ms(row.2), ms(row.3), row.4);
                rows.push(row);
            }
            let (d, g) = (rows[0], rows[1]);
            println!(
                "  added by the gateway at {conc}: ttfb p50 +{:.3} ms, full p50 +{:.3} ms, full p99 +{:.3} ms; gateway/direct full p50 = {:.2}x, throughput = {:.2}x",
                ms(g.0.saturating_sub(d.0)),
                ms(g.2.saturating_sub(d.2)),
                ms(g.3.saturating_sub(d.3)),
                g.2.as_secs_f64() / d.2.as_secs_f64(),
                g.4 / d.4
            );
        }
        let _ = stop.send(ShutdownKind::Fast);
        let _ = server.await;
    });
}
