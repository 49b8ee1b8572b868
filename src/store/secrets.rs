//! Account secrets at rest: ChaCha20-Poly1305 under `secret.key` (32 random bytes, mode 0600,
//! created on first start). Each sealed value is `nonce(12) || ciphertext+tag`, with the
//! record's table and id as associated data, so a sealed value cannot be moved to another
//! account.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use serde::{Deserialize, Serialize};

use super::StoreError;

pub const KEY_FILE: &str = "secret.key";
const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 12;

/// A string that must not be shown: `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Serializes a secret that may be set as `***` (the printed configuration).
pub fn masked<S: serde::Serializer>(v: &Option<Secret>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(_) => s.serialize_str("***"),
        None => s.serialize_none(),
    }
}

/// Seals and opens values with the state directory's key.
#[derive(Clone)]
pub struct Sealer {
    cipher: ChaCha20Poly1305,
    id: String,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Sealer(***)")
    }
}

impl Sealer {
    pub fn from_key(key: &[u8; KEY_LEN]) -> Self {
        Self {
            cipher: ChaCha20Poly1305::new(Key::from_slice(key)),
            id: key_id(key),
        }
    }

    /// The key's id (see [`key_id`]).
    pub fn key_id(&self) -> &str {
        &self.id
    }

    pub fn seal(&self, aad: &str, plaintext: &[u8]) -> Result<Vec<u8>, StoreError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| StoreError::Random(e.to_string()))?;
        let ct = self
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| StoreError::Seal)?;
        let mut out = Vec::with_capacity(NONCE_LEN + ct.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        Ok(out)
    }

    /// `None` when the value was not sealed by this key for this `aad`.
    pub fn open(&self, aad: &str, sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < NONCE_LEN {
            return None;
        }
        let (nonce, ct) = sealed.split_at(NONCE_LEN);
        self.cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: aad.as_bytes(),
                },
            )
            .ok()
    }
}

/// A key's id: 16 hex digits of a SHA-256 over it, which say whether two keys are the same
/// without saying anything about the key (backups carry it, `doctor` shows it).
pub fn key_id(key: &[u8; KEY_LEN]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"switchyard secret.key id\n")
        .chain_update(key)
        .finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads `secret.key`; creates it (0600) only when `may_create` and it does not exist.
pub fn load_or_create_key(dir: &Path, may_create: bool) -> Result<[u8; KEY_LEN], StoreError> {
    let path = dir.join(KEY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let key: [u8; KEY_LEN] =
                bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| StoreError::SecretKeyCorrupt {
                        path: path.clone(),
                        reason: format!("expected {KEY_LEN} bytes, found {}", bytes.len()),
                    })?;
            if let Ok(meta) = std::fs::metadata(&path)
                && meta.permissions().mode() & 0o077 != 0
            {
                tracing::warn!(path = %path.display(), "secret.key is readable by others; chmod 600 it");
            }
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !may_create {
                return Err(StoreError::SecretKeyMissing { path });
            }
            let mut key = [0u8; KEY_LEN];
            getrandom::fill(&mut key).map_err(|e| StoreError::Random(e.to_string()))?;
            // Write to a temporary name and rename, so a crash never leaves a short key file.
            let tmp = dir.join(format!(".{KEY_FILE}.{}", std::process::id()));
            let io = |source| StoreError::StateDir {
                path: dir.to_path_buf(),
                source,
            };
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(io)?;
            f.write_all(&key).map_err(io)?;
            f.sync_all().map_err(io)?;
            std::fs::rename(&tmp, &path).map_err(io)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => {
            Err(StoreError::SecretKeyCorrupt {
                path,
                reason: "it is a directory, not a 32-byte file".into(),
            })
        }
        Err(source) => Err(StoreError::Io { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_the_same_key_and_aad() {
        let s = Sealer::from_key(&[7u8; 32]);
        let sealed = s.seal("accounts/a", b"token").unwrap();
        assert!(!sealed.windows(5).any(|w| w == b"token"));
        assert_eq!(s.open("accounts/a", &sealed).unwrap(), b"token");
        assert!(s.open("accounts/b", &sealed).is_none());
        assert!(
            Sealer::from_key(&[8u8; 32])
                .open("accounts/a", &sealed)
                .is_none()
        );
        assert!(s.open("accounts/a", &sealed[..5]).is_none());
    }

    #[test]
    fn key_file_is_created_0600_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let k1 = load_or_create_key(dir.path(), true).unwrap();
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_or_create_key(dir.path(), false).unwrap(), k1);
    }

    #[test]
    fn corrupt_or_missing_key_is_a_clear_error_and_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            load_or_create_key(dir.path(), false),
            Err(StoreError::SecretKeyMissing { .. })
        ));
        std::fs::write(dir.path().join(KEY_FILE), b"short").unwrap();
        let err = load_or_create_key(dir.path(), true).unwrap_err();
        assert!(
            err.to_string().contains("expected 32 bytes, found 5"),
            "{err}"
        );
        assert_eq!(std::fs::read(dir.path().join(KEY_FILE)).unwrap(), b"short");
    }

    #[test]
    fn secret_debug_and_display_are_masked() {
        let s = Secret::new("sk-very-secret");
        assert_eq!(format!("{s:?} {s}"), "*** ***");
    }
}
