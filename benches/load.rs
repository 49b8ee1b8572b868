#![allow(clippy::expect_used, clippy::unwrap_used)]
//! What the gateway costs as a proxy, next to nginx, in one run: a static upstream that answers
//! every `POST /responses` with the same 20-event Codex SSE stream, nginx as a plain reverse
//! proxy in front of it (when `nginx` is installed), and the gateway (its own binary, `serve`)
//! in front of it; the same keep-alive load through each from one client thread, at 32
//! connections and at 1. Prints what each proxy adds to the p50 and p99 latency, their
//! throughput, and the ratios — never asserted: the machine is shared and noisy. Per answer it
//! also prints the CPU time nginx spends proxying (its processes' CPU through the proxy, less
//! their CPU serving the same answers directly) and the gateway's, and the floor under the
//! gateway: a bare pass-through on the same stack (tokio, hyper's server, and hyper's client or
//! reqwest), which shows what the gateway's own work costs above the libraries it is built on.
//! "Core sleeps" counts how often the machine's cores entered a sleeping idle state per answer:
//! on a VM, waking a sleeping core is a large part of a lone request's latency.
//!
//! `cargo bench --bench load` (release; `LOAD_SECONDS`, default 5, per measurement;
//! `LOAD_GATEWAY=path` runs another build of the gateway; `LOAD_CONNS=32,1` the connection
//! counts; `LOAD_KEEP_AWAKE=1`, as root, keeps idle cores polling for the run). At each
//! connection count it then measures the upstream directly, the gateway and the hyper floor
//! in turn (`LOAD_ALTERNATIONS` rounds, default 3) and prints the gateway's and the floor's
//! CPU per answer and their ratios, and the p50 each adds to the direct one, with medians.
//! `LOAD_SECONDS=1 cargo test --bench load` runs it once in a debug build as a smoke test.
//! `LOAD_ONLY=rss cargo bench --bench load` measures only the gateway's RSS over a long run
//! (`LOAD_RSS_REQUESTS`, default 200k): after the first 10k answers and after the last;
//! `LOAD_CACHE_MIB` sets the store's cache for the gateways it starts. With
//! `LOAD_RSS_TARGET=floor` the same run goes through the hyper floor instead, and
//! `LOAD_FLOOR_WRAP` (a command line, such as a profiler's) runs the floor under it: the two
//! runs, under the same profiler, give the gateway's own cost per answer in instructions.
//! `LOAD_ONLY=slow_bodies` runs only the slow-body attack (`LOAD_SLOW_BODIES`, default 4,200
//! connections, for `LOAD_SECONDS`, default 30) and what a well-behaved client sees meanwhile.
//! `LOAD_ONLY=bodies` measures what one 14 MiB WebSocket turn and one 14 MiB `stream: false`
//! body of tiny items cost the gateway in memory (`LOAD_BODY_MIB`).
//! `LOAD_ONLY=publish` prints, as Markdown, the figures the README publishes: p50 and p99 added
//! by nginx and by the gateway at 1, 16 and 64 connections, and the interleaved delta with its
//! spread (`LOAD_ROUNDS`); `LOAD_GATEWAY_B=path` puts a second build in the same rounds, for a
//! before/after that the machine's drift cannot tilt, and measures the two builds' CPU per
//! answer and throughput alternating (`LOAD_PAIRS` times, default 3, at 32 connections or at
//! `LOAD_CONNS`).
//!
//! The upstream is nginx's own `return 200` when nginx is installed (as fast a static
//! upstream as there is), else this program itself in a child process.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

const EVENTS: usize = 20;

/// The 20 events of one short answer, as the backend frames them.
fn sse_body() -> String {
    let mut events = vec![
        r#"{"type":"response.created","response":{"id":"resp_load","status":"in_progress","model":"gpt-5.5","output":[]}}"#.to_string(),
        r#"{"type":"response.in_progress","response":{"id":"resp_load","status":"in_progress"}}"#.to_string(),
        r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"msg_1","role":"assistant","content":[]}}"#.to_string(),
        r#"{"type":"response.content_part.added","item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":""}}"#.to_string(),
    ];
    while events.len() < EVENTS - 1 {
        events.push(format!(
            r#"{{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"word{} "}}"#,
            events.len()
        ));
    }
    events.push(r#"{"type":"response.completed","response":{"id":"resp_load","status":"completed","model":"gpt-5.5","output":[],"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":0},"output_tokens":15,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":27}}}"#.to_string());
    events
        .iter()
        .map(|e| {
            let kind = e.split('"').nth(3).unwrap_or("message");
            format!("event: {kind}\ndata: {e}\n\n")
        })
        .collect()
}

const USAGE: &str = r#"{"plan_type":"plus","rate_limit":{"primary_window":{"used_percent":1,"limit_window_seconds":18000,"reset_after_seconds":9000},"secondary_window":{"used_percent":1,"limit_window_seconds":604800,"reset_after_seconds":300000}}}"#;

const REQUEST: &str = r#"{"model":"gpt-5.5","instructions":"You are a load test.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hello"}]}],"tools":[],"tool_choice":"auto","parallel_tool_calls":false,"store":false,"stream":true,"include":[]}"#;

/// The gateway's own allocator, so that the floor (this program as a bare proxy) stands on
/// the same libraries as the gateway.
#[global_allocator]
static GLOBAL: switchyard_alloc::Alloc = switchyard_alloc::Alloc;

struct Proc(Child, Option<Command>);

