//! The README's walkthrough ("Try it without real accounts"), run as a newcomer pastes it: the
//! block as written, in one shell, in an empty directory — the simulator, the imports, a key,
//! the daemon, a fault, Codex CLI through the gateway, and what `account list` then says. Only
//! its first line (`cargo build --release`) is left out: `target/release/switchyard` in that
//! directory is this build's binary. The block binds the ports it names (8080, 9090): no other
//! test uses them.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{BIN, clean_env};

/// The walkthrough's shell block, from the README.
fn block() -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = readme
        .split_once("## Try it without real accounts")
        .expect("the README has its walkthrough")
        .1;
    let body = section.split_once("```sh\n").expect("a shell block").1;
    body.split_once("\n```")
        .expect("the block ends")
        .0
        .to_string()
}

#[test]
fn the_readme_walkthrough_runs_as_written_and_shows_a_failover() {
    let block = block();
    let (build, rest) = block.split_once('\n').unwrap();
    assert_eq!(
        build, "cargo build --release",
        "the block starts by building"
    );
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    std::os::unix::fs::symlink(BIN, release.join("switchyard")).unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let codex_dir = crate::real_clients::codex().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        codex_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Everything it started is stopped when it ends, whichever way it ends; a hang is cut.
    let script = format!(
        "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null' EXIT\n{rest}\n"
    );
    let mut cmd = Command::new("timeout");
    clean_env(&mut cmd);
    cmd.args(["120", "bash", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("HOME", &home)
        .env_remove("CODEX_HOME")
        .env_remove("OPENAI_API_KEY")
        .stdin(Stdio::null());
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the walkthrough failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // What its comments say: sim-acct-1 is cooling (quota)...
    let cooling = stdout
        .lines()
        .find(|l| l.contains("sim-acct-1") && l.contains("cooling"))
        .unwrap_or_else(|| panic!("sim-acct-1 is not cooling:\n{stdout}"));
    assert!(cooling.contains("quota"), "{cooling}");
    // ...and the request failed over: its record has sim-acct-1's quota, then a success.
    let records: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no request records:\n{stdout}"));
    let failed_over = records
        .as_array()
        .or_else(|| records["requests"].as_array())
        .unwrap_or_else(|| panic!("{records}"))
        .iter()
        .any(|r| {
            let a = r["attempts"].as_array().unwrap();
            a.len() >= 2
                && a[0]["account"] == "sim-acct-1"
                && a[0]["class"] == "quota"
                && a.last().unwrap()["class"] == "success"
        });
    assert!(
        failed_over,
        "no request failed over from sim-acct-1: {records}"
    );
}
