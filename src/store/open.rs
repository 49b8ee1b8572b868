//! Opening `switchyard.redb`: for writing (the daemon and the commands that change something),
//! or read-only (the commands that only read, which never rewrite a byte of the file).
//!
//! A writable open checks first what it can without writing — the lock, the schema version and
//! `secret.key`, through a read-only open — so an open that fails leaves the file as it was.
//! (A file that was not closed cleanly cannot be opened read-only; redb repairs it as the
//! writable open begins, and the checks follow.) The writable open then runs redb's integrity
//! check, which verifies every page's checksum: a file damaged outside redb is refused with
//! [`StoreError::Damaged`] instead of being served and written on. Every failure is one error
//! that names the file and says what to do.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::{Builder, DatabaseError, StorageError};
use tokio::sync::mpsc;

use super::schema::{META_KEY_CHECK, META_SCHEMA_VERSION, SCHEMA_VERSION};
use super::secrets::{self, Sealer};
use super::{DB_FILE, Db, Store, StoreError, guarded, read_meta, schema_number, supported_schema};

impl Store {
    /// Opens (creating if needed) the store in `state_dir` for writing: checks the directory
    /// is writable, takes the file lock, checks the schema version and the secret key, then
    /// verifies the file's integrity. Nothing is created or changed when a check fails.
    pub fn open(state_dir: &Path) -> Result<Store, StoreError> {
        Self::open_with_cache(state_dir, DEFAULT_CACHE_BYTES)
    }