impl Drop for Proc {
    fn drop(&mut self) {
        // nginx's workers outlive a killed master: ask it to stop with them.
        if let Some(stop) = &mut self.1
            && stop.status().is_ok_and(|s| s.success())
        {
            let _ = self.0.wait();
            return;
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_listening(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{what} never listened on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn has_nginx() -> bool {
    Command::new("nginx")
        .arg("-v")
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// nginx as the static upstream (on `up`) and as a reverse proxy to it (on `proxy`).
fn start_nginx(dir: &Path, up: u16, proxy: u16) -> Proc {
    let body = sse_body().replace('\\', "\\\\").replace('\'', "\\'");
    let conf = format!(
        r#"worker_processes auto;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
daemon off;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  keepalive_requests 1000000;
  upstream backend {{ server 127.0.0.1:{up}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{up} backlog=4096;
    location /backend-api/codex/responses {{ default_type text/event-stream; return 200 '{body}'; }}
    location /backend-api/wham/usage {{ default_type application/json; return 200 '{USAGE}'; }}
    location / {{ return 404; }}
  }}
  server {{
    listen 127.0.0.1:{proxy} backlog=4096;
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"#,
        d = dir.display()
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let child = Command::new("nginx")
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("nginx");
    let mut stop = Command::new("nginx");
    stop.arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .args(["-s", "stop"]);
    stop.stderr(Stdio::null());
    let p = Proc(child, Some(stop));
    wait_listening(([127, 0, 0, 1], up).into(), "nginx upstream");
    wait_listening(([127, 0, 0, 1], proxy).into(), "nginx proxy");
    p
}

/// This program as the static upstream, in its own process.
fn start_own_upstream(up: u16) -> Proc {
    let child = Command::new(std::env::current_exe().unwrap())
        .env("LOAD_ROLE", "upstream")
        .env("LOAD_PORT", up.to_string())
        .stdout(Stdio::null())
        .spawn()
        .expect("upstream");
    let p = Proc(child, None);
    wait_listening(([127, 0, 0, 1], up).into(), "upstream");
    p
}

/// Serves HTTP/1.1 on 127.0.0.1:`port`, on a runtime with a worker per core, until the process
/// ends; `service` makes each connection's service.
fn serve_http1<S, B>(port: u16, service: impl Fn() -> S + Send + 'static)
where
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = hyper::Response<B>,
        > + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let _ = stream.set_nodelay(true);
            let svc = service();
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}

fn serve_own_upstream(port: u16) {
    use hyper::service::service_fn;
    let sse = Bytes::from(sse_body());
    serve_http1(port, move || {
        let sse = sse.clone();
        service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let sse = sse.clone();
            async move {
                let path = req.uri().path().to_string();
                let body = req.into_body().collect().await.map(|b| b.to_bytes());
                let paced = body
                    .as_ref()
                    .is_ok_and(|b| memchr::memmem::find(b, b"\"pace\"").is_some());
                let (ctype, body) = if path.ends_with("/responses") && paced {
                    ("text/event-stream", paced_stream())
                } else if path.ends_with("/responses") {
                    (
                        "text/event-stream",
                        http_body_util::Either::Left(Full::new(sse)),
                    )
                } else {
                    (
                        "application/json",
                        http_body_util::Either::Left(Full::new(Bytes::from_static(
                            USAGE.as_bytes(),
                        ))),
                    )
                };
                Ok::<_, std::convert::Infallible>(
                    hyper::Response::builder()
                        .header("content-type", ctype)
                        .body(body)
                        .unwrap(),
                )
            }
        })
    });
}

/// The floor under the gateway: this program as a bare pass-through proxy on the gateway's own
/// stack (tokio with a worker per core, hyper's server), with nothing of the gateway's work —
/// no key, plan, record or event reading. With `LOAD_FLOOR_CLIENT=reqwest` it sends upstream
/// with reqwest as the gateway does, else with hyper's pooled client (which reqwest wraps).
/// `LOAD_FLOOR_WRAP` (words, such as a profiler's command line) runs it under another program.
fn start_floor(listen: u16, up: u16, client: &str) -> Proc {
    let exe = std::env::current_exe().unwrap();
    let wrap = std::env::var("LOAD_FLOOR_WRAP").unwrap_or_default();
    let mut words = wrap.split_whitespace();
    let mut command = match words.next() {
        Some(program) => {
            let mut c = Command::new(program);
            c.args(words).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    let child = command
        .env("LOAD_ROLE", "floor")
        .env("LOAD_PORT", listen.to_string())
        .env("LOAD_UPSTREAM_PORT", up.to_string())
        .env("LOAD_FLOOR_CLIENT", client)
        .stdout(Stdio::null())
        .spawn()
        .expect("floor");
    let p = Proc(child, None);
    wait_listening(([127, 0, 0, 1], listen).into(), "floor proxy");
    p
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type FloorResponse = hyper::Response<http_body_util::combinators::BoxBody<Bytes, BoxError>>;

/// The floor proxy's upstream clients; `with_reqwest` says which one it uses.
struct Floor {
    hyper: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        hyper::body::Incoming,
    >,
    reqwest: reqwest::Client,
    with_reqwest: bool,
    base: String,
}

/// Sends a request upstream as it came and streams the answer back as it comes.
async fn floor_forward(
    floor: Arc<Floor>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<FloorResponse, BoxError> {
    use futures_util::TryStreamExt;
    let url = format!("{}{}", floor.base, req.uri().path());
    let (mut parts, body) = req.into_parts();
    match floor.with_reqwest {
        false => {
            parts.uri = url.parse()?;
            let resp = floor
                .hyper
                .request(hyper::Request::from_parts(parts, body))
                .await?;
            Ok(resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed()))
        }
        true => {
            let body = body.collect().await?.to_bytes();
            let mut send = floor.reqwest.post(url).body(body);
            if let Some(ct) = parts.headers.get("content-type") {
                send = send.header("content-type", ct.clone());
            }
            let resp = send.send().await?;
            let mut out = hyper::Response::builder().status(resp.status());
            for (k, v) in resp.headers() {
                out = out.header(k, v);
            }
            let stream = resp
                .bytes_stream()
                .map_ok(hyper::body::Frame::data)
                .map_err(|e| Box::new(e) as BoxError);
            Ok(out.body(http_body_util::StreamBody::new(stream).boxed())?)
        }
    }
}

fn serve_floor(port: u16, up: u16, with_reqwest: bool) {
    use hyper_util::client::legacy::{Client, connect::HttpConnector};
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    // reqwest is built without a default TLS provider, as in the gateway.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let floor = Arc::new(Floor {
        hyper: Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector),
        reqwest: reqwest::Client::builder()
            .tcp_nodelay(true)
            .build()
            .unwrap(),
        with_reqwest,
        base: format!("http://127.0.0.1:{up}"),
    });
    serve_http1(port, move || {
        let floor = floor.clone();
        hyper::service::service_fn(move |req| floor_forward(floor.clone(), req))
    });
}

type PacedBody = http_body_util::Either<
    Full<Bytes>,
    http_body_util::StreamBody<
        futures_util::stream::BoxStream<
            'static,
            Result<hyper::body::Frame<Bytes>, std::convert::Infallible>,
        >,
    >,
>;

/// Microseconds since the epoch: the send time carried in each paced delta.
fn now_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros()
}

/// A long answer: the same events, the deltas `PACE` apart, each carrying when it was sent.
const PACE: Duration = Duration::from_millis(100);

fn paced_stream() -> PacedBody {
    use futures_util::StreamExt;
    let events: Vec<String> = sse_body()
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| format!("{e}\n\n"))
        .collect();
    let stream = futures_util::stream::iter(events)
        .then(|e| async move {
            if e.contains("output_text.delta") {
                tokio::time::sleep(PACE).await;
                let e = e.replacen("\"delta\":\"", &format!("\"delta\":\"t={} ", now_us()), 1);
                Ok(hyper::body::Frame::data(Bytes::from(e)))
            } else {
                Ok(hyper::body::Frame::data(Bytes::from(e)))
            }
        })
        .boxed();
    http_body_util::Either::Right(http_body_util::StreamBody::new(stream))
}

/// `conns` long answers at once; returns each delta's delay from the upstream's send to here
/// (its p50 and p99), and how many streams did not complete.
async fn streams(t: &Target, conns: usize) -> (Duration, Duration, usize) {
    let body = REQUEST.replacen("\"hello\"", "\"pace\"", 1);
    let mut tasks = Vec::new();
    for i in 0..conns {
        let (addr, path, auth, body) = (t.addr, t.path, t.auth.clone(), body.clone());
        // Started over a second, as independent clients start, not all in one instant (a
        // thousand requests in one moment would measure the start, not the streams).
        let offset = Duration::from_secs(1).mul_f64(i as f64 / conns as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(offset).await;
            let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
                return (Vec::new(), false);
            };
            let _ = stream.set_nodelay(true);
            let Ok((mut send, conn)) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await
            else {
                return (Vec::new(), false);
            };
            tokio::spawn(conn);
            let mut req = hyper::Request::post(path)
                .header("host", "127.0.0.1")
                .header("content-type", "application/json");
            if let Some(a) = &auth {
                req = req.header("authorization", a);
            }
            let Ok(resp) = send
                .send_request(req.body(Full::new(Bytes::from(body))).unwrap())
                .await
            else {
                return (Vec::new(), false);
            };
            let mut body = resp.into_body();
            let mut delays = Vec::new();
            let mut complete = false;
            let mut pending = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let at = now_us();
                pending.extend_from_slice(&data);
                // Only whole events: a delta split across reads is counted once it is whole.
                let Some(end) = memchr::memmem::rfind(&pending, b"\n\n") else {
                    continue;
                };
                let whole = String::from_utf8_lossy(&pending[..end + 2]).into_owned();
                pending.drain(..end + 2);
                for piece in whole.split("\"delta\":\"t=").skip(1) {
                    if let Some(sent) = piece.split(' ').next().and_then(|n| n.parse::<u128>().ok())
                    {
                        delays.push(Duration::from_micros(
                            u64::try_from(at.saturating_sub(sent)).unwrap_or(0),
                        ));
                    }
                }
                complete |= whole.contains("response.completed");
            }
            (delays, complete)
        }));
    }
    let mut all = Vec::new();
    let mut incomplete = 0;
    for t in tasks {
        let (d, ok) = t.await.unwrap();
        all.extend(d);
        incomplete += usize::from(!ok);
    }
    (
        percentile(&mut all, 0.5),
        percentile(&mut all, 0.99),
        incomplete,
    )
}

