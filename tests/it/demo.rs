//! `switchyard demo --no-console`: the real binary, watched through its admin socket until every
//! part of the show has happened, then stopped by a signal; nothing may be left behind.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{BIN, SIGNAL_DEADLINE, clean_env};
use axum::http::Method;
use switchyard_admin::AdminClient;
use switchyard_admin::wire::{Account, RequestRecord};

/// How long the demo gets to show everything (it takes a few seconds; the margin is for a
/// loaded machine).
const SHOW_DEADLINE: Duration = Duration::from_secs(90);

/// A `switchyard demo --no-console` child with its own `TMPDIR`.
struct Demo {
    /// Taken by `wait`.
    child: Option<Child>,
    /// `gateway`, `admin`, `key`, `state`, `log` -> value, from its stdout.
    endpoints: BTreeMap<String, String>,
    tmpdir: tempfile::TempDir,
    stderr: PathBuf,
    _stderr_dir: tempfile::TempDir,
}

impl Demo {
    /// Starts the demo and returns once it has printed its endpoints.
    fn start(args: &[&str]) -> Demo {
        let tmpdir = tempfile::tempdir().unwrap();
        let stderr_dir = tempfile::tempdir().unwrap();
        let stderr = stderr_dir.path().join("stderr");
        let mut cmd = Command::new(BIN);
        clean_env(&mut cmd);
        cmd.args(["demo", "--no-console"])
            .args(args)
            .env("TMPDIR", tmpdir.path())
            .env_remove("SWITCHYARD_DEMO_DURATION")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap());
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        // Read on a thread, so a demo that never gets ready fails the test at the deadline.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut endpoints = BTreeMap::new();
        while endpoints.len() < 5 {
            let line = rx.recv_timeout(SIGNAL_DEADLINE).unwrap_or_else(|e| {
                panic!(
                    "no endpoints from the demo ({e}); got {endpoints:?}\nstderr:\n{}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                )
            });
            let (name, value) = line
                .split_once(' ')
                .unwrap_or_else(|| panic!("not `NAME VALUE`: {line}"));
            endpoints.insert(name.to_string(), value.to_string());
        }
        Demo {
            child: Some(child),
            endpoints,
            tmpdir,
            stderr,
            _stderr_dir: stderr_dir,
        }
    }

    fn endpoint(&self, name: &str) -> &str {
        self.endpoints
            .get(name)
            .unwrap_or_else(|| panic!("no `{name}` line in {:?}", self.endpoints))
    }

    fn socket(&self) -> PathBuf {
        PathBuf::from(self.endpoint("admin"))
    }

    fn state(&self) -> PathBuf {
        PathBuf::from(self.endpoint("state"))
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("the demo was waited for").id()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Waits for the exit, at most `SIGNAL_DEADLINE`.
    async fn wait(&mut self) -> ExitStatus {
        let pid = self.pid();
        let mut child = self.child.take().expect("the demo was waited for");
        let waited = tokio::task::spawn_blocking(move || child.wait());
        match tokio::time::timeout(SIGNAL_DEADLINE, waited).await {
            Ok(status) => status.unwrap().unwrap(),
            Err(_) => {
                let _ = Command::new("kill")
                    .arg("-KILL")
                    .arg(pid.to_string())
                    .status();
                panic!("the demo did not exit\nstderr:\n{}", self.stderr_text())
            }
        }
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Entries the demo left in its `TMPDIR`.
    fn leftovers(&self) -> Vec<String> {
        std::fs::read_dir(self.tmpdir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What the demo has shown so far (each item, once seen, stays seen).
#[derive(Debug, Default)]
struct Shown {
    sse: bool,
    ws: bool,
    quota: bool,
    rate_limited: bool,
    stream_drop: bool,
    cooling: bool,
    reused: bool,
    queue_wait: bool,
}

impl Shown {
    fn all(&self) -> bool {
        self.sse
            && self.ws
            && self.quota
            && self.rate_limited
            && self.stream_drop
            && self.cooling
            && self.reused
            && self.queue_wait
    }

    fn take(&mut self, records: &[RequestRecord], accounts: &[Account]) {
        for r in records {
            self.sse |= !r.ws && r.transport.as_str() == "http";
            self.ws |= r.ws;
            self.reused |= r.affinity.name() == "reused";
            self.queue_wait |= r
                .queue
                .as_ref()
                .is_some_and(|q| q.outcome.as_str() == "acquired");
            self.stream_drop |= r.outcome.as_str() == "stream_error";
            for a in &r.attempts {
                self.quota |= a.class.as_str() == "quota";
                self.rate_limited |= a.class.as_str() == "rate_limited";
                self.stream_drop |= a.phase.as_ref().map(|p| p.as_str()) == Some("mid_stream");
            }
        }
        self.cooling |= accounts.iter().any(|a| a.state.as_str() == "cooling");
    }
}

async fn admin_get<T: serde::de::DeserializeOwned>(socket: &Path, path: &str) -> T {
    AdminClient::connect(socket)
        .await
        .unwrap()
        .call(Method::GET, path, None)
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_shows_every_pane_moving_and_leaves_nothing_behind() {
    let mut demo = Demo::start(&[]);
    let state = demo.state();
    assert!(
        state.starts_with(demo.tmpdir.path()),
        "{} is not under TMPDIR",
        state.display()
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    assert!(demo.socket().starts_with(&state));
    assert!(demo.endpoint("gateway").starts_with("http://127.0.0.1:"));
    assert!(demo.endpoint("key").starts_with("sk-sy-"));
    assert!(Path::new(demo.endpoint("log")).starts_with(&state));

    let socket = demo.socket();
    let mut shown = Shown::default();
    let deadline = tokio::time::Instant::now() + SHOW_DEADLINE;
    while !shown.all() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the demo did not show everything: {shown:?}\nstderr:\n{}",
            demo.stderr_text()
        );
        let records: Vec<RequestRecord> = admin_get(&socket, "/api/admin/requests?limit=500").await;
        let accounts: Vec<Account> = admin_get(&socket, "/api/admin/accounts").await;
        shown.take(&records, &accounts);
        if !shown.all() {
            // A poll interval, not a synchronisation: the loop ends on what the daemon shows.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    demo.signal("TERM");
    let status = demo.wait().await;
    assert!(
        status.success(),
        "exit {status:?}\nstderr:\n{}",
        demo.stderr_text()
    );
    assert!(!state.exists(), "{} was left behind", state.display());
    assert!(
        demo.leftovers().is_empty(),
        "left in TMPDIR: {:?}",
        demo.leftovers()
    );
    assert_eq!(demo.stderr_text(), "", "the demo wrote to the terminal");
}

#[tokio::test]
async fn a_demo_with_a_duration_stops_by_itself_and_cleans_up() {
    let mut demo = Demo::start(&["--duration", "1s"]);
    let state = demo.state();
    let status = demo.wait().await;
    assert!(
        status.success(),
        "exit {status:?}\nstderr:\n{}",
        demo.stderr_text()
    );
    assert!(!state.exists(), "{} was left behind", state.display());
    assert!(demo.leftovers().is_empty(), "{:?}", demo.leftovers());
}