    /// [`Store::open`] with redb's page cache held to `cache_bytes` (`[storage] cache_mib`).
    pub fn open_with_cache(state_dir: &Path, cache_bytes: usize) -> Result<Store, StoreError> {
        ensure_writable_dir(state_dir)?;
        let path = state_dir.join(DB_FILE);
        let key_path = state_dir.join(secrets::KEY_FILE);
        let existing = existing_file(&path)?;
        if existing && let Probe::Clean { schema, key_check } = probe(&path)? {
            if let Some(found) = schema
                && found > SCHEMA_VERSION
            {
                return Err(StoreError::NewerSchema {
                    path,
                    found,
                    supported: SCHEMA_VERSION,
                });
            }
            if let Some(check) = key_check {
                let key = secrets::load_or_create_key(state_dir, false)?;
                if Sealer::from_key(&key)
                    .open(META_KEY_CHECK, &check)
                    .is_none()
                {
                    return Err(StoreError::SecretKeyMismatch { path: key_path });
                }
            }
        }
        let repaired = Arc::new(AtomicBool::new(false));
        let db = {
            let repaired = Arc::clone(&repaired);
            guarded(&path, || {
                builder(cache_bytes)
                    .set_check_integrity_on_open(true)
                    // The check reports its progress at every open; at 0.3 it has found the
                    // newest commit damaged and falls back to the one before.
                    .set_repair_callback(move |session| {
                        if (0.2..0.4).contains(&session.progress()) {
                            repaired.store(true, Ordering::Relaxed);
                        }
                    })
                    .create(&path)
                    .map_err(|e| open_error(&path, e))
            })?
        };
        if repaired.load(Ordering::Relaxed) {
            tracing::warn!(
                path = %path.display(),
                "the store's newest commit failed its integrity check; it was rolled back to the commit before"
            );
        }
        // Account metadata is not secret, but it is nobody else's business either.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(
            |source| StoreError::Io {
                path: path.clone(),
                source,
            },
        )?;
        let has_key_check = guarded(&path, || read_meta(&db, META_KEY_CHECK))?.is_some();
        let key = secrets::load_or_create_key(state_dir, !has_key_check)?;
        let store = Self::finish_open(db, path, key_path, &key)?;
        // Said once the open succeeded, so a failure stays the one line it is.
        warn_if_open_to_others(state_dir);
        Ok(store)
    }

    /// Opens the store in `state_dir` for reading only: no directory, file or key is created,
    /// no permission changed, and the file is not written. A state directory without a store
    /// yet reads as an empty one.
    pub fn open_read_only(state_dir: &Path) -> Result<Store, StoreError> {
        let path = state_dir.join(DB_FILE);
        let missing = |e: &std::io::Error| e.kind() == ErrorKind::NotFound;
        match std::fs::metadata(state_dir) {
            Err(e) if missing(&e) => return Self::nothing_yet(&path),
            Err(source) => {
                return Err(StoreError::StateDir {
                    path: state_dir.to_path_buf(),
                    source,
                });
            }
            Ok(m) if !m.is_dir() => {
                return Err(StoreError::StateDir {
                    path: state_dir.to_path_buf(),
                    source: std::io::Error::new(ErrorKind::NotADirectory, "not a directory"),
                });
            }
            Ok(_) => {}
        }
        if !existing_file(&path)? {
            return Self::nothing_yet(&path);
        }
        let opened = guarded(&path, || {
            match builder(DEFAULT_CACHE_BYTES).open_read_only(&path) {
                Ok(db) => Ok(Some(db)),
                Err(DatabaseError::RepairAborted) => Ok(None),
                Err(e) => Err(open_error(&path, e)),
            }
        })?;
        let Some(db) = opened else {
            return Self::open_repaired_copy(state_dir, &path);
        };
        let (schema, check) = guarded(&path, || {
            Ok((
                read_meta(&db, META_SCHEMA_VERSION)?,
                read_meta(&db, META_KEY_CHECK)?,
            ))
        })?;
        let found = match schema {
            Some(raw) => schema_number(&path, &raw)?,
            None => {
                return Err(StoreError::Damaged {
                    path,
                    detail: "it has no schema version".into(),
                });
            }
        };
        if found > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path,
                found,
                supported: SCHEMA_VERSION,
            });
        }
        let key = read_only_key(state_dir, check.as_deref())?;
        // No writer: the receiving end is gone, and writes are refused before they get there.
        let (tx, _) = mpsc::channel(1);
        Ok(Self::with_inner(
            Db::Ro(db),
            path,
            Sealer::from_key(&key),
            tx,
            None,
        ))
    }

    /// A file that was not closed cleanly cannot be opened read-only, and repairing it would
    /// write it. Its last commit is read from a private copy instead (in a 0700 directory of
    /// its own under the temporary directory, removed when the store is dropped), repaired
    /// and checked there; the file itself is not touched.
    fn open_repaired_copy(state_dir: &Path, path: &Path) -> Result<Store, StoreError> {
        let scratch = Scratch::new().map_err(|source| StoreError::Io {
            path: std::env::temp_dir(),
            source,
        })?;
        let copy = scratch.0.join(DB_FILE);
        std::fs::copy(path, &copy).map_err(|source| io_error(path.to_path_buf(), source))?;
        // A daemon that started meanwhile holds the file now: its view is the one to ask for.
        if let Err(DatabaseError::DatabaseAlreadyOpen) =
            builder(DEFAULT_CACHE_BYTES).open_read_only(path)
        {
            return Err(StoreError::Locked {
                path: path.to_path_buf(),
            });
        }
        let db = guarded(path, || {
            builder(DEFAULT_CACHE_BYTES)
                .set_check_integrity_on_open(true)
                .create(&copy)
                .map_err(|e| open_error(path, e))
        })?;
        let (schema, check) = guarded(path, || {
            Ok((
                read_meta(&db, META_SCHEMA_VERSION)?,
                read_meta(&db, META_KEY_CHECK)?,
            ))
        })?;
        if let Some(raw) = schema {
            supported_schema(path, &raw)?;
        }
        let key = read_only_key(state_dir, check.as_deref())?;
        let (tx, _) = mpsc::channel(1);
        let store = Self::with_inner(
            Db::Rw(Arc::new(db)),
            path.to_path_buf(),
            Sealer::from_key(&key),
            tx,
            None,
        );
        store.inner.read_only.store(true, Ordering::Relaxed);
        *store
            .inner
            .scratch
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(scratch);
        Ok(store)
    }
}

/// redb's page cache for a store opened without a size: the commands', and `[storage]
/// cache_mib`'s default. redb's own default is 1 GiB, which the daemon's records would fill
/// over weeks (about a kilobyte a request) and never give back; the store is read once at
/// start-up and written after, so a small cache costs nothing the OS's page cache does not
/// give back.
pub const DEFAULT_CACHE_BYTES: usize = 8 << 20;

