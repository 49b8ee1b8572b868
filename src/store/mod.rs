//! The redb store: one file, `switchyard.redb`, in the state directory.
//!
//! Reads are plain read transactions; every write goes through the single writer task
//! (`writer.rs`). Values are encoded by `codec.rs` only; account secrets are sealed with the
//! state directory's `secret.key` (`secrets.rs`).

pub mod backup;
pub mod codec;
mod grouped;
mod guard;
mod open;
pub mod records;
pub mod scan;
pub mod schema;
pub mod secrets;
pub mod writer;

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redb::{
    Database, ReadOnlyDatabase, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition,
    TableHandle,
};
use tokio::sync::{mpsc, oneshot};

pub(crate) use self::guard::guarded;
pub use self::open::{
    DEFAULT_CACHE_BYTES, Integrity, check_integrity_of_copy, ensure_writable_dir, open_to_others,
};

use self::codec::{CodecError, Versioned};
use self::records::{
    AccountProxyRecord, AccountRecord, AccountSecrets, ClientKeyRecord, CreditSpendRecord,
    HealthRecord, RequestRow, SettingsRecord, SnapshotRecord, UsageBucketRow,
};
use self::schema::{META, META_KEY_CHECK, META_SCHEMA_VERSION, SCHEMA_VERSION, Table};
use self::secrets::{Sealer, Secret};
use self::writer::{Job, Key, Mutation};

pub const DB_FILE: &str = "switchyard.redb";
const KEY_CHECK_PLAINTEXT: &[u8] = b"switchyard key check";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "state directory {path} is not usable: {source}; create it, or make it writable by the \
         user switchyard runs as"
    )]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the store {path} is locked by another process; let it finish, or stop the daemon that \
         holds it (`systemctl stop switchyard`)"
    )]
    Locked { path: PathBuf },
    #[error(
        "the store {path} is damaged ({detail}); restore a backup (`switchyard restore FILE`) or \
         move the file aside to start empty (`switchyard doctor` says more)"
    )]
    Damaged { path: PathBuf, detail: String },
    #[error(
        "the store {path} is {what}, not a database file; move it aside and restore a backup \
         (`switchyard restore FILE`), or, if nothing was ever stored, remove it to start empty"
    )]
    NotAFile { path: PathBuf, what: &'static str },
    #[error("cannot open {path}: {source}{}", open::io_remedy(source))]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the store {path} cannot be read as it is (it was not closed cleanly, or it is damaged), \
         and a command that only reads does not repair it; start the daemon, which repairs the \
         file as it opens or says what is wrong with it"
    )]
    NeedsRepair { path: PathBuf },
    #[error(
        "the store {path} is in a file format this binary cannot read ({detail}); run the \
         switchyard that wrote it, or restore a backup"
    )]
    Format { path: PathBuf, detail: String },
    #[error("this command only reads the store; it cannot change it")]
    ReadOnly,
    #[error(
        "the store {path} has schema version {found}, newer than this binary supports ({supported}); \
         run the newer switchyard or restore a backup"
    )]
    NewerSchema {
        path: PathBuf,
        found: u64,
        supported: u64,
    },
    #[error("{path} is corrupted ({reason}); restore it from a backup of the state directory")]
    SecretKeyCorrupt { path: PathBuf, reason: String },
    #[error(
        "{path} is missing but the store holds secrets sealed with it; restore it from a backup \
         of the state directory"
    )]
    SecretKeyMissing { path: PathBuf },
    #[error(
        "{path} does not match this store (its secrets were sealed with another key); put back \
         the secret.key that belongs to it (restore both files from the same backup)"
    )]
    SecretKeyMismatch { path: PathBuf },
    #[error("cannot read {what}: {source}")]
    Codec {
        what: String,
        #[source]
        source: CodecError,
    },
    #[error("the secrets of {what} cannot be opened with secret.key")]
    Unseal { what: String },
    #[error("could not seal a secret")]
    Seal,
    #[error("no randomness available: {0}")]
    Random(String),
    #[error("table {0:?} is not keyed that way")]
    KeyKind(Table),
    #[error("the store writer has stopped")]
    WriterGone,
    #[error("store error: {0}; `switchyard doctor` checks the store")]
    Db(String),
}

impl StoreError {
    /// A redb error; damage and I/O errors get the store's path from [`guarded`].
    pub(crate) fn db(e: impl Into<redb::Error>) -> Self {
        match e.into() {
            redb::Error::Corrupted(detail) => StoreError::Damaged {
                path: PathBuf::new(),
                detail,
            },
            redb::Error::Io(source) => open::io_error(PathBuf::new(), source),
            e => StoreError::Db(e.to_string()),
        }
    }

    /// Names the store's file in an error that was made without it.
    fn at(self, file: &Path) -> Self {
        match self {
            StoreError::Damaged { path, detail } if path.as_os_str().is_empty() => {
                StoreError::Damaged {
                    path: file.to_path_buf(),
                    detail,
                }
            }
            StoreError::Io { path, source } if path.as_os_str().is_empty() => StoreError::Io {
                path: file.to_path_buf(),
                source,
            },
            other => other,
        }
    }

    fn codec(what: impl Into<String>, source: CodecError) -> Self {
        StoreError::Codec {
            what: what.into(),
            source,
        }
    }
}

/// Handle to the open store. Cloning shares it.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// The open file: for writing (the daemon, commands that change something, tests in memory), or
/// read-only (commands that only read: they never rewrite a byte of it).
enum Db {
    Rw(Arc<Database>),
    Ro(ReadOnlyDatabase),
}

impl Db {
    fn begin_read(&self) -> Result<ReadTransaction, StoreError> {
        match self {
            Db::Rw(db) => db.begin_read(),
            Db::Ro(db) => db.begin_read(),
        }
        .map_err(StoreError::db)
    }
}

/// A row left out because it cannot be read: its table, its key and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    pub table: String,
    pub key: String,
    pub error: String,
}

/// The most quarantined rows remembered (each is counted beyond that too).
const QUARANTINE_KEPT: usize = 10_000;

