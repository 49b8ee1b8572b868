//! Damaged state: no input file makes the daemon or a command panic. Every failure to open or
//! read the store is one line naming the file and the remedy; a record that cannot be read is
//! quarantined (counted, logged with its key) and the rest serves; commands that only read never
//! rewrite the file.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;
use crate::common::{Daemon, DaemonOptions, assert_one_line_error, cli, stderr, stdout};
use switchyard::store::Store;
use switchyard::store::schema::Table;
use switchyard::store::writer::{Key, Mutation};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-0.3.0")
}

/// A private copy of a release's state directory (accounts, tokens, keys, usage, records).
fn state_copy(tmp: &Path) -> PathBuf {
    let dir = tmp.join("state");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    for f in ["switchyard.redb", "secret.key"] {
        std::fs::copy(fixture().join(f), dir.join(f)).unwrap();
        std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    dir
}

fn db(dir: &Path) -> PathBuf {
    dir.join("switchyard.redb")
}

/// A panic anywhere is what this file exists to rule out.
fn assert_no_panic(o: &Output, what: &str) {
    let err = stderr(o);
    assert_ne!(o.status.code(), Some(101), "{what} panicked:\n{err}");
    assert!(!err.contains("panicked"), "{what} panicked:\n{err}");
}

/// splitmix64: the positions are random, and the same on every run.
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[test]
fn a_truncated_store_is_one_line_naming_the_file_and_the_remedy() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_copy(tmp.path());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(db(&dir))
        .unwrap();
    f.set_len(40_000).unwrap();
    let path = db(&dir).display().to_string();
    let out = cli(&dir, &["serve", "--listen", "127.0.0.1:0"]);
    assert_no_panic(&out, "serve");
    assert_one_line_error(&out, &[&path, "damaged", "truncated", "restore a backup"]);
    // A command that only reads says the same, without repairing anything.
    let before = std::fs::read(db(&dir)).unwrap();
    let out = cli(&dir, &["account", "list"]);
    assert_no_panic(&out, "account list");
    assert_one_line_error(&out, &[&path, "damaged", "truncated", "restore a backup"]);
    assert_eq!(std::fs::read(db(&dir)).unwrap(), before);
}

#[test]
fn flipped_bytes_at_fifty_random_positions_never_panic() {
    let len = std::fs::metadata(db(&fixture())).unwrap().len();
    let mut rng = Seeded(0x5717_c4a2_d15e_0015);
    let (mut served, mut refused) = (0, 0);
    for round in 0..50 {
        let pos = rng.next() % len;
        let flip = (rng.next() % 255 + 1) as u8;
        let tmp = tempfile::tempdir().unwrap();
        let dir = state_copy(tmp.path());
        let mut bytes = std::fs::read(db(&dir)).unwrap();
        bytes[usize::try_from(pos).unwrap()] ^= flip;
        std::fs::write(db(&dir), &bytes).unwrap();
        let what = format!("round {round}: byte {pos} ^ {flip:#04x}");
        let path = db(&dir).display().to_string();

        // A command that only reads: its listing, or one line naming the file.
        let out = cli(&dir, &["key", "list"]);
        assert_no_panic(&out, &what);
        if !out.status.success() {
            assert_one_line_error(&out, &[&path]);
        }
        assert_eq!(
            std::fs::read(db(&dir)).unwrap(),
            bytes,
            "{what}: a read-only command wrote"
        );

        // The daemon: serving (what cannot be read quarantined), or one line naming the file.
        match Daemon::try_start_with(&dir, DaemonOptions::default()) {
            Ok(d) => {
                assert_eq!(d.get("/healthz").0, 200, "{what}");
                assert!(d.terminate().success(), "{what}");
                served += 1;
            }
            Err((status, log)) => {
                assert_ne!(status.code(), Some(101), "{what} panicked:\n{log}");
                assert!(!log.contains("panicked"), "{what} panicked:\n{log}");
                let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error: ")).collect();
                assert_eq!(errors.len(), 1, "{what}: {log}");
                assert!(errors[0].contains(&path), "{what}: {}", errors[0]);
                refused += 1;
            }
        }
    }
    // The file has free pages as well as live ones: both outcomes happen.
    assert!(
        served > 0 && refused > 0,
        "served {served}, refused {refused}"
    );
}