/// The gateway's binary: this build's, or `LOAD_GATEWAY` (to compare two builds in one run).
fn gateway_bin() -> PathBuf {
    std::env::var_os("LOAD_GATEWAY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_switchyard")))
}

/// The build a gateway set up in `dir` runs: the one its `gateway-bin` file names (a second
/// build, side by side with the first), else [`gateway_bin`].
fn bin_of(dir: &Path) -> PathBuf {
    std::fs::read_to_string(dir.join("gateway-bin"))
        .map(|p| PathBuf::from(p.trim()))
        .unwrap_or_else(|_| gateway_bin())
}

fn switchyard(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(bin_of(dir))
        .arg("--config")
        .arg(dir.join("switchyard.toml"))
        .args(args)
        .output()
        .expect("switchyard");
    assert!(
        out.status.success(),
        "switchyard {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The gateway in front of the upstream: its own process, with `accounts` accounts and a key.
fn start_gateway(dir: &Path, up: u16, listen: u16, accounts: u32) -> (Proc, String) {
    let mut files = Vec::new();
    for n in 1..=accounts {
        let spec = switchyard::sim::auth::AuthSpec {
            email: format!("load{n}@example.com"),
            chatgpt_account_id: format!("acc-load-{n}"),
            chatgpt_user_id: format!("user-load-{n}"),
            plan: "pro".into(),
            access_exp: 4_000_000_000,
            token_tag: format!("load-{n}"),
        };
        let path = dir.join(format!("auth{n}.json"));
        std::fs::write(&path, switchyard::sim::auth::auth_json(&spec).to_string()).unwrap();
        files.push(path);
    }
    start_gateway_with(dir, up, listen, &files)
}

/// The gateway in front of the upstream on port `up`, with the logins in `files` and a key.
fn start_gateway_with(dir: &Path, up: u16, listen: u16, files: &[PathBuf]) -> (Proc, String) {
    let state = dir.join("state");
    // `LOAD_CACHE_MIB` sizes the store's cache (the default when unset).
    let cache =
        std::env::var("LOAD_CACHE_MIB").map_or(String::new(), |m| format!("cache_mib = {m}\n"));
    std::fs::write(
        dir.join("switchyard.toml"),
        format!(
            "[server]\nlisten = \"127.0.0.1:{listen}\"\n\n[storage]\nstate_dir = \"{}\"\n{cache}\n\
             [upstream]\nbase_url = \"http://127.0.0.1:{up}/backend-api/codex\"\n\
             usage_url = \"http://127.0.0.1:{up}/backend-api/wham/usage\"\n\
             oauth_token_url = \"http://127.0.0.1:{up}/oauth/token\"\n\n\
             [scheduling]\nmax_concurrency = 400\n\n[log]\nlevel = \"warn\"\nformat = \"text\"\n",
            state.display()
        ),
    )
    .unwrap();
    let mut import = vec!["account", "import", "--no-refresh"];
    import.extend(files.iter().map(|p| p.to_str().unwrap()));
    switchyard(dir, &import);
    let key = switchyard(dir, &["key", "create", "load"])
        .trim()
        .to_string();
    (serve_gateway(dir, listen), key)
}

/// `serve` on the gateway set up in `dir` by [`start_gateway`], once it listens.
fn serve_gateway(dir: &Path, listen: u16) -> Proc {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("gateway.log"))
        .unwrap();
    let child = Command::new(bin_of(dir))
        .arg("--config")
        .arg(dir.join("switchyard.toml"))
        .arg("serve")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("serve");
    let p = Proc(child, None);
    wait_listening(([127, 0, 0, 1], listen).into(), "the gateway");
    p
}

/// One target of the load: where to send, with which path and header.
struct Target {
    addr: SocketAddr,
    path: &'static str,
    auth: Option<String>,
}

impl Target {
    /// The backend's (or a plain proxy's) `/responses` on a local port.
    fn backend(port: u16) -> Target {
        Target {
            addr: ([127, 0, 0, 1], port).into(),
            path: "/backend-api/codex/responses",
            auth: None,
        }
    }

    /// A gateway's `/v1/responses` on a local port, with its key.
    fn gateway(port: u16, key: &str) -> Target {
        Target {
            addr: ([127, 0, 0, 1], port).into(),
            path: "/v1/responses",
            auth: Some(format!("Bearer {key}")),
        }
    }
}

/// Waits until the gateway serves: it proves its accounts first (usage, one request).
async fn wait_serving(gateway: &Target, dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while drive(gateway, 1, 0.05).await.0.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the gateway never served: see {}",
            dir.join("gateway.log").display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The figures the README publishes, as Markdown: p50 and p99 added by nginx and by the
/// gateway at 1, 16 and 64 connections (`LOAD_CONNS`), and the interleaved delta with its
/// spread (`LOAD_ROUNDS` rounds, default 5,000, of one request direct, one through nginx and
/// one through the gateway, in rotating order on one connection each).
fn publish() {
    assert!(
        has_nginx(),
        "publishing needs nginx, as the upstream and the reverse-proxy anchor"
    );
    let secs: f64 = env_or("LOAD_SECONDS", 5.0);
    let rounds: usize = env_or("LOAD_ROUNDS", 5000);
    let conns = conn_counts_or(&[1, 16, 64]);
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().to_path_buf();
    let (up, px, gw) = (free_port(), free_port(), free_port());
    let nginx = start_nginx(&dir, up, px);
    let (gateway, key) = start_gateway(&dir, up, gw, 4);
    // `LOAD_GATEWAY_B=path`: a second build beside the first, in the interleaved rounds.
    let other = std::env::var_os("LOAD_GATEWAY_B").map(|bin| {
        let other_dir = dir.join("b");
        std::fs::create_dir_all(&other_dir).unwrap();
        std::fs::write(other_dir.join("gateway-bin"), bin.as_encoded_bytes()).unwrap();
        let port = free_port();
        let (p, key) = start_gateway(&other_dir, up, port, 4);
        (p, Target::gateway(port, &key))
    });
    let (direct, via_nginx) = (Target::backend(up), Target::backend(px));
    let via_gateway = Target::gateway(gw, &key);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        wait_serving(&via_gateway, &dir).await;
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!(
            "{EVENTS}-event SSE answers from nginx `return 200`; the client (one thread), nginx and the gateway on one {cores}-core machine; {secs} s per measurement; added = through the proxy less direct, at the same percentile.\n"
        );
        println!("| connections | direct p50 / p99 | nginx adds p50 / p99 | gateway adds p50 / p99 | gateway req/s (of nginx's) | gateway CPU per answer |");
        println!("|---:|---:|---:|---:|---:|---:|");
        let nginx_meter = Meter::Tree(nginx.0.id());
        for c in conns {
            let d = measure(&direct, c, secs, nginx_meter).await;
            let n = measure(&via_nginx, c, secs, nginx_meter).await;
            let g = measure(&via_gateway, c, secs, Meter::Process(gateway.0.id())).await;
            let added = |r: &Run| {
                format!(
                    "{:.3} / {:.3} ms",
                    p50_added(r, &d),
                    ms(r.p99.saturating_sub(d.p99))
                )
            };
            println!(
                "| {c} | {:.3} / {:.3} ms | {} | {} | {:.0} ({:.0}%) | {} |",
                ms(d.p50),
                ms(d.p99),
                added(&n),
                added(&g),
                g.rps,
                g.rps / n.rps * 100.0,
                g.cpu_us.map_or("–".into(), |us| format!("{us:.0} µs")),
            );
        }
        let mut targets = vec![&direct, &via_nginx, &via_gateway];
        if let Some((b_proc, b)) = &other {
            wait_serving(b, &dir).await;
            targets.push(b);
            // The two builds' throughput and CPU, alternating, so that the machine's drift
            // falls on both alike.
            let pairs: usize = env_or("LOAD_PAIRS", 3);
            println!();
            for c in conn_counts_or(&[32]) {
                let (mut a, mut bb) = (Vec::new(), Vec::new());
                for _ in 0..pairs {
                    a.push(measure(&via_gateway, c, secs, Meter::Process(gateway.0.id())).await);
                    bb.push(measure(b, c, secs, Meter::Process(b_proc.0.id())).await);
                }
                println!(
                    "At {c} connections, the two builds alternating {pairs} times: this build {}; the second build (`LOAD_GATEWAY_B`) {}.",
                    paired_summary(&a),
                    paired_summary(&bb)
                );
            }
        }
        let deltas = interleaved(&targets, rounds).await;
        let spread = |d: &[f64]| {
            let at = |p: f64| d[((d.len() - 1) as f64 * p).round() as usize];
            let mean = d.iter().sum::<f64>() / d.len() as f64;
            let sd = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / d.len() as f64).sqrt();
            format!(
                "median {:.3} ms (p25–p75 {:.3}–{:.3}, p5–p95 {:.3}–{:.3}; mean {:.3} ± {:.3})",
                at(0.5),
                at(0.25),
                at(0.75),
                at(0.05),
                at(0.95),
                mean,
                sd
            )
        };
        println!(
            "\nInterleaved, {} rounds of one request direct, one through nginx and one through the gateway (rotating order, one connection each), each less the direct one of its round: the gateway adds {}; nginx adds {}.",
            deltas[1].len(),
            spread(&deltas[1]),
            spread(&deltas[0]),
        );
        if let Some(b) = deltas.get(2) {
            println!("The second build (`LOAD_GATEWAY_B`), in the same rounds, adds {}.", spread(b));
        }
    });
}