struct Inner {
    db: Db,
    path: PathBuf,
    sealer: Sealer,
    tx: mpsc::Sender<Job>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    dropped: AtomicU64,
    /// The writer's last commits are not durable yet (telemetry committed without an fsync).
    unsynced: Arc<AtomicBool>,
    /// Rows that could not be decoded (skipped, each logged with its key).
    undecodable: AtomicU64,
    /// Those rows, by table and key.
    quarantine: Mutex<BTreeMap<(String, String), String>>,
    /// Writes are refused (a command that only reads).
    read_only: AtomicBool,
    /// The private copy a read-only open of an uncleanly closed file reads; removed last.
    scratch: Mutex<Option<open::Scratch>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl Store {
    /// A store in memory (tests and benches), sealed with a fixed key.
    pub fn open_in_memory() -> Result<Store, StoreError> {
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(StoreError::db)?;
        Self::finish_open(
            db,
            PathBuf::from(":memory:"),
            PathBuf::from(":memory:"),
            &[42u8; 32],
        )
    }

    fn finish_open(
        db: Database,
        path: PathBuf,
        key_path: PathBuf,
        key: &[u8; 32],
    ) -> Result<Store, StoreError> {
        let sealer = Sealer::from_key(key);
        guarded(&path, || Self::prepare(&db, &path, &key_path, &sealer))?;
        let db = Arc::new(db);
        let (tx, rx) = mpsc::channel(writer::QUEUE_CAPACITY);
        let writer_db = Arc::clone(&db);
        let writer_path = path.clone();
        let store = Self::with_inner(Db::Rw(db), path, sealer, tx, None);
        let unsynced = Arc::clone(&store.inner.unsynced);
        let handle = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer::run(writer_db, writer_path, rx, unsynced))
            .map_err(|e| StoreError::Db(format!("cannot start the writer thread: {e}")))?;
        *store.inner.writer.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        Ok(store)
    }

    fn with_inner(
        db: Db,
        path: PathBuf,
        sealer: Sealer,
        tx: mpsc::Sender<Job>,
        writer: Option<std::thread::JoinHandle<()>>,
    ) -> Store {
        Store {
            inner: Arc::new(Inner {
                path,
                sealer,
                tx,
                writer: Mutex::new(writer),
                dropped: AtomicU64::new(0),
                unsynced: Arc::default(),
                undecodable: AtomicU64::new(0),
                quarantine: Mutex::new(BTreeMap::new()),
                read_only: AtomicBool::new(matches!(db, Db::Ro(_))),
                scratch: Mutex::new(None),
                db,
            }),
        }
    }

