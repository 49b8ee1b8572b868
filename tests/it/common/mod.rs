//! Test peers and helpers: the real `switchyard` binary as a child process, readiness by its
//! `READY=1` notification, and a minimal blocking HTTP/1.1 client for TCP and Unix sockets.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use switchyard::sim::auth::{AuthSpec, auth_json};

pub mod gw;
pub mod proxies;
pub mod sim;
pub mod sse;

pub const BIN: &str = env!("CARGO_BIN_EXE_switchyard");

/// How long a test waits for a signal (from the daemon, the gateway or a command it runs)
/// before failing: a guard against a hang, not a sleep (the wait ends as soon as the signal
/// arrives).
pub const SIGNAL_DEADLINE: Duration = Duration::from_secs(60);

pub fn spec(n: u32, tag: &str) -> AuthSpec {
    AuthSpec {
        email: format!("user{n}@example.com"),
        chatgpt_account_id: format!("acc-{n:04}"),
        chatgpt_user_id: format!("user-{n}"),
        plan: if n.is_multiple_of(2) {
            "pro".into()
        } else {
            "plus".into()
        },
        access_exp: 2_000_000_000,
        token_tag: format!("{tag}-{n}-SECRETTAG"),
    }
}

/// Writes the auth.json of simulated account `n` into `dir`.
pub fn write_auth(dir: &Path, n: u32, tag: &str) -> PathBuf {
    let path = dir.join(format!("auth{n}.json"));
    std::fs::write(&path, auth_json(&spec(n, tag)).to_string()).unwrap();
    path
}

/// Runs the CLI to completion with extra environment variables.
pub fn cli(state_dir: &Path, args: &[&str]) -> Output {
    cli_env(state_dir, args, &[])
}

pub fn cli_env(state_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("--state-dir").arg(state_dir).args(args);
    clean_env(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).output().unwrap()
}