/// `LOAD_CONNS` when it is set, else `default`.
fn conn_counts_or(default: &[usize]) -> Vec<usize> {
    match std::env::var("LOAD_CONNS") {
        Ok(_) => conn_counts(),
        Err(_) => default.to_vec(),
    }
}

/// A build's runs in a paired comparison: CPU per answer and req/s of each, and the medians.
fn paired_summary(runs: &[Run]) -> String {
    let cpu: Vec<f64> = runs.iter().filter_map(|r| r.cpu_us).collect();
    let rps: Vec<f64> = runs.iter().map(|r| r.rps).collect();
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join("/")
    };
    format!(
        "CPU per answer {} µs (median {:.0}), {} req/s (median {:.0})",
        list(&cpu),
        median(cpu),
        list(&rps),
        median(rps)
    )
}

/// The middle value (the mean of the two middle ones for an even count); NaN for none.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One keep-alive connection to a target.
struct Client {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &'static str,
    auth: Option<String>,
}

impl Client {
    async fn connect(t: &Target) -> Client {
        let stream = tokio::net::TcpStream::connect(t.addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        Client {
            send,
            path: t.path,
            auth: t.auth.clone(),
        }
    }

    /// One request: `Ok` with its latency when the answer came whole, `Err(true)` when it did
    /// not, `Err(false)` when the connection failed.
    async fn once(&mut self) -> Result<Duration, bool> {
        let mut req = hyper::Request::post(self.path)
            .header("host", "127.0.0.1")
            .header("content-type", "application/json");
        if let Some(a) = &self.auth {
            req = req.header("authorization", a);
        }
        let req = req
            .body(Full::new(Bytes::from_static(REQUEST.as_bytes())))
            .unwrap();
        let t0 = Instant::now();
        let resp = self.send.send_request(req).await.map_err(|_| false)?;
        let ok = resp.status() == 200;
        match resp.into_body().collect().await.map(|b| b.to_bytes()) {
            Ok(b) if ok && memchr::memmem::find(&b, b"response.completed").is_some() => {
                Ok(t0.elapsed())
            }
            _ => Err(true),
        }
    }
}

/// Sends requests on `conns` keep-alive connections for `secs`; returns the latencies of the
/// complete answers and how many were not.
async fn drive(t: &Target, conns: usize, secs: f64) -> (Vec<Duration>, usize) {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let mut client = Client::connect(t).await;
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut bad = 0;
            while Instant::now() < until {
                match client.once().await {
                    Ok(l) => lat.push(l),
                    Err(open) => {
                        bad += 1;
                        if !open {
                            break;
                        }
                    }
                }
            }
            (lat, bad)
        }));
    }
    let mut all = Vec::new();
    let mut bad = 0;
    for t in tasks {
        let (l, b) = t.await.unwrap();
        all.extend(l);
        bad += b;
    }
    (all, bad)
}

/// Sends `total` requests on `conns` keep-alive connections, calling `at(n)` as the `n`th
/// complete answer arrives; returns how many answers were not complete.
async fn drive_count(
    t: &Target,
    conns: usize,
    total: usize,
    at: impl Fn(usize) + Send + Sync + 'static,
) -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let sent = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let at = Arc::new(at);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let mut client = Client::connect(t).await;
        let (sent, done, at) = (Arc::clone(&sent), Arc::clone(&done), Arc::clone(&at));
        tasks.push(tokio::spawn(async move {
            let mut bad = 0;
            while sent.fetch_add(1, Ordering::Relaxed) < total {
                match client.once().await {
                    Ok(_) => at(done.fetch_add(1, Ordering::Relaxed) + 1),
                    Err(open) => {
                        bad += 1;
                        if !open {
                            break;
                        }
                    }
                }
            }
            bad
        }));
    }
    let mut bad = 0;
    for t in tasks {
        bad += t.await.unwrap();
    }
    bad
}

