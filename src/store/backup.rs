//! Backups: a consistent copy of the store, taken from one read transaction while the daemon
//! serves (every table copied into a fresh file), and the file format that carries it.
//!
//! A backup file is three text lines, an empty line, the store's bytes and, only when asked
//! for, the 32 bytes of `secret.key`:
//!
//! ```text
//! switchyard backup 1
//! {"version":"0.4.0","schema":4,"created_at":"…","store_bytes":N,"store_sha256":"…","key_id":"…","key_included":false}
//! It does not hold secret.key: restoring it needs the secret.key it was sealed with (key id …).
//!
//! <store bytes><key bytes>
//! ```
//!
//! so `head -3 FILE` says what it is and what restoring it needs. The store's SHA-256 is
//! checked before anything is restored; the key id (`secrets::key_id`) tells whether a key is
//! the right one without revealing it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use redb::ReadableTable;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::schema::{self, SCHEMA_VERSION, Table};
use super::{Store, StoreError};

pub const MAGIC: &str = "switchyard backup 1";
/// Longest header accepted when reading a backup.
const MAX_HEADER: usize = 64 * 1024;

/// What a backup holds, in its second line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The release that took it.
    pub version: String,
    pub schema: u64,
    pub created_at: String,
    pub store_bytes: u64,
    pub store_sha256: String,
    /// The id of the key its secrets are sealed with.
    pub key_id: String,
    pub key_included: bool,
}

impl Manifest {
    /// The third line: what restoring it needs, in words.
    pub fn note(&self) -> String {
        if self.key_included {
            format!(
                "It holds secret.key (key id {}): keep it like a password.",
                self.key_id
            )
        } else {
            format!(
                "It does not hold secret.key: restoring it needs the secret.key it was sealed \
                 with (key id {}).",
                self.key_id
            )
        }
    }

    /// The header: magic, manifest, note, empty line.
    pub fn header(&self) -> Vec<u8> {
        let json = serde_json::to_string(self).unwrap_or_default();
        format!("{MAGIC}\n{json}\n{}\n\n", self.note()).into_bytes()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a switchyard backup ({why})")]
    NotABackup { path: PathBuf, why: String },
    #[error(
        "{path} is damaged: its store does not match the checksum it was written with; take \
         another backup, or use an older one"
    )]
    Checksum { path: PathBuf },
}

/// A backup file, read and checked.
#[derive(Debug)]
pub struct Backup {
    pub manifest: Manifest,
    pub store: Vec<u8>,
    pub key: Option<[u8; 32]>,
}

/// Reads and checks a backup: its header, its length and the store's checksum.
pub fn read(path: &Path) -> Result<Backup, BackupError> {
    let io = |source| BackupError::Io {
        path: path.to_path_buf(),
        source,
    };
    let not = |why: &str| BackupError::NotABackup {
        path: path.to_path_buf(),
        why: why.into(),
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io)?;
    let head_end = bytes
        .windows(2)
        .take(MAX_HEADER)
        .position(|w| w == b"\n\n")
        .ok_or_else(|| not("no header"))?;
    let head = std::str::from_utf8(&bytes[..head_end]).map_err(|_| not("no header"))?;
    let mut lines = head.lines();
    if lines.next() != Some(MAGIC) {
        return Err(not("its first line is not `switchyard backup 1`"));
    }
    let manifest: Manifest = lines
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| not("its manifest cannot be read"))?;
    let body = &bytes[head_end + 2..];
    let store_len = usize::try_from(manifest.store_bytes).map_err(|_| not("too large"))?;
    let key_len = if manifest.key_included { 32 } else { 0 };
    if body.len() != store_len + key_len {
        return Err(BackupError::NotABackup {
            path: path.to_path_buf(),
            why: format!(
                "it is {} bytes long after its header, its manifest says {}",
                body.len(),
                store_len + key_len
            ),
        });
    }
    let (store, key) = body.split_at(store_len);
    if hex_sha256(store) != manifest.store_sha256 {
        return Err(BackupError::Checksum {
            path: path.to_path_buf(),
        });
    }
    let key = if manifest.key_included {
        let k: [u8; 32] = key.try_into().map_err(|_| not("its key is cut short"))?;
        Some(k)
    } else {
        None
    };
    Ok(Backup {
        manifest,
        store: store.to_vec(),
        key,
    })
}

pub fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Rows copied into a snapshot, per table.
pub type Counts = Vec<(String, u64)>;

