//! Request records: one per `/v1` request, with its attempt chain. The newest are kept in
//! memory for the admin API; all are offered to the store as telemetry (dropped, and counted,
//! when the writer is behind) and pruned by age.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redb::ReadableDatabase;
use switchyard_tui::wire;

use crate::clock::SharedClock;
use crate::store::schema::Table;
use crate::store::writer::{Key, Mutation};
use crate::store::{Store, codec};

/// Records kept in memory.
pub const RING: usize = 2000;

/// The request log. Cloning shares it.
#[derive(Clone)]
pub struct RequestLog {
    ring: Arc<Mutex<VecDeque<wire::RequestRecord>>>,
    store: Store,
    clock: SharedClock,
    seq: Arc<AtomicU64>,
    /// Records pushed since start (for "what is new since").
    pushed: Arc<AtomicU64>,
}

impl RequestLog {
    /// Loads the newest records from the store.
    pub fn load(store: Store, clock: SharedClock) -> RequestLog {
        let mut ring = VecDeque::with_capacity(RING);
        match store.recent_requests(RING) {
            Ok(records) => ring.extend(records.into_iter().rev()),
            Err(e) => tracing::warn!(error = %e, "cannot read stored request records"),
        }
        RequestLog {
            ring: Arc::new(Mutex::new(ring)),
            store,
            clock,
            seq: Arc::new(AtomicU64::new(0)),
            pushed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A new, time-ordered record key (also the record's id).
    pub fn next_key(&self) -> u64 {
        let ms = self.clock.now_ms();
        (ms << 16) | (self.seq.fetch_add(1, Ordering::Relaxed) & 0xffff)
    }

    pub fn id_of(key: u64) -> String {
        format!("req_{key:016x}")
    }

    /// Keeps a finished record: in memory at once, in the store when the writer has room.
    pub fn push(&self, key: u64, record: wire::RequestRecord) {
        match codec::encode(&record) {
            Ok(bytes) => {
                self.store
                    .try_write(vec![Mutation::Put(Table::Requests, Key::Int(key), bytes)]);
            }
            Err(e) => tracing::error!(error = %e, "cannot encode a request record"),
        }
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() >= RING {
            ring.pop_front();
        }
        ring.push_back(record);
        self.pushed.fetch_add(1, Ordering::Relaxed);
    }

    /// Records pushed since start.
    pub fn total(&self) -> u64 {
        self.pushed.load(Ordering::Relaxed)
    }

    /// The records pushed after the first `seen` (newest first, at most the ring).
    pub fn newer_than(&self, seen: u64) -> Vec<wire::RequestRecord> {
        let new = usize::try_from(self.total().saturating_sub(seen)).unwrap_or(usize::MAX);
        if new == 0 {
            return Vec::new();
        }
        self.recent(new.min(RING))
    }

    /// The newest `limit` records, newest first.
    pub fn recent(&self, limit: usize) -> Vec<wire::RequestRecord> {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.iter().rev().take(limit).cloned().collect()
    }

    /// Deletes stored records older than `days`.
    pub fn prune(&self, days: u32) {
        let cutoff_ms = self
            .clock
            .now_ms()
            .saturating_sub(u64::from(days) * 24 * 3600 * 1000);
        self.store.try_write(vec![Mutation::DeleteIntBelow(
            Table::Requests,
            cutoff_ms << 16,
        )]);
    }
}

impl Store {
    /// The newest `limit` stored request records, newest first.
    pub fn recent_requests(
        &self,
        limit: usize,
    ) -> Result<Vec<wire::RequestRecord>, crate::store::StoreError> {
        use redb::ReadableTable;
        let txn = self
            .db()
            .begin_read()
            .map_err(crate::store::StoreError::db)?;
        let table = txn
            .open_table(crate::store::schema::REQUESTS)
            .map_err(crate::store::StoreError::db)?;
        let mut out = Vec::new();
        for row in table
            .iter()
            .map_err(crate::store::StoreError::db)?
            .rev()
            .take(limit)
        {
            let (_, v) = row.map_err(crate::store::StoreError::db)?;
            if let Ok(r) = codec::decode::<wire::RequestRecord>(v.value()) {
                out.push(r);
            }
        }
        Ok(out)
    }
}
