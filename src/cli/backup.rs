//! `switchyard backup FILE` and `switchyard restore FILE`: the commands around
//! `store::backup`. A backup goes through the daemon while it serves (its snapshot is one read
//! transaction), else it is taken from the store opened read-only; a restore needs the daemon
//! stopped, checks the backup and its key, stages the files beside the state directory's,
//! opens them with every check a start makes, and only then moves them into place.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use switchyard_admin::AdminClient;

use super::args::{BackupArgs, RestoreArgs};
use super::{CommandError, admin_socket, state_dir};
use crate::config::Config;
use crate::store::backup::{self, Manifest};
use crate::store::schema::SCHEMA_VERSION;
use crate::store::secrets::{self, KEY_FILE};
use crate::store::{DB_FILE, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("a daemon answers on {0}: stop it first (`systemctl stop switchyard`), then restore")]
    DaemonRunning(PathBuf),
    #[error(
        "the backup does not hold secret.key: pass --key FILE with the secret.key of the state \
         directory it was taken from (key id {0})"
    )]
    KeyNeeded(String),
    #[error("{path} does not match this backup (its key id is {found}; the backup needs {wanted})")]
    WrongKey {
        path: String,
        found: String,
        wanted: String,
    },
    #[error(
        "the state directory {dir} is not empty ({entries}); restore into an empty one, or pass \
         --force to replace its store and key"
    )]
    NotEmpty { dir: PathBuf, entries: String },
    #[error(
        "the backup has schema version {found}, newer than this binary supports ({supported}); \
         restore it with the newer switchyard"
    )]
    NewerSchema { found: u64, supported: u64 },
    #[error("{path}: {why}")]
    BadKeyFile { path: String, why: String },
}

fn write_err(path: &Path) -> impl Fn(std::io::Error) -> CommandError + '_ {
    move |source| CommandError::Write {
        path: path.display().to_string(),
        source,
    }
}

/// A file beside `file`, created 0600, renamed over it once complete.
fn partial(file: &Path) -> PathBuf {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "backup".into());
    file.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

fn create_private(path: &Path) -> Result<std::fs::File, CommandError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(write_err(path))
}

pub async fn backup(config: &Config, args: BackupArgs) -> Result<(), CommandError> {
    let tmp = partial(&args.file);
    let result = take(config, &args, &tmp).await;
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    std::fs::rename(&tmp, &args.file).map_err(write_err(&args.file))?;
    // Read back and checked, as a restore will.
    let b = backup::read(&args.file).map_err(CommandError::Backup)?;
    println!(
        "wrote {} ({} bytes of store, schema {}). {}",
        args.file.display(),
        b.manifest.store_bytes,
        b.manifest.schema,
        b.manifest.note()
    );
    Ok(())
}

async fn take(config: &Config, args: &BackupArgs, tmp: &Path) -> Result<(), CommandError> {
    let socket = admin_socket(config);
    if let Ok(client) = AdminClient::connect(&socket).await {
        let mut out = create_private(tmp)?;
        client.backup(args.include_key, &mut out).await?;
        return out.sync_all().map_err(write_err(tmp));
    }
    let dir = state_dir(config);
    if !dir.join(DB_FILE).exists() {
        return Err(CommandError::Usage(format!(
            "there is no store at {} to back up (wrong --config or --state-dir?)",
            dir.join(DB_FILE).display()
        )));
    }
    let store = Store::open_read_only(&dir).map_err(|e| match e {
        StoreError::Locked { path } => CommandError::LockedWithoutDaemon {
            path,
            socket: socket.clone(),
        },
        other => other.into(),
    })?;
    let snap = tmp.with_extension("snapshot");
    let taken = store.snapshot_to(&snap);
    let result = taken
        .map_err(CommandError::from)
        .and_then(|(mut manifest, _)| {
            let key = if args.include_key {
                Some(secrets::load_or_create_key(&dir, false)?)
            } else {
                None
            };
            manifest.key_included = key.is_some();
            let mut out = create_private(tmp)?;
            backup::write(&mut out, &manifest, &snap, key.as_ref()).map_err(write_err(tmp))?;
            out.sync_all().map_err(write_err(tmp))
        });
    let _ = std::fs::remove_file(&snap);
    store.close().await?;
    result
}