#[test]
fn a_missing_or_wrong_key_is_refused_and_the_store_left_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_copy(tmp.path());
    let before = std::fs::read(db(&dir)).unwrap();
    let key = dir.join("secret.key");
    let original = std::fs::read(&key).unwrap();

    std::fs::remove_file(&key).unwrap();
    for args in [
        &["serve", "--listen", "127.0.0.1:0"][..],
        &["account", "list"],
    ] {
        let out = cli(&dir, args);
        assert_one_line_error(&out, &[&key.display().to_string(), "missing", "backup"]);
    }
    assert!(!key.exists(), "a missing key must not be replaced");

    std::fs::write(&key, [7u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    for args in [&["serve", "--listen", "127.0.0.1:0"][..], &["key", "list"]] {
        let out = cli(&dir, args);
        assert_one_line_error(
            &out,
            &[&key.display().to_string(), "does not match", "same backup"],
        );
    }
    assert_eq!(
        std::fs::read(db(&dir)).unwrap(),
        before,
        "a failed open rewrote the store"
    );

    std::fs::write(&key, &original).unwrap();
    let d = Daemon::start(&dir);
    assert!(d.terminate().success());
}

/// The id `nobody` has on Debian; a directory it cannot write is one it does not own.
const NOBODY: u32 = 65534;

fn running_as_root() -> bool {
    let out = std::process::Command::new("id").arg("-u").output().unwrap();
    stdout(&out).trim() == "0"
}

#[test]
fn an_unwritable_state_dir_or_unreadable_store_is_one_line_with_the_remedy() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = state_copy(tmp.path());
    // Root may write anywhere: the daemon runs as another user, as the service does. (Run
    // as that user, the test itself cannot make a directory it could not write.)
    let as_other: Option<u32> = if running_as_root() {
        Some(NOBODY)
    } else {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o500)).unwrap();
        None
    };
    if as_other.is_some() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let run = |args: &[&str]| {
        let mut cmd = std::process::Command::new(common::BIN);
        common::clean_env(&mut cmd);
        cmd.arg("--state-dir").arg(&dir).args(args);
        if let Some(uid) = as_other {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
        }
        cmd.stdin(std::process::Stdio::null()).output().unwrap()
    };
    let out = run(&["serve", "--listen", "127.0.0.1:0"]);
    assert_no_panic(&out, "serve");
    assert_one_line_error(
        &out,
        &[
            &dir.display().to_string(),
            "not usable",
            "writable by the user",
        ],
    );
    if as_other.is_some() {
        // A directory it may write, but a store it may not read.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let out = run(&["account", "list"]);
        assert_no_panic(&out, "account list");
        assert_one_line_error(
            &out,
            &[
                &db(&dir).display().to_string(),
                "Permission denied",
                "the user that owns",
            ],
        );
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
}

#[test]
fn a_second_daemon_on_the_same_state_dir_names_the_first() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let first = Daemon::start(&dir);
    let out = cli(&dir, &["serve", "--listen", "127.0.0.1:0"]);
    assert_one_line_error(
        &out,
        &[
            "already serves",
            &format!("pid {}", first.child.id()),
            &dir.display().to_string(),
            "stop it first",
        ],
    );
    assert!(!stderr(&out).contains("elsewhere"), "{}", stderr(&out));
    // Another state directory, the same admin socket: the socket is the conflict.
    let cfg = tmp.path().join("same-socket.toml");
    std::fs::write(
        &cfg,
        format!("[admin]\nsocket = \"{}\"\n", first.socket.display()),
    )
    .unwrap();
    let other = tmp.path().join("other");
    let out = cli(
        &other,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "serve",
            "--listen",
            "127.0.0.1:0",
        ],
    );
    assert_one_line_error(&out, &["already serving the admin socket"]);
    assert!(first.terminate().success());
}

#[test]
fn commands_that_only_read_leave_the_store_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_copy(tmp.path());
    let before = std::fs::read(db(&dir)).unwrap();
    let modified = std::fs::metadata(db(&dir)).unwrap().modified().unwrap();
    for args in [
        &["account", "list"][..],
        &["account", "list", "--json"],
        &["key", "list"],
        &["key", "show", "carol"],
        &["usage", "--since", "3650d", "--by", "key"],
    ] {
        let out = cli(&dir, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(!stdout(&out).is_empty(), "{args:?}");
    }
    assert_eq!(std::fs::read(db(&dir)).unwrap(), before);
    assert_eq!(
        std::fs::metadata(db(&dir)).unwrap().modified().unwrap(),
        modified
    );
    // A file a crash left unclosed is read from a repaired private copy, not repaired in place.
    let d = Daemon::start(&dir);
    d.kill9();
    let crashed = std::fs::read(db(&dir)).unwrap();
    let out = cli(&dir, &["key", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("carol"), "{}", stdout(&out));
    assert_eq!(std::fs::read(db(&dir)).unwrap(), crashed);
    // Where there is no store yet, nothing is created.
    let none = tmp.path().join("nothing-here");
    let out = cli(&none, &["key", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!none.exists());
}

#[test]
fn a_state_dir_open_to_others_is_warned_about() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_copy(tmp.path());
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = Daemon::start(&dir);
    let log = d.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("open to other users") && l.contains("0755")),
        "{log}"
    );
    assert!(d.terminate().success());
}