/// `rounds` rounds of one request to each target in turn (the order rotating every round),
/// each on its own connection: each target's latency less the first target's in the same
/// round, sorted.
async fn interleaved(targets: &[&Target], rounds: usize) -> Vec<Vec<f64>> {
    let mut clients = Vec::new();
    for t in targets {
        clients.push(Client::connect(t).await);
    }
    let mut deltas = vec![Vec::with_capacity(rounds); targets.len() - 1];
    let mut lat = vec![Duration::ZERO; targets.len()];
    'round: for round in 0..rounds {
        for k in 0..clients.len() {
            let i = (k + round) % clients.len();
            match clients[i].once().await {
                Ok(l) => lat[i] = l,
                Err(_) => continue 'round,
            }
        }
        for (d, l) in deltas.iter_mut().zip(&lat[1..]) {
            d.push(ms(*l) - ms(lat[0]));
        }
    }
    for d in &mut deltas {
        d.sort_by(f64::total_cmp);
    }
    deltas
}

/// The gateway's memory over a long run: RSS after the first 10k answers and after the last
/// of `LOAD_RSS_REQUESTS` (default 200k), on 8 connections. Each answer leaves a request
/// record in the store, so a cache that is not held to its size shows as growth here.
fn rss_over_a_long_run() {
    let total: usize = env_or("LOAD_RSS_REQUESTS", 200_000);
    let tmp = tempfile::tempdir().unwrap();
    let (up, gw) = (free_port(), free_port());
    let _upstream = start_own_upstream(up);
    // The floor in the gateway's place: what the libraries alone cost over the same run.
    let floor = std::env::var("LOAD_RSS_TARGET").as_deref() == Ok("floor");
    let (gateway, target) = if floor {
        (start_floor(gw, up, "hyper"), Target::backend(gw))
    } else {
        let (gateway, key) = start_gateway(tmp.path(), up, gw, 4);
        (gateway, Target::gateway(gw, &key))
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        wait_serving(&target, tmp.path()).await;
        let pid = gateway.0.id();
        let start = rss_kb(pid).unwrap_or(0);
        let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
        let marks = Arc::clone(&samples);
        let step = (total / 20).max(1);
        let t0 = Instant::now();
        let bad = drive_count(&target, 8, total, move |n| {
            if n == 10_000.min(total) || n % step == 0 {
                marks.lock().unwrap().push((n, rss_kb(pid).unwrap_or(0)));
            }
        })
        .await;
        let secs = t0.elapsed().as_secs_f64();
        let samples = samples.lock().unwrap().clone();
        let first = samples.iter().find(|(n, _)| *n >= 10_000.min(total)).map_or(0, |s| s.1);
        let last = rss_kb(pid).unwrap_or(0);
        println!(
            "{total} requests in {secs:.0} s ({:.0} req/s, {bad} incomplete): {} RSS {start} KB before, {first} KB after 10k, {last} KB after the last: {:+} KB ({:.2} KB per 1k requests after the first 10k)",
            total as f64 / secs,
            if floor { "floor" } else { "gateway" },
            last as i64 - first as i64,
            (last as f64 - first as f64) / ((total.saturating_sub(10_000)).max(1) as f64 / 1000.0)
        );
        let line: Vec<String> = samples.iter().map(|(n, kb)| format!("{}k:{}", n / 1000, kb / 1024)).collect();
        println!("RSS in MB by answers: {}", line.join(" "));
    });
    if floor {
        // Asked to stop, not killed: a profiler it runs under writes its figures.
        sigterm(gateway.0.id());
        return;
    }
    // The same store at the next start: what opening (and checking) it costs in memory.
    let stop = Instant::now();
    sigterm(gateway.0.id());
    drop(gateway);
    let stopped = stop.elapsed();
    let size = std::fs::metadata(tmp.path().join("state/switchyard.redb")).map_or(0, |m| m.len());
    let again = serve_gateway(tmp.path(), gw);
    println!(
        "restarted on its {:.1} MB store (stopped in {:.1} s): RSS {} KB once it listens",
        size as f64 / 1e6,
        stopped.as_secs_f64(),
        rss_kb(again.0.id()).unwrap_or(0)
    );
}

/// Asks a child to stop as systemd would (SIGTERM), so it closes its store cleanly.
fn sigterm(pid: u32) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
    let status = format!("/proc/{pid}/status");
    let deadline = Instant::now() + Duration::from_secs(60);
    // A zombie (exited, not yet reaped) has no VmRSS line.
    while std::fs::read_to_string(&status).is_ok_and(|s| s.contains("VmRSS"))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `LOAD_SLOW_BODIES` (default 4,200) connections from one key limited to 1 request at a time
/// and 1 a minute, each sending a request head and then one byte of body every 5 s, while a
/// well-behaved client (another key) sends a request on a new connection, and `/healthz` is
/// asked, every 100 ms: their latencies and failures while the trickle runs, and how the
/// gateway closed the slow connections.
fn slow_bodies() {
    let n: usize = env_or("LOAD_SLOW_BODIES", 4200);
    let secs: u64 = env_or("LOAD_SECONDS", 30);
    switchyard::daemon::fds::raise_open_file_limit();
    switchyard::upstream::install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let (up, gw) = (free_port(), free_port());
    let _upstream = start_own_upstream(up);
    let (gateway, good_key) = start_gateway(tmp.path(), up, gw, 4);
    let limited = switchyard(
        tmp.path(),
        &[
            "key",
            "create",
            "limited",
            "--max-concurrency",
            "1",
            "--rpm",
            "1",
        ],
    )
    .trim()
    .to_string();
    let target = Target::gateway(gw, &good_key);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        wait_serving(&target, tmp.path()).await;
        let addr: SocketAddr = ([127, 0, 0, 1], gw).into();
        let head = format!(
            "POST /v1/responses HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {limited}\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n{{"
        );
        let closed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let started = Instant::now();
        let mut slow = Vec::new();
        for _ in 0..n {
            let (head, closed, answered) = (head.clone(), Arc::clone(&closed), Arc::clone(&answered));
            slow.push(tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else { return };
                if s.write_all(head.as_bytes()).await.is_err() {
                    closed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
                let mut buf = [0u8; 512];
                loop {
                    tokio::select! {
                        r = s.read(&mut buf) => {
                            if matches!(r, Ok(n) if n > 0) { answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed); }
                            closed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            return;
                        }
                        _ = tokio::time::sleep(Duration::from_secs(5)) => {
                            if s.write_all(b" ").await.is_err() {
                                closed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                return;
                            }
                        }
                    }
                }
            }));
        }
        let opened = started.elapsed();
        let client = reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(10)).build().unwrap();
        let (mut good, mut health, mut failed) = (Vec::new(), Vec::new(), 0usize);
        let until = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < until {
            let t0 = Instant::now();
            let r = client.post(format!("http://{addr}/v1/responses")).header("authorization", format!("Bearer {good_key}")).header("content-type", "application/json").body(REQUEST).send().await;
            let ok = match r {
                Ok(resp) if resp.status() == 200 => resp.text().await.is_ok_and(|b| b.contains("response.completed")),
                _ => false,
            };
            if ok { good.push(t0.elapsed()) } else { failed += 1 }
            let t0 = Instant::now();
            match client.get(format!("http://{addr}/healthz")).send().await {
                Ok(resp) if resp.status().is_success() || resp.status().as_u16() == 503 => health.push(t0.elapsed()),
                _ => failed += 1,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let metrics = client.get(format!("http://{addr}/metrics")).send().await.map(|r| r.text());
        let metrics = match metrics { Ok(t) => t.await.unwrap_or_default(), Err(_) => String::new() };
        let count = |reason: &str| metrics.lines().find_map(|l| l.strip_prefix(&format!("switchyard_client_connections_closed_total{{reason=\"{reason}\"}} "))).unwrap_or("?").to_string();
        let refusals: Vec<&str> = metrics.lines().filter(|l| l.starts_with("switchyard_key_refusals_total{key=\"limited\"")).collect();
        let (gmax, hmax) = (good.iter().max().copied().unwrap_or_default(), health.iter().max().copied().unwrap_or_default());
        println!(
            "{n} slow-body connections (opened in {:.1} s) from a key limited to 1 at a time and 1 rpm, for {secs} s: well-behaved requests {} ok, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; /healthz {} ok, p50 {:.1} ms, max {:.1} ms; {failed} failed",
            opened.as_secs_f64(),
            good.len(),
            ms(percentile(&mut good.clone(), 0.5)),
            ms(percentile(&mut good.clone(), 0.99)),
            ms(gmax),
            health.len(),
            ms(percentile(&mut health.clone(), 0.5)),
            ms(hmax),
        );
        println!(
            "the slow connections: {} closed by the gateway ({} with an answer first); gateway closes by reason: evicted {}, refused {}, head_timeout {}; the key's refusals: {}",
            closed.load(std::sync::atomic::Ordering::Relaxed),
            answered.load(std::sync::atomic::Ordering::Relaxed),
            count("evicted"),
            count("refused"),
            count("head_timeout"),
            refusals.join(", ")
        );
        for t in slow { t.abort(); }
    });
    drop(gateway);
}