impl Store {
    /// Writes a consistent copy of the store to `dest` (a new file, 0600): every table, as of
    /// one read transaction, so writes going on meanwhile are either wholly in it or not at
    /// all. The live file is only read. Returns the manifest a backup of it carries (its
    /// checksum computed from the file written).
    pub fn snapshot_to(&self, dest: &Path) -> Result<(Manifest, Counts), StoreError> {
        use std::os::unix::fs::OpenOptionsExt;
        // Created 0600 before redb writes a byte into it.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dest)
            .map_err(|source| StoreError::Io {
                path: dest.to_path_buf(),
                source,
            })?;
        let counts = self.guard(|| {
            let txn = self.inner.db.begin_read()?;
            let copy = super::open::builder(super::open::DEFAULT_CACHE_BYTES)
                .create(dest)
                .map_err(|e| StoreError::Db(format!("cannot create {}: {e}", dest.display())))?;
            let w = copy.begin_write().map_err(StoreError::db)?;
            let mut counts = Vec::new();
            for t in Table::ALL {
                let mut n = 0u64;
                match t.text_keyed() {
                    Some(def) => {
                        let mut to = w.open_table(def).map_err(StoreError::db)?;
                        if let Ok(from) = txn.open_table(def) {
                            for row in from.iter().map_err(StoreError::db)? {
                                let (k, v) = row.map_err(StoreError::db)?;
                                to.insert(k.value(), v.value()).map_err(StoreError::db)?;
                                n += 1;
                            }
                        }
                        counts.push((redb::TableHandle::name(&def).to_string(), n));
                    }
                    None => {
                        let mut to = w.open_table(schema::REQUESTS).map_err(StoreError::db)?;
                        if let Ok(from) = txn.open_table(schema::REQUESTS) {
                            for row in from.iter().map_err(StoreError::db)? {
                                let (k, v) = row.map_err(StoreError::db)?;
                                to.insert(k.value(), v.value()).map_err(StoreError::db)?;
                                n += 1;
                            }
                        }
                        counts.push(("requests".to_string(), n));
                    }
                }
            }
            w.commit().map_err(StoreError::db)?;
            copy.close().map_err(StoreError::db)?;
            Ok(counts)
        });
        let counts = match counts {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(dest);
                return Err(e);
            }
        };
        let bytes = std::fs::read(dest).map_err(|source| StoreError::Io {
            path: dest.to_path_buf(),
            source,
        })?;
        let manifest = Manifest {
            version: env!("CARGO_PKG_VERSION").to_string(),
            schema: SCHEMA_VERSION,
            created_at: crate::base::clock::rfc3339(crate::base::clock::system().now_secs()),
            store_bytes: bytes.len() as u64,
            store_sha256: hex_sha256(&bytes),
            key_id: self.key_id().to_string(),
            key_included: false,
        };
        Ok((manifest, counts))
    }
}

/// Writes a whole backup file to `out`: header, the snapshot at `store_file`, the key.
pub fn write(
    out: &mut impl Write,
    manifest: &Manifest,
    store_file: &Path,
    key: Option<&[u8; 32]>,
) -> std::io::Result<()> {
    out.write_all(&manifest.header())?;
    let mut f = std::fs::File::open(store_file)?;
    std::io::copy(&mut f, out)?;
    if let Some(k) = key {
        out.write_all(k)?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_snapshot_reads_back_as_a_backup_with_its_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("state")).unwrap();
        let snap = dir.path().join("snap.redb");
        let (mut manifest, counts) = s.snapshot_to(&snap).unwrap();
        assert!(
            counts.iter().any(|(t, n)| *t == "meta" && *n == 2),
            "{counts:?}"
        );
        manifest.key_included = true;
        let file = dir.path().join("b");
        let mut out = Vec::new();
        write(&mut out, &manifest, &snap, Some(&[3u8; 32])).unwrap();
        std::fs::write(&file, &out).unwrap();
        let b = read(&file).unwrap();
        assert_eq!(b.manifest, manifest);
        assert_eq!(b.key, Some([3u8; 32]));
        // One byte changed in the store: refused before anything is restored.
        let mut bad = out.clone();
        let at = bad.len() - 40;
        bad[at] ^= 1;
        std::fs::write(&file, &bad).unwrap();
        assert!(matches!(read(&file), Err(BackupError::Checksum { .. })));
        std::fs::write(&file, b"hello").unwrap();
        assert!(matches!(read(&file), Err(BackupError::NotABackup { .. })));
        s.close().await.unwrap();
    }
}