pub async fn restore(config: &Config, args: RestoreArgs) -> Result<(), CommandError> {
    let dir = state_dir(config);
    let socket = admin_socket(config);
    if AdminClient::connect(&socket).await.is_ok() {
        return Err(RestoreError::DaemonRunning(socket).into());
    }
    let b = backup::read(&args.file).map_err(CommandError::Backup)?;
    if b.manifest.schema > SCHEMA_VERSION {
        return Err(RestoreError::NewerSchema {
            found: b.manifest.schema,
            supported: SCHEMA_VERSION,
        }
        .into());
    }
    let (key, key_from) = restore_key(&b.manifest, b.key, args.key.as_deref(), &dir)?;
    let found = secrets::key_id(&key);
    if found != b.manifest.key_id {
        return Err(RestoreError::WrongKey {
            path: key_from,
            found,
            wanted: b.manifest.key_id.clone(),
        }
        .into());
    }
    let entries: Vec<String> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    if !entries.is_empty() && !args.force {
        return Err(RestoreError::NotEmpty {
            dir,
            entries: entries.join(", "),
        }
        .into());
    }
    crate::store::ensure_writable_dir(&dir)?;
    // Staged beside the live files (same file system, so the moves are renames) and opened
    // with every check a start makes before anything is replaced.
    let staging = dir.join(format!(".restore-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(write_err(&staging))?;
    let staged = stage(&staging, &b.store, &key).await;
    let counts = match staged {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    for f in [KEY_FILE, DB_FILE] {
        std::fs::rename(staging.join(f), dir.join(f)).map_err(write_err(&dir.join(f)))?;
    }
    let _ = std::fs::remove_dir_all(&staging);
    println!(
        "restored {} (taken {} by switchyard {}) into {}: {} accounts, {} client keys. Start \
         the daemon to serve it.",
        args.file.display(),
        b.manifest.created_at,
        b.manifest.version,
        dir.display(),
        counts.0,
        counts.1
    );
    Ok(())
}

/// The key to restore with: the backup's own, else `--key`, else the state directory's.
fn restore_key(
    manifest: &Manifest,
    included: Option<[u8; 32]>,
    flag: Option<&Path>,
    dir: &Path,
) -> Result<([u8; 32], String), CommandError> {
    if let Some(k) = included {
        return Ok((k, "the key in the backup".into()));
    }
    let path = match flag {
        Some(p) => p.to_path_buf(),
        None if dir.join(KEY_FILE).exists() => dir.join(KEY_FILE),
        None => return Err(RestoreError::KeyNeeded(manifest.key_id.clone()).into()),
    };
    let shown = path.display().to_string();
    let bytes = std::fs::read(&path).map_err(|source| CommandError::Read {
        path: shown.clone(),
        source,
    })?;
    let key: [u8; 32] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| RestoreError::BadKeyFile {
            path: shown.clone(),
            why: format!("a secret.key is 32 bytes, this is {}", bytes.len()),
        })?;
    Ok((key, shown))
}

/// Writes the store and key into `staging` and opens them there; returns (accounts, keys).
async fn stage(
    staging: &Path,
    store: &[u8],
    key: &[u8; 32],
) -> Result<(usize, usize), CommandError> {
    for (name, bytes) in [(DB_FILE, store), (KEY_FILE, key.as_slice())] {
        let path = staging.join(name);
        let mut f = create_private(&path)?;
        f.write_all(bytes).map_err(write_err(&path))?;
        f.sync_all().map_err(write_err(&path))?;
    }
    let opened = Store::open(staging)?;
    let counts = (opened.load_accounts()?.len(), opened.load_keys()?.len());
    opened.close().await?;
    Ok(counts)
}