/// A field of `/proc/PID/status`, in KB.
fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Restarts the peak RSS count of a process (`VmHWM`) at its current RSS.
fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// What one large body of tiny items costs the gateway: one `LOAD_BODY_MIB` (default 14) MiB
/// WebSocket `response.create` and one `stream: false` HTTP body of as much, each an input of
/// `{}` items (three bytes each with the comma), through the simulated backend in its own process: the gateway's peak RSS over each, and what the
/// open socket keeps after its turn, as multiples of the body.
fn big_bodies() {
    let mib: usize = env_or("LOAD_BODY_MIB", 14);
    switchyard::upstream::install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let (up, gw) = (free_port(), free_port());
    // The simulated backend in its own process: it speaks the WebSocket too.
    let auth = tmp.path().join("auth");
    let sim = Command::new(gateway_bin())
        .args([
            "sim",
            "--accounts",
            "1",
            "--listen",
            &format!("127.0.0.1:{up}"),
            "--write-auth",
        ])
        .arg(&auth)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("switchyard sim");
    let _sim = Proc(sim, None);
    wait_listening(([127, 0, 0, 1], up).into(), "the simulated backend");
    let files: Vec<PathBuf> = std::fs::read_dir(&auth)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let (gateway, key) = start_gateway_with(tmp.path(), up, gw, &files);
    let target = Target::gateway(gw, &key);
    let pid = gateway.0.id();
    let items = (mib << 20) / 3 - 64;
    let body = |extra: &str| {
        let mut b = String::with_capacity((mib << 20) + 256);
        b.push_str(r#"{"model":"gpt-5.5","#);
        b.push_str(extra);
        b.push_str(r#""input":["#);
        for i in 0..items {
            if i > 0 {
                b.push(',');
            }
            b.push_str("{}");
        }
        b.push_str("]}");
        b
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        wait_serving(&target, tmp.path()).await;
        // WebSocket: one turn, then the socket stays open.
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let frame = body(r#""type":"response.create","#);
        let size_kb = (frame.len() / 1024) as u64;
        let mut req = format!("ws://127.0.0.1:{gw}/v1/responses").into_client_request().unwrap();
        req.headers_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(64 << 20))
            .max_frame_size(Some(64 << 20));
        let (mut ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(config), false).await.unwrap();
        let before = status_kb(pid, "VmRSS:");
        reset_peak(pid);
        ws.send(Message::Text(frame.into())).await.unwrap();
        let mut last = String::new();
        while let Some(Ok(m)) = ws.next().await {
            if let Message::Text(t) = m {
                let done = t.contains("response.completed") || t.contains("\"type\":\"error\"");
                last = t.to_string();
                if done { break; }
            }
        }
        let peak = status_kb(pid, "VmHWM:");
        let kept = status_kb(pid, "VmRSS:");
        let ratio = |kb: u64| kb.saturating_sub(before) as f64 / size_kb as f64;
        println!(
            "one {size_kb} KB WebSocket turn of {items} tiny items ({}): gateway RSS {before} KB before, peak {peak} KB (+{:.2}x the frame), {kept} KB with the socket open after it (+{:.2}x)",
            if last.contains("response.completed") { "completed".to_string() } else { format!("not completed: {}", &last[..last.len().min(300)]) },
            ratio(peak),
            ratio(kept)
        );
        drop(ws);
        // HTTP, `stream: false`: the body is re-encoded (the gateway streams upstream).
        let http = body(r#""stream":false,"#);
        let client = reqwest::Client::new();
        let before = status_kb(pid, "VmRSS:");
        reset_peak(pid);
        let resp = client
            .post(format!("http://127.0.0.1:{gw}/v1/responses"))
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(http)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let _ = resp.bytes().await;
        let peak = status_kb(pid, "VmHWM:");
        println!(
            "one {size_kb} KB stream:false body of {items} tiny items (answer {status}): gateway RSS {before} KB before, peak {peak} KB (+{:.2}x the body)",
            peak.saturating_sub(before) as f64 / size_kb as f64
        );
    });
    drop(gateway);
}

struct Run {
    p50: Duration,
    p99: Duration,
    rps: f64,
    bad: usize,
    /// CPU time (user + system) of the measured process per answer, in µs.
    cpu_us: Option<f64>,
    /// Its write system calls per answer (to the client and the upstream together).
    writes: Option<f64>,
    /// How often the machine's cores went to sleep per answer (any process's).
    sleeps: Option<f64>,
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[(((v.len() - 1) as f64) * p).round() as usize]
}

/// Whose CPU time a measurement counts.
#[derive(Clone, Copy)]
enum Meter {
    None,
    /// One process (the gateway): also its write system calls.
    Process(u32),
    /// A process and its children (nginx's master and workers).
    Tree(u32),
}

impl Meter {
    fn ticks(self) -> Option<u64> {
        match self {
            Meter::None => None,
            Meter::Process(pid) => cpu_ticks(pid),
            Meter::Tree(pid) => {
                Some(cpu_ticks(pid)? + children(pid).into_iter().filter_map(cpu_ticks).sum::<u64>())
            }
        }
    }

    fn writes(self) -> Option<u64> {
        match self {
            Meter::Process(pid) => write_calls(pid),
            Meter::None | Meter::Tree(_) => None,
        }
    }
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')?
                        .1
                        .split_whitespace()
                        .nth(1)?
                        .parse::<u32>()
                        .ok()
                })
                == Some(pid)
        })
        .collect()
}

