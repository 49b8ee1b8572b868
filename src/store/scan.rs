//! A full read of the store, row by row, each as its type: what `doctor` asks for, so that every
//! row that cannot be read is in the quarantine list afterwards, not only those a start met.

use super::records::{SettingsRecord, SnapshotRecord};
use super::{Store, StoreError, schema};

/// What a scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Rows read per table (the ones that could be read).
    pub rows: Vec<(String, u64)>,
    /// Accounts that have no tokens stored at all.
    pub without_tokens: Vec<String>,
}

impl Store {
    /// Reads every row of every table (account tokens and proxies opened with the key); what
    /// cannot be read is quarantined as by any read. A damaged file is an error.
    pub fn scan(&self) -> Result<Scan, StoreError> {
        let mut scan = Scan::default();
        let mut count = |t: &str, n: usize| scan.rows.push((t.to_string(), n as u64));
        let accounts = self.load_accounts()?;
        count("accounts", accounts.len());
        let (mut tokens, mut without) = (0, Vec::new());
        for a in &accounts {
            match self.account_secrets(&a.id) {
                Ok(Some(_)) => tokens += 1,
                Ok(None) => without.push(a.id.clone()),
                // Quarantined by the read itself.
                Err(StoreError::Unseal { .. } | StoreError::Codec { .. }) => {}
                Err(e) => return Err(e),
            }
            match self.account_proxy(&a.id) {
                Ok(_) | Err(StoreError::Unseal { .. } | StoreError::Codec { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        count("account_secrets", tokens);
        count("client_keys", self.load_keys()?.len());
        count("account_health", self.load_health()?.len());
        count(
            "settings",
            self.list::<SettingsRecord>(schema::SETTINGS)?.len(),
        );
        count(
            "snapshots",
            self.list::<SnapshotRecord>(schema::SNAPSHOTS)?.len(),
        );
        count("requests", self.recent_requests(usize::MAX)?.len());
        count("usage_hourly", self.usage_between(0, u64::MAX / 2)?.len());
        scan.without_tokens = without;
        Ok(scan)
    }
}
