//! An in-process gateway in front of an in-process simulator: real sockets on 127.0.0.1:0,
//! real store in a temp dir, readiness by the listeners being bound before the server starts.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::Method;
use serde_json::{Value, json};
use switchyard::base::clock::{self, SharedClock};
use switchyard::config::Config;
use switchyard::daemon::systemd::Notifier;
use switchyard::daemon::{self, BootError, ShutdownKind};
use switchyard::fleet::Fleet;
use switchyard::keys::KeyRing;
use switchyard::sim::{Fault, FaultKind, Sim, SimHandle, SimOptions};
use switchyard::store::Store;
use switchyard_admin::AdminClient;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::sse::parse_sse;

/// How to start a gateway for a test.
pub struct GwOptions {
    pub accounts: u32,
    pub configure: fn(&mut Config),
    /// The gateway's clock (the simulator keeps the real one).
    pub clock: SharedClock,
    pub sim_access_ttl: std::time::Duration,
    /// The backend's origin refuses connections (the simulator still answers the token and
    /// usage endpoints).
    pub origin_down: bool,
    /// Leave the imported accounts unproven, for the gateway to probe before they take
    /// requests (otherwise the test vouches for them: they are ready at once).
    pub probe_accounts: bool,
}

impl Default for GwOptions {
    fn default() -> Self {
        Self {
            accounts: 2,
            configure: no_change,
            clock: clock::system(),
            sim_access_ttl: std::time::Duration::from_secs(3600),
            origin_down: false,
            probe_accounts: false,
        }
    }
}

pub struct Gw {
    pub sim: SimHandle,
    pub clock: SharedClock,
    pub addr: SocketAddr,
    pub key: String,
    pub socket: PathBuf,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    stop: Option<oneshot::Sender<ShutdownKind>>,
    task: Option<JoinHandle<Result<(), BootError>>>,
    pub http: reqwest::Client,
    /// chatgpt_account_id -> gateway account id.
    pub ids: BTreeMap<String, String>,
    configure: fn(&mut Config),
    /// Where the backend's origin is, when not the simulator (a port nothing listens on).
    origin: Option<String>,
}

fn no_change(_: &mut Config) {}

/// The SSE answer of one request.
#[derive(Debug)]
pub struct Sse {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    /// `(type, data)` of each event; comments are counted in `comments`.
    pub events: Vec<(String, Value)>,
    pub comments: usize,
    pub body: String,
    /// The stream ended with a transport error (not a clean close).
    pub broken: bool,
}

impl Sse {
    pub fn kinds(&self) -> Vec<&str> {
        self.events.iter().map(|(k, _)| k.as_str()).collect()
    }

    pub fn count(&self, kind: &str) -> usize {
        self.events.iter().filter(|(k, _)| k == kind).count()
    }

    pub fn last(&self) -> &(String, Value) {
        self.events.last().expect("no events")
    }

    pub fn text(&self) -> String {
        self.events
            .iter()
            .filter(|(k, _)| k == "response.output_text.delta")
            .filter_map(|(_, v)| v["delta"].as_str())
            .collect()
    }

    pub fn json_body(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

pub fn body(model: &str, text: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "instructions": "You are a test.",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "low", "summary": "auto"},
        "store": false,
        "stream": stream,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "test-session",
        "an_unknown_field": {"kept": true}
    })
}

/// A request without a session key (no affinity): the strategy alone picks the account.
pub fn body_plain(model: &str, text: &str, stream: bool) -> Value {
    let mut b = body(model, text, stream);
    b.as_object_mut().unwrap().remove("prompt_cache_key");
    b
}

impl Gw {
    pub async fn start(accounts: u32) -> Gw {
        Self::start_with(accounts, no_change).await
    }

    pub async fn start_with(accounts: u32, configure: fn(&mut Config)) -> Gw {
        Self::start_opts(GwOptions {
            accounts,
            configure,
            ..GwOptions::default()
        })
        .await
    }