/// `cli` with `input` on its stdin.
pub fn cli_stdin(state_dir: &Path, args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut cmd = Command::new(BIN);
    cmd.arg("--state-dir").arg(state_dir).args(args);
    clean_env(&mut cmd);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// Removes the variables of an enclosing systemd session so tests see only their own.
pub fn clean_env(cmd: &mut Command) {
    for var in [
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        "STATE_DIRECTORY",
        "RUNTIME_DIRECTORY",
        "SWITCHYARD_CONFIG",
        "SWITCHYARD_STATE_DIR",
        "SWITCHYARD_LISTEN",
        "RUST_LOG",
        "LISTEN_PID",
        "LISTEN_FDS",
        "LISTEN_FDNAMES",
    ] {
        cmd.env_remove(var);
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts a command failed with exactly one line on stderr containing every needle.
pub fn assert_one_line_error(o: &Output, needles: &[&str]) {
    assert!(
        !o.status.success(),
        "expected failure, got {:?}\nstdout: {}",
        o.status,
        stdout(o)
    );
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one error line, got:\n{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    for n in needles {
        assert!(lines[0].contains(n), "`{n}` not in: {}", lines[0]);
    }
}

/// A `switchyard serve` child process.
pub struct Daemon {
    pub child: Child,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    pub http: SocketAddr,
    notify: UnixDatagram,
    _notify_dir: tempfile::TempDir,
    pub log: PathBuf,
}

#[derive(Default)]
pub struct DaemonOptions<'a> {
    pub config: Option<&'a Path>,
    pub env: Vec<(&'a str, String)>,
    /// Where the config puts the admin socket, when not in the state dir.
    pub socket: Option<PathBuf>,
    /// Run as this user (and group) id; the test must run as root.
    pub uid: Option<u32>,
    /// Hand this listener over as systemd does (socket activation): as fd 3, with
    /// `LISTEN_FDS=1`, `LISTEN_FDNAMES=http` and `LISTEN_PID` = the daemon's own pid (a shell
    /// moves it from stdin to fd 3 and execs the daemon, keeping its pid).
    pub activation: Option<std::net::TcpListener>,
    /// Start it under this open-file limit (soft and hard: a shell's `ulimit -n N`).
    pub open_file_limit: Option<u64>,
}

impl Daemon {
    pub fn start(state_dir: &Path) -> Daemon {
        Self::start_with(state_dir, DaemonOptions::default())
    }

    /// Starts the daemon and returns once it has sent `READY=1`.
    pub fn start_with(state_dir: &Path, opts: DaemonOptions<'_>) -> Daemon {
        match Self::try_start_with(state_dir, opts) {
            Ok(d) => d,
            Err((status, log)) => panic!("the daemon exited ({status:?}) before READY=1:\n{log}"),
        }
    }

    /// Starts the daemon: `Ok` once it has sent `READY=1` and answers on its admin socket,
    /// `Err` with its exit status and its stderr when it exits first.
    pub fn try_start_with(
        state_dir: &Path,
        opts: DaemonOptions<'_>,
    ) -> Result<Daemon, (ExitStatus, String)> {
        let notify_dir = tempfile::tempdir().unwrap();
        let notify_path = notify_dir.path().join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        notify.set_read_timeout(Some(SIGNAL_DEADLINE)).unwrap();
        let log = state_dir.with_extension(format!("log{}", std::process::id()));
        let _ = std::fs::create_dir_all(state_dir.parent().unwrap());
        let mut script = String::new();
        if let Some(n) = opts.open_file_limit {
            script.push_str(&format!("ulimit -n {n} || exit 97; "));
        }
        if opts.activation.is_some() {
            script.push_str(
                "exec 3<&0 0</dev/null; export LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=http; ",
            );
        }
        let mut cmd = if script.is_empty() {
            Command::new(BIN)
        } else {
            let mut sh = Command::new("sh");
            sh.arg("-c").arg(script + "exec \"$0\" \"$@\"").arg(BIN);
            sh
        };
        clean_env(&mut cmd);
        cmd.arg("--state-dir").arg(state_dir);
        if let Some(c) = opts.config {
            cmd.arg("--config").arg(c);
        }
        let stdin = match opts.activation {
            Some(l) => Stdio::from(std::os::fd::OwnedFd::from(l)),
            None => Stdio::null(),
        };
        cmd.args(["serve", "--listen", "127.0.0.1:0"])
            .env("NOTIFY_SOCKET", &notify_path)
            .env("RUST_LOG", "info")
            .stdin(stdin)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        if let Some(uid) = opts.uid {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
        }
        let child = cmd.spawn().unwrap();
        let mut d = Daemon {
            child,
            state_dir: state_dir.to_path_buf(),
            socket: opts
                .socket
                .clone()
                .unwrap_or_else(|| state_dir.join("admin.sock")),
            http: "127.0.0.1:1".parse().unwrap(),
            notify,
            _notify_dir: notify_dir,
            log,
        };
        // Short waits for the notification, so an early exit is seen as soon as it happens.
        d.notify
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let deadline = std::time::Instant::now() + SIGNAL_DEADLINE;
        let mut buf = [0u8; 256];
        loop {
            if let Ok(n) = d.notify.recv(&mut buf)
                && String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .any(|l| l == "READY=1")
            {
                break;
            }
            if let Some(status) = d.child.try_wait().unwrap() {
                return Err((status, d.log_text()));
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no READY=1 within {SIGNAL_DEADLINE:?}:\n{}",
                d.log_text()
            );
        }
        d.notify.set_read_timeout(Some(SIGNAL_DEADLINE)).unwrap();
        let status = d.admin("GET", "/api/admin/status", None);
        assert_eq!(status.0, 200, "{}", status.1);
        d.http = status.json()["listen"].as_str().unwrap().parse().unwrap();
        Ok(d)
    }

    /// Waits for the next notification and checks it.
    pub fn expect_notify(&mut self, expected: &str) {
        let mut buf = [0u8; 256];
        let n = self.notify.recv(&mut buf).unwrap_or_else(|e| {
            panic!(
                "no `{expected}` notification: {e}\nlog:\n{}",
                self.log_text()
            )
        });
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(
            msg.lines().any(|l| l == expected),
            "expected {expected}, got {msg}"
        );
    }

    pub fn admin(&self, method: &str, path: &str, body: Option<&str>) -> HttpResponse {
        http_unix(&self.socket, method, path, &[], body)
    }

    pub fn get(&self, path: &str) -> HttpResponse {
        http_tcp(self.http, "GET", path, &[], None)
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// SIGTERM, then waits for the `STOPPING=1` notification (reload notifications before it
    /// are passed over) and the exit.
    pub fn terminate(mut self) -> ExitStatus {
        self.signal("TERM");
        let mut buf = [0u8; 256];
        loop {
            let n = self
                .notify
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("no `STOPPING=1`: {e}\nlog:\n{}", self.log_text()));
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            if msg.lines().any(|l| l == "STOPPING=1") {
                break;
            }
            assert!(
                msg.lines().all(|l| l == "RELOADING=1" || l == "READY=1"),
                "expected STOPPING=1, got {msg}"
            );
        }
        self.child.wait().unwrap()
    }

    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

#[derive(Debug, Clone)]
pub struct HttpResponse(pub u16, pub String, pub Vec<(String, String)>);

impl HttpResponse {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.1).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.1))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.2
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn exchange<S: Read + Write>(
    mut s: S,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> HttpResponse {
    let body = body.unwrap_or("");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad response: {text}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        String::from_utf8_lossy(&dechunk(body.as_bytes())).into_owned()
    } else {
        body.to_string()
    };
    HttpResponse(status, body, headers)
}

/// The body of a chunked HTTP/1.1 answer.
pub fn dechunk(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = raw;
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .unwrap_or(0);
        rest = &rest[eol + 2..];
        if size == 0 || rest.len() < size {
            break;
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[(size + 2).min(rest.len())..];
    }
    out
}

/// A client socket that takes little: its receive buffer is as small as the kernel allows.
pub async fn small_socket(addr: SocketAddr) -> tokio::net::TcpStream {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.connect(addr).await.unwrap()
}

/// Reads an answer's head, byte by byte (nothing of the body is taken).
pub async fn read_head(s: &mut tokio::net::TcpStream) -> String {
    try_read_head(s)
        .await
        .unwrap_or_else(|head| panic!("closed before the head: {head:?}"))
}

/// [`read_head`], or what came of it when the peer closed before its end.
pub async fn try_read_head(s: &mut tokio::net::TcpStream) -> Result<String, Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.unwrap() == 0 {
            return Err(head);
        }
        head.push(byte[0]);
    }
    Ok(String::from_utf8(head).unwrap())
}

pub fn http_tcp(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> HttpResponse {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(SIGNAL_DEADLINE)).unwrap();
    exchange(s, method, path, headers, body)
}

pub fn http_unix(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> HttpResponse {
    let s =
        UnixStream::connect(socket).unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
    s.set_read_timeout(Some(SIGNAL_DEADLINE)).unwrap();
    exchange(s, method, path, headers, body)
}