#[tokio::test]
async fn undecodable_records_are_quarantined_in_every_table_and_the_rest_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_copy(tmp.path());
    {
        let store = Store::open(&dir).unwrap();
        let garbage = |t: Table, k: &str| Mutation::Put(t, Key::Text(k.into()), vec![2, 0xff]);
        store
            .write(vec![
                // A client key whose record ends early, and an account's tokens likewise.
                garbage(Table::ClientKeys, "key_broken"),
                garbage(Table::AccountSecrets, "00508cd4"),
                garbage(Table::AccountHealth, "4528b16e"),
            ])
            .await
            .unwrap();
        store.close().await.unwrap();
    }
    let d = Daemon::start(&dir);
    // Everything else serves: the other keys are listed, every account is there.
    let keys = d.admin("GET", "/api/admin/keys", None).json();
    assert_eq!(keys.as_array().unwrap().len(), 3, "{keys}");
    let accounts = d.admin("GET", "/api/admin/accounts", None).json();
    assert_eq!(accounts.as_array().unwrap().len(), 5, "{accounts}");
    let metrics = d.get("/metrics").1;
    assert!(
        metrics
            .lines()
            .any(|l| l == "switchyard_store_undecodable_rows_total 3"),
        "{metrics}"
    );
    let log = d.log_text();
    for key in ["key_broken", "00508cd4", "4528b16e"] {
        assert!(
            log.lines()
                .any(|l| l.contains("cannot be decoded") && l.contains(key)),
            "{key} not logged:\n{log}"
        );
    }
    assert!(d.terminate().success());
}

#[test]
fn an_empty_a_short_or_a_directory_store_is_refused_by_serve_doctor_and_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_copy(tmp.path());
    let whole = std::fs::read(db(&dir)).unwrap();
    let path = db(&dir).display().to_string();
    let commands: [&[&str]; 5] = [
        &["serve", "--listen", "127.0.0.1:0"],
        &["account", "list"],
        &["key", "create", "late"],
        &["usage"],
        &["backup", "out.bak"],
    ];
    for (shape, said) in [
        ("empty", "empty"),
        ("short", "truncated to 100 bytes"),
        ("directory", "a directory"),
    ] {
        match shape {
            "empty" => std::fs::write(db(&dir), b"").unwrap(),
            "short" => std::fs::write(db(&dir), &whole[..100]).unwrap(),
            _ => {
                std::fs::remove_file(db(&dir)).unwrap();
                std::fs::create_dir(db(&dir)).unwrap();
            }
        }
        let before = std::fs::metadata(db(&dir)).unwrap();
        for args in commands {
            let out = cli(&dir, args);
            assert_no_panic(&out, args[0]);
            assert_one_line_error(&out, &[&path, said, "restore"]);
        }
        let out = cli(&dir, &["doctor", "--offline"]);
        assert_eq!(out.status.code(), Some(2), "{shape}: {}", stdout(&out));
        let report = stdout(&out);
        let finding = report
            .lines()
            .find(|l| l.starts_with("error") && l.contains(&path))
            .unwrap_or_else(|| panic!("{shape}: no error names the store:\n{report}"));
        assert!(
            finding.contains(said) && finding.contains("restore"),
            "{finding}"
        );
        // Nothing was created over it, nor written into it.
        let after = std::fs::metadata(db(&dir)).unwrap();
        assert_eq!(after.is_dir(), before.is_dir(), "{shape}");
        assert_eq!(after.len(), before.len(), "{shape}");
        if !after.is_dir() {
            assert_eq!(
                after.modified().unwrap(),
                before.modified().unwrap(),
                "{shape}"
            );
        }
    }
    assert!(!dir.join("out.bak").exists() && !Path::new("out.bak").exists());
}