    /// Checks the schema version and the key of an open file, creating the tables of a new one
    /// and migrating an older one.
    fn prepare(
        db: &Database,
        path: &Path,
        key_path: &Path,
        sealer: &Sealer,
    ) -> Result<(), StoreError> {
        match read_meta(db, META_SCHEMA_VERSION)? {
            Some(raw) => {
                let found = supported_schema(path, &raw)?;
                match read_meta(db, META_KEY_CHECK)? {
                    Some(check) if sealer.open(META_KEY_CHECK, &check).is_some() => {}
                    Some(_) => {
                        return Err(StoreError::SecretKeyMismatch {
                            path: key_path.to_path_buf(),
                        });
                    }
                    None => write_key_check(db, sealer)?,
                }
                if found < SCHEMA_VERSION {
                    migrate(db, found)?;
                }
            }
            None => {
                let txn = db.begin_write().map_err(StoreError::db)?;
                for t in Table::ALL {
                    match t.text_keyed() {
                        Some(def) => drop(txn.open_table(def).map_err(StoreError::db)?),
                        None => drop(txn.open_table(schema::REQUESTS).map_err(StoreError::db)?),
                    }
                }
                {
                    let mut meta = txn.open_table(META).map_err(StoreError::db)?;
                    meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION.to_le_bytes().as_slice())
                        .map_err(StoreError::db)?;
                    let check = sealer.seal(META_KEY_CHECK, KEY_CHECK_PLAINTEXT)?;
                    meta.insert(META_KEY_CHECK, check.as_slice())
                        .map_err(StoreError::db)?;
                }
                txn.commit().map_err(StoreError::db)?;
            }
        }
        Ok(())
    }

    /// The id of the key this store is sealed with (`secrets::key_id`).
    /// Seals and opens values with the state directory's key (the config's sealed secrets).
    pub fn sealer(&self) -> &Sealer {
        &self.inner.sealer
    }

    pub fn key_id(&self) -> &str {
        self.inner.sealer.key_id()
    }

    /// Whether this handle only reads (a command that changes nothing).
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only.load(Ordering::Relaxed)
    }

    /// Runs redb work on this store, a panic in it being the file's damage.
    fn guard<T>(&self, f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
        guarded(&self.inner.path, f)
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    // ---- writing ---------------------------------------------------------------------------

    /// Applies `muts` atomically and returns once they are committed (durable).
    pub async fn write(&self, muts: Vec<Mutation>) -> Result<(), StoreError> {
        if self.is_read_only() {
            return Err(StoreError::ReadOnly);
        }
        let (ack, done) = oneshot::channel();
        self.inner
            .tx
            .send(Job::Write(muts, Some(ack)))
            .await
            .map_err(|_| StoreError::WriterGone)?;
        done.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Offers a telemetry write without waiting; returns false (and counts it) when the queue
    /// is full or the writer has stopped.
    pub fn try_write(&self, muts: Vec<Mutation>) -> bool {
        match self.inner.tx.try_send(Job::Telemetry(muts)) {
            Ok(()) => true,
            Err(_) => {
                self.inner.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Queues a write that must not be lost without waiting for it: offered at once, and only
    /// when the queue is full handed to a task that waits for room. Used on the request path
    /// for account health, which may not be dropped but must not make a request wait.
    pub fn enqueue(&self, muts: Vec<Mutation>) {
        match self.inner.tx.try_send(Job::Write(muts, None)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(job)) => {
                let tx = self.inner.tx.clone();
                tokio::spawn(async move {
                    let _ = tx.send(job).await;
                });
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::error!("the store writer has stopped; a health write is lost");
            }
        }
    }

    /// Whether some committed telemetry is not durable yet (at most
    /// [`writer::TELEMETRY_DURABLE_EVERY`] long).
    pub fn unsynced(&self) -> bool {
        self.inner.unsynced.load(Ordering::Relaxed)
    }

    /// Telemetry writes dropped because the writer was behind.
    pub fn dropped_writes(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Waits until everything queued before this call is committed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.write(Vec::new()).await
    }

    /// Commits everything queued, then stops the writer and waits for its thread. Later
    /// writes fail with [`StoreError::WriterGone`]. Safe to call twice.
    pub async fn close(&self) -> Result<(), StoreError> {
        let (ack, done) = oneshot::channel();
        if self.inner.tx.send(Job::Stop(ack)).await.is_ok() {
            let _ = done.await;
        }
        let handle = self
            .inner
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = handle {
            tokio::task::spawn_blocking(move || h.join())
                .await
                .map_err(|e| StoreError::Db(format!("writer thread: {e}")))?
                .map_err(|_| StoreError::Db("the writer thread panicked".into()))?;
        }
        Ok(())
    }

    /// Whether the store answers: a read transaction succeeds and the writer is running.
    pub fn ping(&self) -> Result<(), StoreError> {
        if self.inner.tx.is_closed() {
            return Err(StoreError::WriterGone);
        }
        self.guard(|| {
            let txn = self.inner.db.begin_read()?;
            meta_in(&txn, META_SCHEMA_VERSION).map(|_| ())
        })
    }

    // ---- generic reads ---------------------------------------------------------------------

    /// Rows that could not be decoded since the store was opened: each was logged with its
    /// table and key and left out, and the rest of the store serves.
    pub fn undecodable_rows(&self) -> u64 {
        self.inner.undecodable.load(Ordering::Relaxed)
    }

    /// Counts and logs a row that cannot be read (by the store, or by the domain above it when
    /// a stored name means nothing to this binary).
    pub fn note_undecodable(&self, table: &str, key: &str, error: &dyn std::fmt::Display) {
        let error = error.to_string();
        let mut q = self
            .inner
            .quarantine
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let id = (table.to_string(), key.to_string());
        if q.contains_key(&id) {
            return;
        }
        self.inner.undecodable.fetch_add(1, Ordering::Relaxed);
        tracing::error!(table, key, error = %error, "a stored row cannot be decoded; it is left out");
        if q.len() < QUARANTINE_KEPT {
            q.insert(id, error);
        }
    }

    /// The rows left out because they cannot be read, by table and key (each also counted in
    /// [`Self::undecodable_rows`] and logged once).
    pub fn quarantined(&self) -> Vec<Quarantined> {
        self.inner
            .quarantine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|((table, key), error)| Quarantined {
                table: table.clone(),
                key: key.clone(),
                error: error.clone(),
            })
            .collect()
    }

    fn get_raw(
        &self,
        def: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.guard(|| get_in(&self.inner.db.begin_read()?, def, key))
    }

    /// One value; an undecodable one is counted, logged and read as absent.
    fn get<T: Versioned>(
        &self,
        def: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        Ok(self
            .get_raw(def, key)?
            .and_then(|raw| match codec::decode(&raw) {
                Ok(v) => Some(v),
                Err(e) => {
                    self.note_undecodable(def.name(), key, &format!("{}: {e}", T::NAME));
                    None
                }
            }))
    }

    /// Every row of a table, keyed; undecodable rows are counted, logged and left out.
    fn list<T: Versioned>(
        &self,
        def: TableDefinition<&str, &[u8]>,
    ) -> Result<Vec<(String, T)>, StoreError> {
        let rows = self.guard(|| {
            let txn = self.inner.db.begin_read()?;
            let Some(table) = open_read(&txn, def)? else {
                return Ok(Vec::new());
            };
            let mut rows = Vec::new();
            for row in table.iter().map_err(StoreError::db)? {
                let (k, v) = row.map_err(StoreError::db)?;
                rows.push((k.value().to_string(), v.value().to_vec()));
            }
            Ok(rows)
        })?;
        Ok(self.decode_rows(def.name(), rows))
    }

    /// Decodes a table's raw rows; an undecodable one is counted, logged and left out.
    fn decode_rows<T: Versioned>(
        &self,
        table: &str,
        rows: Vec<(String, Vec<u8>)>,
    ) -> Vec<(String, T)> {
        let mut out = Vec::with_capacity(rows.len());
        for (k, v) in rows {
            match codec::decode(&v) {
                Ok(value) => out.push((k, value)),
                Err(e) => self.note_undecodable(table, &k, &format!("{}: {e}", T::NAME)),
            }
        }
        out
    }

    fn put<T: Versioned>(table: Table, key: &str, value: &T) -> Result<Mutation, StoreError> {
        let bytes =
            codec::encode(value).map_err(|e| StoreError::codec(format!("{table:?}/{key}"), e))?;
        Ok(Mutation::Put(table, Key::Text(key.to_string()), bytes))
    }

    // ---- accounts --------------------------------------------------------------------------

    pub fn load_accounts(&self) -> Result<Vec<AccountRecord>, StoreError> {
        Ok(self
            .list(schema::ACCOUNTS)?
            .into_iter()
            .map(|(_, a)| a)
            .collect())
    }

    /// An account's tokens. Tokens that cannot be opened (sealed with another key, or
    /// undecodable) are an error, counted and logged: the account then has no tokens.
    pub fn account_secrets(&self, id: &str) -> Result<Option<AccountSecrets>, StoreError> {
        let Some(sealed) = self.get_raw(schema::ACCOUNT_SECRETS, id)? else {
            return Ok(None);
        };
        let aad = secret_aad(id);
        let Some(plain) = self.inner.sealer.open(&aad, &sealed) else {
            let e = StoreError::Unseal {
                what: format!("account {id}"),
            };
            self.note_undecodable(schema::ACCOUNT_SECRETS.name(), id, &e);
            return Err(e);
        };
        codec::decode(&plain).map(Some).map_err(|e| {
            self.note_undecodable(schema::ACCOUNT_SECRETS.name(), id, &e);
            StoreError::codec(format!("secrets of account {id}"), e)
        })
    }

    /// The mutation that writes an account record.
    pub fn account_mutation(account: &AccountRecord) -> Result<Mutation, StoreError> {
        Self::put(Table::Accounts, &account.id, account)
    }

    /// The mutation that writes an account's sealed secrets.
    pub fn secrets_mutation(
        &self,
        id: &str,
        secrets: &AccountSecrets,
    ) -> Result<Mutation, StoreError> {
        self.seal_secrets(id, secrets)
    }

    fn seal_secrets(&self, id: &str, secrets: &AccountSecrets) -> Result<Mutation, StoreError> {
        let plain = codec::encode(secrets)
            .map_err(|e| StoreError::codec(format!("secrets of account {id}"), e))?;
        let sealed = self.inner.sealer.seal(&secret_aad(id), &plain)?;
        Ok(Mutation::Put(
            Table::AccountSecrets,
            Key::Text(id.to_string()),
            sealed,
        ))
    }

    /// An account's own egress proxy (its whole URL). One that cannot be opened is counted and
    /// logged, and is an error: the account must not silently go out another way.
    pub fn account_proxy(&self, id: &str) -> Result<Option<String>, StoreError> {
        let Some(sealed) = self.get_raw(schema::ACCOUNT_PROXIES, id)? else {
            return Ok(None);
        };
        let what = || format!("proxy of account {id}");
        let Some(plain) = self.inner.sealer.open(&proxy_aad(id), &sealed) else {
            let e = StoreError::Unseal { what: what() };
            self.note_undecodable(schema::ACCOUNT_PROXIES.name(), id, &e);
            return Err(e);
        };
        codec::decode::<AccountProxyRecord>(&plain)
            .map(|r| Some(r.url.expose().to_string()))
            .map_err(|e| {
                self.note_undecodable(schema::ACCOUNT_PROXIES.name(), id, &e);
                StoreError::codec(what(), e)
            })
    }

    /// The mutation that seals an account's proxy (`None` removes it).
    pub fn proxy_mutation(&self, id: &str, url: Option<&str>) -> Result<Mutation, StoreError> {
        let key = Key::Text(id.to_string());
        let Some(url) = url else {
            return Ok(Mutation::Delete(Table::AccountProxies, key));
        };
        let plain = codec::encode(&AccountProxyRecord {
            url: Secret::new(url),
        })
        .map_err(|e| StoreError::codec(format!("proxy of account {id}"), e))?;
        let sealed = self.inner.sealer.seal(&proxy_aad(id), &plain)?;
        Ok(Mutation::Put(Table::AccountProxies, key, sealed))
    }

    /// Writes an account and (when given) its secrets in one transaction.
    pub async fn put_account(
        &self,
        account: &AccountRecord,
        secrets: Option<&AccountSecrets>,
    ) -> Result<(), StoreError> {
        let mut muts = vec![Self::put(Table::Accounts, &account.id, account)?];
        if let Some(s) = secrets {
            muts.push(self.seal_secrets(&account.id, s)?);
        }
        self.write(muts).await
    }

    /// Writes rotated tokens; returns once they are durable.
    pub async fn put_account_secrets(
        &self,
        id: &str,
        secrets: &AccountSecrets,
    ) -> Result<(), StoreError> {
        self.write(vec![self.seal_secrets(id, secrets)?]).await
    }

    /// Removes an account with its secrets and health.
    pub async fn delete_account(&self, id: &str) -> Result<(), StoreError> {
        let k = || Key::Text(id.to_string());
        self.write(vec![
            Mutation::Delete(Table::Accounts, k()),
            Mutation::Delete(Table::AccountSecrets, k()),
            Mutation::Delete(Table::AccountProxies, k()),
            Mutation::Delete(Table::AccountHealth, k()),
        ])
        .await
    }

    // ---- client keys -----------------------------------------------------------------------

    pub fn load_keys(&self) -> Result<Vec<ClientKeyRecord>, StoreError> {
        Ok(self
            .list(schema::CLIENT_KEYS)?
            .into_iter()
            .map(|(_, k)| k)
            .collect())
    }

    pub async fn put_key(&self, key: &ClientKeyRecord) -> Result<(), StoreError> {
        self.write(vec![Self::put(Table::ClientKeys, &key.id, key)?])
            .await
    }

    // ---- settings, health, snapshots -------------------------------------------------------

    pub fn get_settings(&self, name: &str) -> Result<Option<SettingsRecord>, StoreError> {
        self.get(schema::SETTINGS, name)
    }

    pub async fn put_settings(&self, name: &str, value: &SettingsRecord) -> Result<(), StoreError> {
        self.write(vec![Self::put(Table::Settings, name, value)?])
            .await
    }

    /// Every account's stored health, keyed by account id.
    pub fn load_health(&self) -> Result<Vec<(String, HealthRecord)>, StoreError> {
        self.list(schema::ACCOUNT_HEALTH)
    }

    /// The mutation that records an account's health; the caller decides whether to wait.
    pub fn health_mutation(id: &str, health: &HealthRecord) -> Result<Mutation, StoreError> {
        Self::put(Table::AccountHealth, id, health)
    }

    pub fn get_snapshot(&self, name: &str) -> Result<Option<SnapshotRecord>, StoreError> {
        self.get(schema::SNAPSHOTS, name)
    }

    pub async fn put_snapshot(&self, name: &str, value: &SnapshotRecord) -> Result<(), StoreError> {
        self.write(vec![Self::put(Table::Snapshots, name, value)?])
            .await
    }

    /// Every reset-credit spend, keyed by its redeem request id.
    pub fn load_credit_spends(&self) -> Result<Vec<(String, CreditSpendRecord)>, StoreError> {
        self.list(schema::CREDIT_SPENDS)
    }

    /// Records a spend and waits until it is on disk.
    pub async fn put_credit_spend(
        &self,
        redeem_id: &str,
        spend: &CreditSpendRecord,
    ) -> Result<(), StoreError> {
        self.write(vec![Self::put(Table::CreditSpends, redeem_id, spend)?])
            .await
    }

    // ---- request records -------------------------------------------------------------------

    /// The mutation that stores a request record's row (`RequestRowOut::encode`) under its
    /// key.
    pub fn request_put(key: u64, row: Vec<u8>) -> Mutation {
        Mutation::Put(Table::Requests, Key::Int(key), row)
    }

    /// The newest `limit` stored request records with their keys, newest first. Undecodable
    /// rows are counted, logged and left out.
    pub fn recent_requests(&self, limit: usize) -> Result<Vec<(u64, RequestRow)>, StoreError> {
        // Raw rows first: a damaged file fails the read whole, a bad value only itself.
        let (mut records, bad) = self.guard(|| {
            let txn = self.inner.db.begin_read()?;
            let Some(table) = open_read(&txn, schema::REQUESTS)? else {
                return Ok(Default::default());
            };
            // A row's records are no newer than its key, and rows come newest key first: once
            // `limit` records are read, a row whose key is below the oldest of the newest
            // `limit` can hold none of them. The keys of those, smallest on top.
            let mut newest = std::collections::BinaryHeap::new();
            let mut read = Rows::default();
            for row in table.iter().map_err(StoreError::db)?.rev() {
                let (k, v) = row.map_err(StoreError::db)?;
                let key = k.value();
                if newest.len() >= limit && newest.peek().is_some_and(|r: &Reverse<u64>| key < r.0)
                {
                    break;
                }
                for (k, _) in read.add(key, v.value()) {
                    newest.push(Reverse(*k));
                    if newest.len() > limit {
                        newest.pop();
                    }
                }
            }
            Ok((read.records, read.bad))
        })?;
        self.note_bad_groups(bad);
        records.sort_unstable_by_key(|(k, _)| Reverse(*k));
        records.truncate(limit);
        Ok(self.decode_requests(records))
    }

    /// The records that started at or after `from_ms` (unix ms), oldest first. Undecodable
    /// rows are counted, logged and left out.
    pub fn requests_since(&self, from_ms: u64) -> Result<Vec<(u64, RequestRow)>, StoreError> {
        let from = from_ms.saturating_mul(1 << 16);
        let (mut records, bad) = self.guard(|| {
            let txn = self.inner.db.begin_read()?;
            let Some(table) = open_read(&txn, schema::REQUESTS)? else {
                return Ok(Default::default());
            };
            // Every row holding a record from `from` has a key from `from` (its greatest).
            let mut read = Rows::default();
            for row in table.range(from..).map_err(StoreError::db)? {
                let (k, v) = row.map_err(StoreError::db)?;
                read.add(k.value(), v.value());
            }
            Ok((read.records, read.bad))
        })?;
        self.note_bad_groups(bad);
        records.retain(|(k, _)| *k >= from);
        records.sort_unstable_by_key(|(k, _)| *k);
        Ok(self.decode_requests(records))
    }

    /// Counts and logs groups of records that could not be read apart.
    fn note_bad_groups(&self, bad: Vec<(u64, String)>) {
        for (key, e) in bad {
            self.note_undecodable(schema::REQUESTS.name(), &format!("{key:016x}"), &e);
        }
    }

    /// Decodes stored request records; an undecodable one is counted, logged and left out.
    fn decode_requests(&self, rows: Vec<(u64, Vec<u8>)>) -> Vec<(u64, RequestRow)> {
        let mut out = Vec::with_capacity(rows.len());
        for (k, v) in rows {
            match codec::decode::<RequestRow>(&v) {
                Ok(r) => out.push((k, r)),
                Err(e) => self.note_undecodable(
                    schema::REQUESTS.name(),
                    &format!("{k:016x}"),
                    &format!("{}: {e}", RequestRow::NAME),
                ),
            }
        }
        out
    }
}

/// The records of the rows of the `requests` table read so far, each its key and value, and the
/// rows that hold a group that cannot be read apart.
#[derive(Default)]
struct Rows {
    records: Vec<(u64, Vec<u8>)>,
    bad: Vec<(u64, String)>,
}

impl Rows {
    /// Adds a row's records; returns them.
    fn add(&mut self, key: u64, value: &[u8]) -> &[(u64, Vec<u8>)] {
        let before = self.records.len();
        match grouped::records(key, value) {
            Ok(records) => self
                .records
                .extend(records.into_iter().map(|(k, v)| (k, v.to_vec()))),
            Err(e) => self.bad.push((key, e.to_string())),
        }
        &self.records[before..]
    }
}

impl Store {
    // ---- usage -----------------------------------------------------------------------------

    /// The row key of a usage bucket: the hour first (10 digits), so keys sort by time.
    pub fn usage_key(row: &UsageBucketRow) -> String {
        format!(
            "{:010}/{}/{}/{}",
            row.hour, row.key_id, row.account, row.model
        )
    }

    /// The mutation that writes a usage bucket (its whole totals: writing it again is harmless).
    pub fn usage_mutation(row: &UsageBucketRow) -> Result<Mutation, StoreError> {
        Self::put(Table::UsageHourly, &Self::usage_key(row), row)
    }

    /// The usage buckets of the hours starting in `[from, to)` (unix seconds), oldest first.
    /// Undecodable rows are counted, logged and left out.
    pub fn usage_between(&self, from: u64, to: u64) -> Result<Vec<UsageBucketRow>, StoreError> {
        let (lo, hi) = (format!("{from:010}/"), format!("{to:010}/"));
        let rows = self.guard(|| {
            let txn = self.inner.db.begin_read()?;
            let Some(table) = open_read(&txn, schema::USAGE_HOURLY)? else {
                return Ok(Vec::new());
            };
            let mut rows = Vec::new();
            for row in table
                .range::<&str>(lo.as_str()..hi.as_str())
                .map_err(StoreError::db)?
            {
                let (k, v) = row.map_err(StoreError::db)?;
                rows.push((k.value().to_string(), v.value().to_vec()));
            }
            Ok(rows)
        })?;
        Ok(self
            .decode_rows::<UsageBucketRow>(schema::USAGE_HOURLY.name(), rows)
            .into_iter()
            .map(|(_, r)| r)
            .collect())
    }
}

fn secret_aad(id: &str) -> String {
    format!("account_secrets/{id}")
}

fn proxy_aad(id: &str) -> String {
    format!("account_proxies/{id}")
}

fn read_meta(db: &impl ReadableDatabase, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let txn = db.begin_read().map_err(StoreError::db)?;
    meta_in(&txn, key)
}

fn meta_in(txn: &ReadTransaction, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
    get_in(txn, META, key)
}

/// One value's bytes, `None` when it or its whole table is absent.
fn get_in(
    txn: &ReadTransaction,
    def: TableDefinition<&str, &[u8]>,
    key: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(table) = open_read(txn, def)? else {
        return Ok(None);
    };
    Ok(table
        .get(key)
        .map_err(StoreError::db)?
        .map(|v| v.value().to_vec()))
}

/// A table to read; `None` when it was never written (tables are created on first write).
fn open_read<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &ReadTransaction,
    def: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
    match txn.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(StoreError::db(e)),
    }
}