/// A warm-up, then `secs` of load, counting the CPU time of what `meter` names.
async fn measure(t: &Target, conns: usize, secs: f64, meter: Meter) -> Run {
    drive(t, conns, (secs / 5.0).max(0.2)).await; // warm-up
    let before = meter.ticks();
    let writes_before = meter.writes();
    let sleeps_before = core_sleeps();
    let (mut lat, bad) = drive(t, conns, secs).await;
    let after = meter.ticks();
    let sleeps = sleeps_before
        .zip(core_sleeps())
        .filter(|_| !lat.is_empty())
        .map(|(b, a)| a.saturating_sub(b) as f64 / lat.len() as f64);
    let writes = writes_before
        .zip(meter.writes())
        .filter(|_| !lat.is_empty())
        .map(|(b, a)| a.saturating_sub(b) as f64 / lat.len() as f64);
    let rps = lat.len() as f64 / secs;
    let cpu_us = before.zip(after).filter(|_| !lat.is_empty()).map(|(b, a)| {
        // Clock ticks are 1/100 s.
        a.saturating_sub(b) as f64 * 10_000.0 / lat.len() as f64
    });
    Run {
        p50: percentile(&mut lat, 0.5),
        p99: percentile(&mut lat, 0.99),
        rps,
        bad,
        cpu_us,
        writes,
        sleeps,
    }
}

/// How many times the cores have entered an idle state that sleeps (every cpuidle state but
/// polling), summed over the cores; `None` where the kernel does not tell.
fn core_sleeps() -> Option<u64> {
    let mut total = None;
    for cpu in std::fs::read_dir("/sys/devices/system/cpu").ok()?.flatten() {
        let Ok(states) = std::fs::read_dir(cpu.path().join("cpuidle")) else {
            continue;
        };
        for state in states.flatten() {
            let name = std::fs::read_to_string(state.path().join("name")).unwrap_or_default();
            if name.trim() == "POLL" {
                continue;
            }
            if let Some(n) = std::fs::read_to_string(state.path().join("usage"))
                .ok()
                .and_then(|u| u.trim().parse::<u64>().ok())
            {
                *total.get_or_insert(0) += n;
            }
        }
    }
    total
}

/// With `LOAD_KEEP_AWAKE=1`, asks the kernel for no idle-state exit latency while the program
/// runs (`/dev/cpu_dma_latency`, root only), so idle cores poll instead of sleeping: what the
/// proxies cost without the price of waking a sleeping core.
fn keep_awake() -> Option<std::fs::File> {
    if std::env::var("LOAD_KEEP_AWAKE").as_deref() != Ok("1") {
        return None;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")
        .and_then(|mut f| f.write_all(&0i32.to_ne_bytes()).map(|()| f))
    {
        Ok(f) => Some(f),
        Err(e) => {
            println!("LOAD_KEEP_AWAKE: cannot hold /dev/cpu_dma_latency ({e}); cores may sleep");
            None
        }
    }
}

/// Write system calls of a process so far (`syscw` in `/proc/PID/io`).
fn write_calls(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("syscw:"))?
        .trim()
        .parse()
        .ok()
}

/// The environment variable `name` parsed, else `default`.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What `through` adds to the median latency of `direct`, in ms.
fn p50_added(through: &Run, direct: &Run) -> f64 {
    ms(through.p50.saturating_sub(direct.p50))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// User + system CPU time of a process so far, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn rss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The connection counts to measure: `LOAD_CONNS` (comma-separated), else 32 and 1.
fn conn_counts() -> Vec<usize> {
    std::env::var("LOAD_CONNS")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|c| c.trim().parse().ok())
                .collect::<Vec<_>>()
        })
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| vec![32, 1])
}

