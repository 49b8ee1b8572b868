//! Memory per idle Responses WebSocket: N downstream connections, each after one turn (so each
//! holds an idle upstream socket in the pool), RSS measured before and after. The gateway, the
//! simulator and the clients share this process, so the figure is an upper bound that also
//! counts the peers' ends (DESIGN §11 budget: < 64 KB per idle WebSocket).
//!
//! `cargo bench --bench ws_memory` (env `CONNECTIONS`, default 200).
#![allow(clippy::expect_used, clippy::unwrap_used)]

use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use switchyard::base::clock;
use switchyard::config::Config;
use switchyard::daemon::systemd::Notifier;
use switchyard::daemon::{self, ShutdownKind};
use switchyard::fleet::Fleet;
use switchyard::keys::KeyRing;
use switchyard::sim::{Sim, SimOptions};
use switchyard::store::Store;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        switchyard::upstream::install_crypto_provider();
        let n: usize = std::env::var("CONNECTIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
        let sim = Sim::start(SimOptions { accounts: 4, ..SimOptions::default() }).await.unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let store = Store::open(&dir).unwrap();
        let fleet = Fleet::load(store.clone(), clock::system()).unwrap();
        for a in sim.sim.account_ids() {
            let auth = sim.sim.auth_json(&a).unwrap();
            let id = fleet.import(fleet.parse_auth(auth.to_string().as_bytes()).unwrap()).await.unwrap().account.id;
            fleet.proven(&id);
        }
        store.flush().await.unwrap();
        let key = KeyRing::load(store.clone(), clock::system()).unwrap().create("bench", &Default::default()).await.unwrap().key;
        let mut config = Config::default();
        config.upstream.base_url = sim.base_url();
        config.upstream.usage_url = sim.usage_url();
        config.upstream.oauth_token_url = sim.oauth_token_url();
        config.scheduling.max_concurrency = 1000;
        config.server.ws_max_connections_per_key = n + 10;
        let listeners = daemon::bind("127.0.0.1:0".parse().unwrap(), &dir.join("admin.sock")).await.unwrap();
        let addr = listeners.http_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<ShutdownKind>();
        let server = tokio::spawn(daemon::run(store, config, clock::system(), listeners, Notifier::default(), async move {
            stopped.await.unwrap_or(ShutdownKind::Fast)
        }));

        let connect = |i: usize| {
            let key = key.clone();
            async move {
                let mut req = format!("ws://{addr}/v1/responses").into_client_request().unwrap();
                req.headers_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
                req.headers_mut().insert("session-id", format!("bench-{i}").parse().unwrap());
                let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
                    .read_buffer_size(4096)
                    .write_buffer_size(4096);
                let (mut ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(config), true).await.unwrap();
                let frame = json!({"type": "response.create", "model": "gpt-5.5", "input": "hi", "store": false, "stream": true});
                ws.send(Message::Text(frame.to_string().into())).await.unwrap();
                while let Some(Ok(m)) = ws.next().await {
                    if let Message::Text(t) = m
                        && t.as_str().contains("\"response.completed\"")
                    {
                        break;
                    }
                }
                ws
            }
        };
        // Warm up allocators and pools with a few connections first.
        let mut warm = Vec::new();
        for i in 0..10 {
            warm.push(connect(1_000_000 + i).await);
        }
        let before = rss_kb();
        let mut held = Vec::with_capacity(n);
        for i in 0..n {
            held.push(connect(i).await);
        }
        let after = rss_kb();
        let per = (after.saturating_sub(before)) as f64 * 1024.0 / n as f64;
        println!("{n} idle WebSocket pairs (downstream + pooled upstream, peers in-process): RSS {before} kB -> {after} kB");
        println!("  {:.1} KB per idle pair including both peers' ends (budget: < 64 KB per idle WebSocket)", per / 1024.0);
        drop(held);
        drop(warm);
        let _ = stop.send(ShutdownKind::Fast);
        let _ = server.await;
    });
}