/// The schema version stored in `raw`, refused when a newer release wrote it.
fn supported_schema(path: &Path, raw: &[u8]) -> Result<u64, StoreError> {
    let found = schema_number(path, raw)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_path_buf(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(found)
}

/// `meta.schema_version` as a number.
fn schema_number(path: &Path, raw: &[u8]) -> Result<u64, StoreError> {
    raw.try_into()
        .map(u64::from_le_bytes)
        .map_err(|_| StoreError::Damaged {
            path: path.to_path_buf(),
            detail: "its schema version is malformed".into(),
        })
}

/// Brings a store written by an older release to [`SCHEMA_VERSION`].
///
/// 1 -> 2 (0.2.0): values carry their own versions and every older one still decodes, so no
/// row is rewritten; the number moves so that 0.1.0, which would skip rows it cannot decode,
/// refuses the file instead. 2 -> 3 (0.3.0): the same, for key policies (client keys at
/// version 2) and the new `usage_hourly` table, created on first write. 3 -> 4 (0.4.0): the same,
/// for request records at version 3 (their terminal source), account health at version 3 and
/// the new `account_proxies` table; the number moves so that 0.3.0, which would also send a
/// proxied account's traffic straight out, refuses the file.
fn migrate(db: &Database, from: u64) -> Result<(), StoreError> {
    tracing::info!(from, to = SCHEMA_VERSION, "migrating the store's schema");
    let txn = db.begin_write().map_err(StoreError::db)?;
    {
        let mut meta = txn.open_table(META).map_err(StoreError::db)?;
        meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION.to_le_bytes().as_slice())
            .map_err(StoreError::db)?;
    }
    txn.commit().map_err(StoreError::db)
}