fn main() {
    let port = |name: &str| std::env::var(name).unwrap().parse::<u16>().unwrap();
    match std::env::var("LOAD_ROLE").as_deref() {
        Ok("upstream") => return serve_own_upstream(port("LOAD_PORT")),
        Ok("floor") => {
            let with_reqwest = std::env::var("LOAD_FLOOR_CLIENT").as_deref() == Ok("reqwest");
            return serve_floor(port("LOAD_PORT"), port("LOAD_UPSTREAM_PORT"), with_reqwest);
        }
        _ => {}
    }
    match std::env::var("LOAD_ONLY").as_deref() {
        Ok("rss") => return rss_over_a_long_run(),
        Ok("slow_bodies") => return slow_bodies(),
        Ok("bodies") => return big_bodies(),
        Ok("publish") => return publish(),
        _ => {}
    }
    // `cargo test --bench` passes harness flags; `cargo bench` passes `--bench`.
    let secs: f64 = env_or("LOAD_SECONDS", 5.0);
    let alternations: usize = env_or("LOAD_ALTERNATIONS", 3);
    // Held open for the whole run: the request lasts while the file is open.
    let _awake = keep_awake();
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().to_path_buf();
    let (up, px, gw) = (free_port(), free_port(), free_port());
    let nginx = has_nginx();
    let upstream = if nginx {
        start_nginx(&dir, up, px)
    } else {
        start_own_upstream(up)
    };
    let nginx_meter = if nginx {
        Meter::Tree(upstream.0.id())
    } else {
        Meter::None
    };
    let (gateway, key) = start_gateway(&dir, up, gw, 4);
    let (fh, fr) = (free_port(), free_port());
    let floors = [
        ("hyper", start_floor(fh, up, "hyper"), fh),
        ("reqwest", start_floor(fr, up, "reqwest"), fr),
    ];
    let (direct, via_nginx) = (Target::backend(up), Target::backend(px));
    let via_gateway = Target::gateway(gw, &key);
    // One client thread, as `wrk -t1`.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        wait_serving(&via_gateway, &dir).await;
        let rss_idle = rss_kb(gateway.0.id());
        println!(
            "{EVENTS}-event SSE answer, {secs} s per measurement, one client thread; upstream: {}",
            if nginx { "nginx return 200" } else { "this program (nginx not installed)" }
        );
        println!(
            "{:>11} | {:>14} | {:>16} | {:>5} | {:>11} | {:>13} | {:>12} | {:>16}",
            "connections", "nginx adds p50", "gateway adds p50", "ratio", "nginx req/s", "gateway req/s", "direct req/s", "gateway adds p99"
        );
        for conns in conn_counts() {
            // nginx serves as the upstream in every run: what it spends proxying is its CPU
            // per answer through its proxy less its CPU per answer served directly.
            let d = measure(&direct, conns, secs, nginx_meter).await;
            let n = if nginx { Some(measure(&via_nginx, conns, secs, nginx_meter).await) } else { None };
            let g = measure(&via_gateway, conns, secs, Meter::Process(gateway.0.id())).await;
            let added = |r: &Run| p50_added(r, &d);
            let nginx_adds = n.as_ref().map(added);
            let gw_adds = added(&g);
            println!(
                "{:>11} | {:>14} | {:>13.3} ms | {:>5} | {:>11} | {:>13.0} | {:>12.0} | {:>13.3} ms",
                conns,
                nginx_adds.map_or("–".into(), |a| format!("{a:.3} ms")),
                gw_adds,
                nginx_adds.filter(|a| *a > 0.0).map_or("–".into(), |a| format!("{:.1}x", gw_adds / a)),
                n.as_ref().map_or("–".into(), |n| format!("{:.0}", n.rps)),
                g.rps,
                d.rps,
                ms(g.p99.saturating_sub(d.p99)),
            );
            if let Some(n) = &n {
                let nginx_cpu = n.cpu_us.zip(d.cpu_us).map(|(n, d)| n - d);
                let per = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
                println!(
                    "{:>11}   gateway throughput / nginx = {:.0}%; per answer: nginx proxying CPU {}, gateway CPU {}, {} writes; core sleeps direct {}, nginx {}, gateway {}{}",
                    "",
                    g.rps / n.rps * 100.0,
                    nginx_cpu.map_or("–".into(), |us| format!("{us:.0} µs")),
                    g.cpu_us.map_or("–".into(), |us| format!("{us:.0} µs")),
                    g.writes.map_or("–".into(), |w| format!("{w:.2}")),
                    per(d.sleeps),
                    per(n.sleeps),
                    per(g.sleeps),
                    if d.bad + n.bad + g.bad > 0 {
                        format!(" (incomplete answers: direct {}, nginx {}, gateway {})", d.bad, n.bad, g.bad)
                    } else {
                        String::new()
                    }
                );
            }
            let mut floor = Vec::new();
            for (client, proc, port) in &floors {
                let t = Target::backend(*port);
                let f = measure(&t, conns, secs, Meter::Process(proc.0.id())).await;
                floor.push(format!(
                    "{client} client adds {:.3} ms, {:.0} req/s, {} core sleeps, CPU {}",
                    added(&f),
                    f.rps,
                    f.sleeps.map_or("–".into(), |v| format!("{v:.2}")),
                    f.cpu_us.map_or("–".into(), |us| format!("{us:.0} µs"))
                ));
            }
            println!("{:>11}   floor, a bare pass-through on the same stack: {}", "", floor.join("; "));
            // The CPU target's ratio, the gateway's CPU per answer over the hyper floor's, and
            // the latency each adds to the upstream's, measured alternately (direct, gateway,
            // floor): the machine's drift from one measurement to the next falls on all alike,
            // and one disturbed measurement moves the median little.
            let (_, hyper_floor, hyper_port) = &floors[0];
            let floor_target = Target::backend(*hyper_port);
            let mut cpu = Vec::new();
            let (mut gw_added, mut floor_added) = (Vec::new(), Vec::new());
            for _ in 0..alternations {
                let d = measure(&direct, conns, secs, Meter::None).await;
                let g = measure(&via_gateway, conns, secs, Meter::Process(gateway.0.id())).await;
                let f = measure(&floor_target, conns, secs, Meter::Process(hyper_floor.0.id())).await;
                cpu.extend(g.cpu_us.zip(f.cpu_us));
                gw_added.push(p50_added(&g, &d));
                floor_added.push(p50_added(&f, &d));
            }
            if !cpu.is_empty() {
                let pairs: Vec<String> = cpu.iter().map(|(g, f)| format!("{g:.0}/{f:.0}")).collect();
                let ratios: Vec<f64> = cpu.iter().map(|(g, f)| g / f).collect();
                println!(
                    "{:>11}   CPU per answer, gateway / hyper floor, alternating: {} µs; ratios {} (median {:.2}x)",
                    "",
                    pairs.join(", "),
                    ratios.iter().map(|r| format!("{r:.2}x")).collect::<Vec<_>>().join(", "),
                    median(ratios)
                );
            }
            if !gw_added.is_empty() {
                let list = |v: &[f64]| v.iter().map(|a| format!("{a:.3}")).collect::<Vec<_>>().join(", ");
                println!(
                    "{:>11}   p50 added to direct, alternating: gateway {} ms (median {:.3} ms); hyper floor {} ms (median {:.3} ms)",
                    "",
                    list(&gw_added),
                    median(gw_added.clone()),
                    list(&floor_added),
                    median(floor_added.clone())
                );
            }
        }
        println!(
            "gateway RSS: {} KB idle with 4 accounts after start, {} KB after the load",
            rss_idle.unwrap_or(0),
            rss_kb(gateway.0.id()).unwrap_or(0)
        );
    });
    drop(gateway);
    // Long answers at once, through a gateway in front of an upstream that paces them (this
    // program's own): what the gateway adds to each event's delay, and its memory.
    let long_streams: usize = env_or("LOAD_STREAMS", 1000);
    let paced_port = free_port();
    let _paced = start_own_upstream(paced_port);
    let streams_dir = dir.join("streams");
    std::fs::create_dir_all(&streams_dir).unwrap();
    let sgw_port = free_port();
    let (sgw, skey) = start_gateway(&streams_dir, paced_port, sgw_port, 4);
    let paced_direct = Target::backend(paced_port);
    let paced_gateway = Target::gateway(sgw_port, &skey);
    rt.block_on(async {
        wait_serving(&paced_gateway, &streams_dir).await;
        let (dp50, dp99, dbad) = streams(&paced_direct, long_streams).await;
        let sampler = {
            let pid = sgw.0.id();
            tokio::spawn(async move {
                let mut peak = 0;
                for _ in 0..40 {
                    peak = peak.max(rss_kb(pid).unwrap_or(0));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                peak
            })
        };
        let cpu_before = cpu_ticks(sgw.0.id());
        let (gp50, gp99, gbad) = streams(&paced_gateway, long_streams).await;
        // The gateway's CPU over the streamed answers, per answer (in clock ticks of 10 ms:
        // read over a thousand answers or more).
        let cpu = cpu_before
            .zip(cpu_ticks(sgw.0.id()))
            .map(|(a, b)| (b - a) as f64 * 10_000.0 / long_streams as f64);
        let peak = sampler.await.unwrap_or(0);
        println!(
            "{long_streams} long answers at once ({} deltas {} ms apart, started over 1 s): delay per event p50/p99 direct {:.2}/{:.2} ms, through the gateway {:.2}/{:.2} ms (adds {:.2} ms at p99); gateway CPU {} per answer; gateway peak RSS {} KB{}",
            EVENTS - 5,
            PACE.as_millis(),
            ms(dp50),
            ms(dp99),
            ms(gp50),
            ms(gp99),
            ms(gp99.saturating_sub(dp99)),
            cpu.map_or("–".into(), |us| format!("{us:.0} µs")),
            peak,
            if dbad + gbad > 0 {
                format!(" (incomplete: direct {dbad}, gateway {gbad})")
            } else {
                String::new()
            }
        );
    });
    drop(sgw);
    // An idle daemon with 50 accounts: its memory, and the CPU it uses doing nothing.
    let idle_dir = dir.join("idle");
    std::fs::create_dir_all(&idle_dir).unwrap();
    let (idle, _) = start_gateway(&idle_dir, up, free_port(), 50);
    let idle_secs: u64 = env_or("LOAD_IDLE_SECONDS", 10);
    // Let it settle (account probes, the first usage polls), then watch it.
    std::thread::sleep(Duration::from_secs(3));
    let (t0, at) = (cpu_ticks(idle.0.id()).unwrap_or(0), Instant::now());
    std::thread::sleep(Duration::from_secs(idle_secs));
    let used = cpu_ticks(idle.0.id()).unwrap_or(0).saturating_sub(t0);
    println!(
        "idle daemon with 50 accounts: RSS {} KB; CPU {} ticks (1/100 s) in {:.0} s = {:.2}% of one core",
        rss_kb(idle.0.id()).unwrap_or(0),
        used,
        at.elapsed().as_secs_f64(),
        used as f64 / at.elapsed().as_secs_f64()
    );
    let _ = std::io::stdout().flush();
}