/// A redb builder whose page cache holds at most `cache_bytes`.
pub(super) fn builder(cache_bytes: usize) -> Builder {
    let mut b = Builder::new();
    b.set_cache_size(cache_bytes);
    b
}

/// What redb's integrity check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Integrity {
    /// Every page's checksum verifies.
    Verified,
    /// The newest commit does not verify; an open falls back to the commit before it.
    NewestCommitDamaged,
}

/// Runs redb's integrity check on a private copy of the store in `state_dir` (the check writes,
/// and the file itself must not change): what the daemon's next open would find.
pub fn check_integrity_of_copy(state_dir: &Path) -> Result<Integrity, StoreError> {
    let path = state_dir.join(DB_FILE);
    let scratch = Scratch::new().map_err(|source| StoreError::Io {
        path: std::env::temp_dir(),
        source,
    })?;
    let copy = scratch.0.join(DB_FILE);
    existing_file(&path)?;
    std::fs::copy(&path, &copy).map_err(|source| io_error(path.clone(), source))?;
    let fell_back = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&fell_back);
    let db = guarded(&path, || {
        builder(DEFAULT_CACHE_BYTES)
            .set_check_integrity_on_open(true)
            .set_repair_callback(move |session| {
                if (0.2..0.4).contains(&session.progress()) {
                    flag.store(true, Ordering::Relaxed);
                }
            })
            .create(&copy)
            .map_err(|e| open_error(&path, e))
    })?;
    drop(db);
    Ok(if fell_back.load(Ordering::Relaxed) {
        Integrity::NewestCommitDamaged
    } else {
        Integrity::Verified
    })
}

impl Store {
    /// What a read-only open finds where no store exists yet: nothing.
    fn nothing_yet(path: &Path) -> Result<Store, StoreError> {
        tracing::warn!(path = %path.display(), "no store there yet; nothing to show");
        Store::open_in_memory()
    }
}

/// The key a read-only open seals with: `secret.key`, which must open the key check when the
/// file has one. A file from before the key check takes whatever key is there (or none), and
/// what that cannot open is quarantined.
fn read_only_key(state_dir: &Path, check: Option<&[u8]>) -> Result<[u8; 32], StoreError> {
    match check {
        Some(check) => {
            let key = secrets::load_or_create_key(state_dir, false)?;
            if Sealer::from_key(&key).open(META_KEY_CHECK, check).is_none() {
                return Err(StoreError::SecretKeyMismatch {
                    path: state_dir.join(secrets::KEY_FILE),
                });
            }
            Ok(key)
        }
        None => match secrets::load_or_create_key(state_dir, false) {
            Ok(key) => Ok(key),
            Err(StoreError::SecretKeyMissing { .. }) => Ok([0u8; 32]),
            Err(e) => Err(e),
        },
    }
}

/// A private directory for a copy of the store, removed with everything in it on drop.
pub(super) struct Scratch(pub(super) PathBuf);

impl Scratch {
    fn new() -> std::io::Result<Scratch> {
        let mut tag = [0u8; 8];
        getrandom::fill(&mut tag).map_err(|e| std::io::Error::other(e.to_string()))?;
        let name: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        let dir = std::env::temp_dir().join(format!("switchyard-{name}"));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a read-only look at an existing file found.
enum Probe {
    /// Closed cleanly: its schema version and key check.
    Clean {
        schema: Option<u64>,
        key_check: Option<Vec<u8>>,
    },
    /// Not closed cleanly: only a writable open (which repairs it) can read it.
    NeedsRepair,
}

fn probe(path: &Path) -> Result<Probe, StoreError> {
    guarded(path, || {
        match builder(DEFAULT_CACHE_BYTES).open_read_only(path) {
            Ok(db) => {
                let schema = match read_meta(&db, META_SCHEMA_VERSION)? {
                    Some(raw) => Some(schema_number(path, &raw)?),
                    None => None,
                };
                let key_check = read_meta(&db, META_KEY_CHECK)?;
                Ok(Probe::Clean { schema, key_check })
            }
            Err(DatabaseError::RepairAborted) => Ok(Probe::NeedsRepair),
            Err(e) => Err(open_error(path, e)),
        }
    })
}

/// Whether the store's file exists, refusing what cannot be one: a directory or anything else
/// that is not a regular file, and an empty file. redb would create a new database over an
/// empty file, but no store of ours is ever empty once created: zero bytes is a truncated
/// copy, a full disk or a `> file`, and opening it as new would lose every account and key
/// without a word.
fn existing_file(path: &Path) -> Result<bool, StoreError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(source) => return Err(io_error(path.to_path_buf(), source)),
    };
    if meta.is_dir() {
        return Err(StoreError::NotAFile {
            path: path.to_path_buf(),
            what: "a directory",
        });
    }
    if !meta.is_file() {
        return Err(StoreError::NotAFile {
            path: path.to_path_buf(),
            what: "a special file",
        });
    }
    if meta.len() == 0 {
        return Err(StoreError::Damaged {
            path: path.to_path_buf(),
            detail: "it is empty: 0 bytes".into(),
        });
    }
    Ok(true)
}