fn write_key_check(db: &Database, sealer: &Sealer) -> Result<(), StoreError> {
    let check = sealer.seal(META_KEY_CHECK, KEY_CHECK_PLAINTEXT)?;
    let txn = db.begin_write().map_err(StoreError::db)?;
    {
        let mut meta = txn.open_table(META).map_err(StoreError::db)?;
        meta.insert(META_KEY_CHECK, check.as_slice())
            .map_err(StoreError::db)?;
    }
    txn.commit().map_err(StoreError::db)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::ReadableTableMetadata;

    fn account(id: &str) -> AccountRecord {
        AccountRecord::for_test(id)
    }

    fn secrets(tag: &str) -> AccountSecrets {
        AccountSecrets {
            access_token: secrets::Secret::new(format!("access-{tag}")),
            refresh_token: secrets::Secret::new(format!("refresh-{tag}")),
            id_token: secrets::Secret::new("id"),
            access_expires_at: Some(5),
            refreshed_at: 1,
            replaced: Vec::new(),
        }
    }

    #[tokio::test]
    async fn accounts_and_secrets_round_trip_in_memory() {
        let s = Store::open_in_memory().unwrap();
        s.put_account(&account("a"), Some(&secrets("1")))
            .await
            .unwrap();
        assert_eq!(s.load_accounts().unwrap(), vec![account("a")]);
        assert_eq!(s.account_secrets("a").unwrap(), Some(secrets("1")));
        s.put_account_secrets("a", &secrets("2")).await.unwrap();
        assert_eq!(s.account_secrets("a").unwrap(), Some(secrets("2")));
        s.delete_account("a").await.unwrap();
        assert!(s.load_accounts().unwrap().is_empty());
        assert_eq!(s.account_secrets("a").unwrap(), None);
        s.close().await.unwrap();
        assert!(matches!(s.flush().await, Err(StoreError::WriterGone)));
    }

    #[tokio::test]
    async fn reopening_a_file_keeps_data_and_refuses_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            s.put_account(&account("a"), Some(&secrets("1")))
                .await
                .unwrap();
            s.close().await.unwrap();
        }
        {
            let s = Store::open(dir.path()).unwrap();
            assert_eq!(s.load_accounts().unwrap().len(), 1);
            // Pretend a newer binary wrote the file.
            s.write(vec![Mutation::Put(
                Table::Meta,
                Key::Text(META_SCHEMA_VERSION.into()),
                (SCHEMA_VERSION + 1).to_le_bytes().to_vec(),
            )])
            .await
            .unwrap();
            s.close().await.unwrap();
        }
        let err = Store::open(dir.path()).unwrap_err();
        assert!(
            matches!(err, StoreError::NewerSchema { found, .. } if found == SCHEMA_VERSION + 1),
            "{err}"
        );
        assert!(err.to_string().contains("newer than this binary"));
    }

    #[tokio::test]
    async fn a_replaced_secret_key_is_refused_and_a_missing_one_is_not_recreated() {
        let dir = tempfile::tempdir().unwrap();
        Store::open(dir.path()).unwrap().close().await.unwrap();
        let key_path = dir.path().join(secrets::KEY_FILE);
        let original = std::fs::read(&key_path).unwrap();

        std::fs::write(&key_path, [9u8; 32]).unwrap();
        assert!(matches!(
            Store::open(dir.path()),
            Err(StoreError::SecretKeyMismatch { .. })
        ));

        std::fs::remove_file(&key_path).unwrap();
        assert!(matches!(
            Store::open(dir.path()),
            Err(StoreError::SecretKeyMissing { .. })
        ));
        assert!(
            !key_path.exists(),
            "a missing key must not be silently replaced"
        );

        std::fs::write(&key_path, &original).unwrap();
        Store::open(dir.path()).unwrap().close().await.unwrap();
    }

    #[tokio::test]
    async fn an_empty_a_short_or_a_directory_store_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        Store::open(dir.path()).unwrap().close().await.unwrap();
        let path = dir.path().join(DB_FILE);
        let whole = std::fs::read(&path).unwrap();
        let check = |e: StoreError, said: &str| {
            let line = e.to_string();
            assert!(line.contains(said), "{line}");
            assert!(line.contains("restore"), "no remedy: {line}");
            assert!(!line.contains('\n'), "{line}");
        };
        for len in [0, 100, whole.len() / 2] {
            std::fs::write(&path, &whole[..len]).unwrap();
            check(Store::open(dir.path()).unwrap_err(), "damaged");
            check(Store::open_read_only(dir.path()).unwrap_err(), "damaged");
            check(check_integrity_of_copy(dir.path()).unwrap_err(), "damaged");
            assert_eq!(std::fs::read(&path).unwrap().len(), len, "rewritten");
        }
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        check(Store::open(dir.path()).unwrap_err(), "a directory");
        check(
            Store::open_read_only(dir.path()).unwrap_err(),
            "a directory",
        );
        check(
            check_integrity_of_copy(dir.path()).unwrap_err(),
            "a directory",
        );
        assert!(path.is_dir());
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, &whole).unwrap();
        let key = dir.path().join(secrets::KEY_FILE);
        std::fs::remove_file(&key).unwrap();
        std::fs::create_dir(&key).unwrap();
        check(Store::open(dir.path()).unwrap_err(), "secret.key");
        check(
            Store::open_read_only(dir.path()).unwrap_err(),
            "a directory",
        );

        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join(DB_FILE), [7u8; 9000]).unwrap();
        for e in [
            Store::open(other.path()).unwrap_err(),
            Store::open_read_only(other.path()).unwrap_err(),
        ] {
            assert!(matches!(e, StoreError::Damaged { .. }), "{e}");
            assert!(e.to_string().contains(DB_FILE), "{e}");
        }
    }

    #[tokio::test]
    async fn group_commit_acknowledges_every_job() {
        let s = Store::open_in_memory().unwrap();
        let mut tasks = Vec::new();
        for i in 0..2000u64 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                s.write(vec![Mutation::Put(
                    Table::Requests,
                    Key::Int(i),
                    vec![1, 2],
                )])
                .await
            }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(record_keys(&s), (0..2000).collect::<Vec<u64>>());
    }

    fn request_row(started_ms: u64) -> RequestRow {
        RequestRow {
            started_ms,
            key_name: "alice".into(),
            model: "gpt-5.5".into(),
            path: "/v1/responses".into(),
            stream: true,
            ws: false,
            outcome: "success".into(),
            status: 200,
            account: Some("acc-1".into()),
            attempts: Vec::new(),
            ttft_ms: Some(5),
            duration_ms: 20,
            usage: None,
            session: None,
            candidate_pool: vec!["acc-1".into(), "acc-2".into()],
            skipped: Vec::new(),
            affinity: "none".into(),
            queue: None,
            transport: "http".into(),
            ws_connect_ms: None,
            terminal_source: Some("upstream".into()),
            attempt_rules: Vec::new(),
            service_tier: None,
            served_tier: None,
            credit: None,
        }
    }

    /// A record started at `ms` (the `n`th of that millisecond), as the request log writes it.
    fn record(ms: u64, n: u64) -> Mutation {
        Store::request_put(ms << 16 | n, codec::encode(&request_row(ms)).unwrap())
    }

    /// Records that finish out of the order they started in, some stored one to a row (as
    /// before) and most several to a row: the newest are read newest first, those since a time
    /// oldest first, and each exactly once.
    #[tokio::test]
    async fn records_stored_several_to_a_row_read_back_by_their_own_times() {
        let s = Store::open_in_memory().unwrap();
        // One to a row: a commit of one record each.
        for ms in [1_000, 1_001] {
            s.write(vec![record(ms, 0)]).await.unwrap();
        }
        // 100 records finishing in an order of their own: a long request that started early
        // finishes among later ones.
        let mut order: Vec<u64> = (0..100).map(|i| (i * 37) % 100).collect();
        order.swap(0, 99);
        s.write(order.iter().map(|&i| record(2_000 + i, 1)).collect())
            .await
            .unwrap();
        let rows = {
            let txn = s.inner.db.begin_read().unwrap();
            txn.open_table(schema::REQUESTS).unwrap().len().unwrap()
        };
        assert_eq!(rows, 2 + 100_u64.div_ceil(grouped::RECORDS_PER_ROW as u64));
        let started = |read: Vec<(u64, RequestRow)>| {
            read.into_iter()
                .map(|(k, r)| {
                    assert_eq!(k >> 16, r.started_ms, "a record under its own key");
                    r.started_ms
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            started(s.recent_requests(10).unwrap()),
            (2_090..2_100).rev().collect::<Vec<_>>()
        );
        let mut all: Vec<u64> = (2_000..2_100).rev().collect();
        all.extend([1_001, 1_000]);
        assert_eq!(started(s.recent_requests(usize::MAX).unwrap()), all);
        assert_eq!(
            started(s.recent_requests(101).unwrap()),
            all[..101].to_vec()
        );
        assert_eq!(
            started(s.requests_since(2_050).unwrap()),
            (2_050..2_100).collect::<Vec<_>>()
        );
        assert_eq!(started(s.requests_since(1_001).unwrap()).len(), 101);
        assert_eq!(s.undecodable_rows(), 0);

        // Retention removes a row only when all of its records are older than the bound.
        s.write(vec![Mutation::DeleteIntBelow(Table::Requests, 2_050 << 16)])
            .await
            .unwrap();
        let kept = started(s.requests_since(0).unwrap());
        assert!(kept.iter().all(|&ms| ms >= 2_000), "{kept:?}");
        assert!(
            (2_050..2_100).all(|ms| kept.contains(&ms)),
            "nothing from the bound on is removed"
        );
    }

    /// A group of records cut short (a torn or hand-edited file) is counted and left out; the
    /// rows beside it are read.
    #[tokio::test]
    async fn a_group_that_cannot_be_read_apart_is_counted_and_the_rest_read() {
        let s = Store::open_in_memory().unwrap();
        s.write(vec![record(1, 0), record(2, 0)]).await.unwrap();
        let (_, mut cut) = grouped::group([(3 << 16, &[4u8, 1, 2][..]), (4 << 16, &[4u8][..])]);
        cut.truncate(cut.len() - 2);
        s.write(vec![Mutation::Put(Table::Requests, Key::Int(5 << 16), cut)])
            .await
            .unwrap();
        let read: Vec<u64> = s
            .recent_requests(10)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k >> 16)
            .collect();
        assert_eq!(read, vec![2, 1]);
        assert_eq!(s.undecodable_rows(), 1);
    }

    /// The keys of every stored request record, however the rows group them, in order.
    fn record_keys(s: &Store) -> Vec<u64> {
        let txn = s.inner.db.begin_read().unwrap();
        let t = txn.open_table(schema::REQUESTS).unwrap();
        let mut keys = Vec::new();
        for row in t.iter().unwrap() {
            let (k, v) = row.unwrap();
            let records = grouped::records(k.value(), v.value()).unwrap();
            keys.extend(records.into_iter().map(|(k, _)| k));
        }
        keys.sort_unstable();
        keys
    }

    /// Telemetry is committed in the background without waiting for a durable write, and a
    /// durable write commits every telemetry job queued before it.
    #[tokio::test]
    async fn telemetry_is_committed_on_its_own_and_by_the_next_durable_write() {
        let count = |s: &Store| record_keys(s).len();
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        for i in 0..300u64 {
            assert!(s.try_write(vec![Mutation::Put(Table::Requests, Key::Int(i), vec![1])]));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while count(&s) < 300 {
            assert!(
                std::time::Instant::now() < deadline,
                "telemetry never committed"
            );
            tokio::task::yield_now().await;
        }
        for i in 300..400u64 {
            assert!(s.try_write(vec![Mutation::Put(Table::Requests, Key::Int(i), vec![1])]));
        }
        s.put_settings("x", &SettingsRecord::default())
            .await
            .unwrap();
        assert_eq!(
            count(&s),
            400,
            "a durable write takes the telemetry before it along"
        );
        s.close().await.unwrap();
        drop(s);
        let again = Store::open(dir.path()).unwrap();
        assert_eq!(count(&again), 400, "closing makes it all durable");
    }

    /// Telemetry committed without an fsync and followed by nothing is made durable on its
    /// own: a copy of the file taken then (what a killed process leaves) holds it.
    #[tokio::test]
    async fn telemetry_followed_by_nothing_is_made_durable_within_a_second() {
        let count = |s: &Store| record_keys(s).len();
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        assert!(s.try_write(vec![Mutation::Put(Table::Requests, Key::Int(1), vec![1])]));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while count(&s) < 1 || s.unsynced() {
            assert!(
                std::time::Instant::now() < deadline,
                "telemetry never made durable"
            );
            tokio::task::yield_now().await;
        }
        let copy = tempfile::tempdir().unwrap();
        for f in [DB_FILE, "secret.key"] {
            std::fs::copy(dir.path().join(f), copy.path().join(f)).unwrap();
        }
        let crashed = Store::open(copy.path()).unwrap();
        assert_eq!(count(&crashed), 1);
        crashed.close().await.unwrap();
        s.close().await.unwrap();
    }

    #[tokio::test]
    async fn undecodable_rows_are_counted_and_left_out_and_the_rest_is_read() {
        let s = Store::open_in_memory().unwrap();
        s.put_account(&account("a"), None).await.unwrap();
        let garbage = |t: Table, k: &str| Mutation::Put(t, Key::Text(k.into()), vec![1, 0xff]);
        s.write(vec![
            garbage(Table::Accounts, "bad"),
            garbage(Table::ClientKeys, "key_bad"),
            garbage(Table::AccountHealth, "bad"),
            // Written by a newer binary.
            Mutation::Put(Table::Settings, Key::Text("scheduling".into()), vec![9, 0]),
            Mutation::Put(Table::Requests, Key::Int(7), vec![2, 0xff]),
        ])
        .await
        .unwrap();
        assert_eq!(s.undecodable_rows(), 0);
        assert_eq!(s.load_accounts().unwrap(), vec![account("a")]);
        assert!(s.load_keys().unwrap().is_empty());
        assert!(s.load_health().unwrap().is_empty());
        assert_eq!(s.get_settings("scheduling").unwrap(), None);
        assert!(s.recent_requests(10).unwrap().is_empty());
        assert_eq!(s.undecodable_rows(), 5);
    }

    /// One commit opens each table once, whatever order its mutations come in: each lands in
    /// its own table, in order.
    #[tokio::test]
    async fn a_commit_touching_tables_in_turn_keeps_each_change_in_its_table_and_order() {
        let s = Store::open_in_memory().unwrap();
        let text = |t: Table, k: &str, v: u8| Mutation::Put(t, Key::Text(k.into()), vec![v]);
        let int = |k: u64, v: u8| Mutation::Put(Table::Requests, Key::Int(k), vec![v]);
        s.write(vec![
            int(1, 1),
            text(Table::Settings, "a", 1),
            int(2, 2),
            text(Table::Snapshots, "a", 2),
            Mutation::DeleteIntBelow(Table::Requests, 2),
            text(Table::Settings, "b", 3),
            Mutation::Delete(Table::Settings, Key::Text("a".into())),
            int(3, 3),
            text(Table::Settings, "a", 4),
            Mutation::DeleteTextBelow(Table::Snapshots, "b".into()),
        ])
        .await
        .unwrap();
        let txn = s.inner.db.begin_read().unwrap();
        let rows = |def: redb::TableDefinition<&str, &[u8]>| {
            let t = txn.open_table(def).unwrap();
            t.iter()
                .unwrap()
                .map(|r| {
                    let (k, v) = r.unwrap();
                    (k.value().to_string(), v.value().to_vec())
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            rows(schema::SETTINGS),
            vec![("a".to_string(), vec![4]), ("b".to_string(), vec![3])]
        );
        assert!(rows(schema::SNAPSHOTS).is_empty());
        let requests = txn.open_table(schema::REQUESTS).unwrap();
        let got: Vec<(u64, Vec<u8>)> = requests
            .iter()
            .unwrap()
            .map(|r| {
                let (k, v) = r.unwrap();
                (k.value(), v.value().to_vec())
            })
            .collect();
        assert_eq!(got, vec![(2, vec![2]), (3, vec![3])]);
    }

    #[tokio::test]
    async fn a_bad_job_does_not_fail_its_batch_neighbours() {
        let s = Store::open_in_memory().unwrap();
        let bad = s.write(vec![Mutation::Put(Table::Accounts, Key::Int(1), vec![])]);
        let settings = SettingsRecord {
            max_concurrency: Some(5),
            ..SettingsRecord::default()
        };
        let good = s.write(vec![Store::put(Table::Settings, "x", &settings).unwrap()]);
        let (bad, good) = tokio::join!(bad, good);
        assert!(matches!(bad, Err(StoreError::KeyKind(Table::Accounts))));
        good.unwrap();
        assert_eq!(s.get_settings("x").unwrap(), Some(settings));
    }
}