    pub async fn start_opts(opts: GwOptions) -> Gw {
        switchyard::upstream::install_crypto_provider();
        let GwOptions {
            accounts,
            configure,
            clock,
            sim_access_ttl,
            origin_down,
            probe_accounts,
        } = opts;
        let sim = Sim::start(SimOptions {
            accounts,
            access_ttl: sim_access_ttl,
            ..SimOptions::default()
        })
        .await
        .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let store = Store::open(&dir).unwrap();
        let fleet = Fleet::load(store.clone(), Arc::clone(&clock)).unwrap();
        let mut ids = BTreeMap::new();
        for acct in sim.sim.account_ids() {
            let auth = sim.sim.auth_json(&acct).unwrap();
            let imported = fleet
                .import(fleet.parse_auth(auth.to_string().as_bytes()).unwrap())
                .await
                .unwrap();
            if !probe_accounts {
                fleet.proven(&imported.account.id);
            }
            ids.insert(acct, imported.account.id);
        }
        store.flush().await.unwrap();
        let key = KeyRing::load(store.clone(), Arc::clone(&clock))
            .unwrap()
            .create("test", &Default::default())
            .await
            .unwrap()
            .key;
        let mut gw = Gw {
            sim,
            clock,
            addr: "127.0.0.1:1".parse().unwrap(),
            key,
            socket: dir.join("admin.sock"),
            dir,
            _tmp: Some(tmp),
            stop: None,
            task: None,
            http: reqwest::Client::new(),
            ids,
            configure,
            origin: origin_down.then(closed_origin),
        };
        gw.launch(store).await;
        gw
    }

    fn config(&self) -> Config {
        let mut c = Config::default();
        c.upstream.base_url = self.origin.clone().unwrap_or_else(|| self.sim.base_url());
        c.upstream.usage_url = self.sim.usage_url();
        c.upstream.oauth_token_url = self.sim.oauth_token_url();
        c.upstream.auth_base_url = self.sim.url();
        c.server.shutdown_grace = std::time::Duration::from_secs(5);
        (self.configure)(&mut c);
        // Notification targets may name the simulator (its sink) as `{sim}`.
        for t in &mut c.notify {
            if let Some(u) = &mut t.url {
                *u = u.replace("{sim}", &self.sim.url());
            }
            t.api_base = t.api_base.replace("{sim}", &self.sim.url());
        }
        c
    }

    async fn launch(&mut self, store: Store) {
        let listeners = daemon::bind("127.0.0.1:0".parse().unwrap(), &self.socket)
            .await
            .unwrap();
        self.addr = listeners.http_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        let config = self.config();
        self.task = Some(tokio::spawn(daemon::run(
            store,
            config,
            Arc::clone(&self.clock),
            listeners,
            Notifier::default(),
            async move { rx.await.unwrap_or(ShutdownKind::Fast) },
        )));
        self.stop = Some(tx);
    }