/// An error opening the file at `path`, in words that say what to do.
fn open_error(path: &Path, e: DatabaseError) -> StoreError {
    let path = path.to_path_buf();
    match e {
        DatabaseError::DatabaseAlreadyOpen | DatabaseError::LockProtocolMismatch => {
            StoreError::Locked { path }
        }
        DatabaseError::RepairAborted => StoreError::NeedsRepair { path },
        DatabaseError::UpgradeRequired(v) => StoreError::Format {
            path,
            detail: format!("redb file format {v}"),
        },
        DatabaseError::Storage(StorageError::Io(source)) => io_error(path, source),
        DatabaseError::Storage(StorageError::Corrupted(detail)) => {
            StoreError::Damaged { path, detail }
        }
        other => StoreError::Damaged {
            path,
            detail: other.to_string(),
        },
    }
}

/// An I/O error on the file; one saying the bytes are no database is damage.
pub(super) fn io_error(path: PathBuf, source: std::io::Error) -> StoreError {
    match source.kind() {
        ErrorKind::InvalidData => StoreError::Damaged {
            path,
            detail: format!("not a database: {source}"),
        },
        // Shorter than its own header says it is: a truncated copy.
        ErrorKind::UnexpectedEof => {
            let len = std::fs::metadata(&path).map_or(0, |m| m.len());
            StoreError::Damaged {
                path,
                detail: format!("truncated to {len} bytes"),
            }
        }
        ErrorKind::IsADirectory => StoreError::NotAFile {
            path,
            what: "a directory",
        },
        _ => StoreError::Io { path, source },
    }
}

/// What to do about an I/O error, appended to its message.
pub(super) fn io_remedy(e: &std::io::Error) -> &'static str {
    match e.kind() {
        ErrorKind::PermissionDenied => {
            "; run switchyard as the user that owns the state directory (the service's, or root \
             with sudo), or give that user the file"
        }
        ErrorKind::ReadOnlyFilesystem => "; the file system is mounted read-only",
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => "; the disk is full: free some space",
        _ => "; `switchyard doctor` checks the state directory and its files",
    }
}

/// Creates `dir` (0700) if needed and proves a file can be written in it.
pub fn ensure_writable_dir(dir: &Path) -> Result<(), StoreError> {
    let err = |source| StoreError::StateDir {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(err)?;
    let probe = dir.join(format!(".write-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(err)?;
    std::fs::remove_file(&probe).map_err(err)
}

/// The permission bits of `dir` beyond the owner's, when there are any.
pub fn open_to_others(dir: &Path) -> Option<u32> {
    let mode = std::fs::metadata(dir).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then_some(mode)
}

/// A state directory others may enter is said once at every open: it holds the tokens'
/// store and key (each 0600), and nothing in it is anyone else's business.
fn warn_if_open_to_others(dir: &Path) {
    if let Some(mode) = open_to_others(dir) {
        tracing::warn!(
            path = %dir.display(),
            mode = format!("{mode:04o}"),
            "the state directory is open to other users; chmod 700 it"
        );
    }
}