    /// Stops the gateway (graceful) and waits for it.
    pub async fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(ShutdownKind::Graceful);
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
    }

    /// Begins a graceful shutdown (SIGTERM) without waiting for it.
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(ShutdownKind::Graceful);
        }
    }

    /// Stops and starts the gateway on the same state directory and simulator.
    pub async fn restart(&mut self) {
        self.shutdown().await;
        self.relaunch().await;
    }

    /// Stops the gateway at once (in-flight work is cut, as by a crash of the work it did)
    /// and starts it again on the same state.
    pub async fn restart_fast(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(ShutdownKind::Fast);
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
        self.relaunch().await;
    }

    async fn relaunch(&mut self) {
        // A connection task of the stopped daemon (a console's feed, cut at shutdown) may
        // still hold the store for a moment after the daemon returned: a process would have
        // exited; here the store is free once the last of them has ended.
        let deadline = tokio::time::Instant::now() + crate::common::SIGNAL_DEADLINE;
        let store = loop {
            match Store::open(&self.dir) {
                Err(switchyard::store::StoreError::Locked { .. })
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                other => break other.unwrap(),
            }
        };
        self.launch(store).await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn auth(&self) -> String {
        format!("Bearer {}", self.key)
    }

    pub async fn post_raw(
        &self,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> reqwest::Response {
        let mut req = self
            .http
            .post(self.url(path))
            .header("authorization", self.auth())
            .json(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.unwrap()
    }

    /// Starts a streamed request in its own task, read to its end.
    pub fn spawn_stream(&self, body: Value) -> JoinHandle<Sse> {
        let req = self
            .http
            .post(self.url("/v1/responses"))
            .header("authorization", self.auth())
            .json(&body);
        tokio::spawn(async move { read_sse(req.send().await.unwrap()).await })
    }

    /// A streamed request, read to its end.
    pub async fn stream(&self, body: &Value, headers: &[(&str, &str)]) -> Sse {
        let resp = self.post_raw("/v1/responses", body, headers).await;
        read_sse(resp).await
    }

    pub async fn json(&self, body: &Value) -> (u16, Value) {
        let resp = self.post_raw("/v1/responses", body, &[]).await;
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn admin(&self) -> AdminClient {
        AdminClient::connect(&self.socket).await.unwrap()
    }

    pub async fn accounts(&self) -> Vec<Value> {
        self.admin()
            .await
            .call(Method::GET, "/api/admin/accounts", None)
            .await
            .unwrap()
    }

    /// The admin view of the account with this chatgpt_account_id.
    pub async fn account(&self, chatgpt_id: &str) -> Value {
        self.accounts()
            .await
            .into_iter()
            .find(|a| a["chatgpt_account_id"] == chatgpt_id)
            .unwrap_or_else(|| panic!("no account {chatgpt_id}"))
    }

    /// Waits for an account just added or logged in again to be proved by the gateway's
    /// probe: it shows `probing` until then, and `ready` after.
    pub async fn until_proven(&self, chatgpt_id: &str) {
        until(&format!("{chatgpt_id} proved"), || async {
            let a = self.account(chatgpt_id).await;
            assert!(
                a["state"] == "probing" || a["state"] == "ready",
                "an account being proved is probing, then ready: {a}"
            );
            a["state"] == "ready"
        })
        .await;
    }

    pub async fn admin_call(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        self.admin()
            .await
            .call(method, path, body.map(|b| b.to_string().into_bytes()))
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Creates a client key with `policy` (the admin API's shape); returns (id, key).
    pub async fn make_key(&self, name: &str, policy: Value) -> (String, String) {
        let created = self
            .admin_call(
                Method::POST,
                "/api/admin/keys",
                Some(json!({"name": name, "policy": policy})),
            )
            .await;
        (
            created["id"].as_str().unwrap().to_string(),
            created["key"].as_str().unwrap().to_string(),
        )
    }

    pub async fn clear_cooldown_all(&self) {
        for a in self.accounts().await {
            let id = a["id"].as_str().unwrap().to_string();
            self.admin_call(
                Method::POST,
                &format!("/api/admin/accounts/{id}/clear-cooldown"),
                None,
            )
            .await;
        }
    }

    /// The `/metrics` exposition.
    pub async fn metrics_text(&self) -> String {
        self.metrics_text_via(&self.http).await
    }

    /// The `/metrics` exposition, asked with `client`.
    pub async fn metrics_text_via(&self, client: &reqwest::Client) -> String {
        client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn status(&self) -> Value {
        self.admin_call(Method::GET, "/api/admin/status", None)
            .await
    }

    pub async fn requests(&self, limit: usize) -> Vec<Value> {
        self.admin()
            .await
            .call(
                Method::GET,
                &format!("/api/admin/requests?limit={limit}"),
                None,
            )
            .await
            .unwrap()
    }

    /// Waits for the one request's record and checks that it ended as its client's leaving,
    /// with `account` neither marked nor left holding the request's slot.
    pub async fn recorded_as_client_cancelled(&self, account: &str) {
        until("the request to be recorded", || async {
            !self.requests(1).await.is_empty()
        })
        .await;
        let rec = self.requests(1).await.remove(0);
        assert_eq!(rec["outcome"], "client_cancelled", "{rec}");
        let acct = self.account(account).await;
        assert_eq!(acct["state"], "ready");
        assert_eq!(acct["in_flight"], 0, "the slot is released");
    }

    /// The chatgpt_account_ids in the order a fresh gateway's round robin starts with.
    pub fn rr_order(&self) -> Vec<String> {
        let mut v: Vec<(&String, &String)> = self.ids.iter().map(|(c, id)| (id, c)).collect();
        v.sort();
        v.into_iter().map(|(_, c)| c.clone()).collect()
    }

    pub fn fault(&self, account: &str, kind: FaultKind, times: Option<u32>) {
        assert!(
            self.sim.sim.push_fault(account, Fault { kind, times }),
            "no sim account {account}"
        );
    }

    /// `/responses` requests the simulator got for an account.
    pub fn served(&self, account: &str) -> usize {
        self.sim.sim.requests(account).len()
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(ShutdownKind::Fast);
        }
        self.sim.stop();
    }
}

pub async fn read_sse(resp: reqwest::Response) -> Sse {
    use futures_util::StreamExt;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut body = Vec::new();
    let mut broken = false;
    let mut s = resp.bytes_stream();
    while let Some(chunk) = s.next().await {
        match chunk {
            Ok(c) => body.extend_from_slice(&c),
            Err(_) => {
                broken = true;
                break;
            }
        }
    }
    let body = String::from_utf8_lossy(&body).into_owned();
    let (events, comments) = parse_sse(&body);
    Sse {
        status,
        headers,
        events,
        comments,
        body,
        broken,
    }
}

/// A backend URL on a port nothing listens on (bound, then released).
fn closed_origin() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("http://127.0.0.1:{port}/backend-api/codex")
}

pub fn path_exists(p: &Path) -> bool {
    p.exists()
}

/// Polls the gateway's own state until `check` holds (a real signal, with a deadline).
pub async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::task::yield_now().await;
    }
}
