//! The single writer task. Every change to the store goes through it; it batches whatever is
//! queued (group commit: up to [`MAX_BATCH_OPS`] mutations, or what arrived within
//! [`MAX_BATCH_WINDOW`] of the first) into one redb transaction on its own thread, then
//! acknowledges each job. An acknowledged write is durable (redb's default durability fsyncs
//! on commit). Request records that follow one another in a commit are stored several to a
//! row ([`super::grouped`]).
//!
//! Jobs that need their write (accounts, keys, settings, health) wait for queue space and for
//! the acknowledgement; telemetry jobs (request records) are offered with `try_send` and
//! counted as dropped when the queue is full, so the request path never waits on the disk.
//! A batch of telemetry alone is gathered for up to [`TELEMETRY_WINDOW`] and committed without
//! an fsync, except once every [`TELEMETRY_DURABLE_EVERY`]; when nothing else comes within that
//! time after such a commit, an empty durable commit persists it. A crash loses at most that
//! much of it, and persisting records costs a few large commits a second instead of one per
//! batch.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redb::{Database, WriteTransaction};
use tokio::sync::{mpsc, oneshot};

use super::schema::{REQUESTS, Table};
use super::{StoreError, grouped};

/// Largest number of mutations folded into one transaction.
pub const MAX_BATCH_OPS: usize = 512;
/// Longest time a batch stays open after its first job.
pub const MAX_BATCH_WINDOW: Duration = Duration::from_millis(50);
/// Jobs that can wait for the writer.
pub const QUEUE_CAPACITY: usize = 8192;
/// How long telemetry alone is gathered before it is committed.
pub const TELEMETRY_WINDOW: Duration = Duration::from_millis(200);
/// Largest batch of telemetry alone.
pub const MAX_TELEMETRY_OPS: usize = 8192;
/// Telemetry commits skip the fsync, but not for longer than this.
pub const TELEMETRY_DURABLE_EVERY: Duration = Duration::from_secs(1);

/// The key of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    Text(String),
    Int(u64),
}

/// One change to one row.
#[derive(Debug, Clone)]
pub enum Mutation {
    Put(Table, Key, Vec<u8>),
    Delete(Table, Key),
    /// Deletes rows of an integer-keyed table whose key is below the bound (retention).
    DeleteIntBelow(Table, u64),
    /// Deletes rows of a text-keyed table whose key sorts below the bound (retention).
    DeleteTextBelow(Table, String),
}

pub(crate) type Ack = oneshot::Sender<Result<(), StoreError>>;

pub(crate) enum Job {
    /// Mutations applied atomically (all or none), acknowledged after commit if asked.
    Write(Vec<Mutation>, Option<Ack>),
    /// Telemetry: may wait for company and be committed without an fsync.
    Telemetry(Vec<Mutation>),
    /// Commit what came before, acknowledge, and stop.
    Stop(Ack),
}

/// Runs the writer on the current (dedicated) thread until a `Stop` job or every sender is gone.
/// `unsynced` says whether a commit is not yet durable.
pub(crate) fn run(
    db: Arc<Database>,
    path: PathBuf,
    mut rx: mpsc::Receiver<Job>,
    unsynced: Arc<AtomicBool>,
) {
    let mut stop_ack: Option<Ack> = None;
    let mut last_durable = Instant::now();
    while stop_ack.is_none() {
        let first = if unsynced.load(Ordering::Relaxed) {
            match recv_until(&mut rx, last_durable + TELEMETRY_DURABLE_EVERY) {
                Next::Job(job) => job,
                Next::Closed => break,
                Next::Quiet => {
                    // Nothing came to carry the last commits along: persist them on their own.
                    if commit(&db, &path, &[], true).is_ok() {
                        unsynced.store(false, Ordering::Relaxed);
                    }
                    last_durable = Instant::now();
                    continue;
                }
            }
        } else {
            match rx.blocking_recv() {
                Some(job) => job,
                None => break,
            }
        };
        let opened = Instant::now();
        let mut batch: Vec<(Vec<Mutation>, Option<Ack>)> = Vec::new();
        let mut ops = 0;
        // Whether a job in the batch needs its write durable (or the writer stops).
        let mut durable = false;
        let mut next = Some(first);
        loop {
            while let Some(job) = next.take() {
                match job {
                    Job::Write(muts, ack) => {
                        ops += muts.len();
                        batch.push((muts, ack));
                        durable = true;
                    }
                    Job::Telemetry(muts) => {
                        ops += muts.len();
                        batch.push((muts, None));
                    }
                    Job::Stop(ack) => {
                        stop_ack = Some(ack);
                        durable = true;
                        break;
                    }
                }
                if stop_ack.is_some()
                    || ops >= MAX_TELEMETRY_OPS
                    || (durable && (ops >= MAX_BATCH_OPS || opened.elapsed() >= MAX_BATCH_WINDOW))
                {
                    break;
                }
                next = rx.try_recv().ok();
            }
            // Telemetry alone waits a little for more; anything else goes now.
            if durable
                || stop_ack.is_some()
                || ops >= MAX_TELEMETRY_OPS
                || opened.elapsed() >= TELEMETRY_WINDOW
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
            next = rx.try_recv().ok();
        }
        let immediate = durable || last_durable.elapsed() >= TELEMETRY_DURABLE_EVERY;
        if !batch.is_empty() {
            // Set before the commit: a reader who sees the rows must not see them as durable.
            if !immediate {
                unsynced.store(true, Ordering::Relaxed);
            }
            commit_batch(&db, &path, batch, immediate);
        }
        if immediate {
            unsynced.store(false, Ordering::Relaxed);
        }
        if immediate {
            last_durable = Instant::now();
        }
    }
    if unsynced.load(Ordering::Relaxed) && commit(&db, &path, &[], true).is_ok() {
        unsynced.store(false, Ordering::Relaxed);
    }
    if let Some(ack) = stop_ack {
        let _ = ack.send(Ok(()));
    }
}

enum Next {
    Job(Job),
    /// Nothing came before the deadline.
    Quiet,
    /// Every sender is gone.
    Closed,
}

/// The next job, waiting no later than `deadline` (a few milliseconds at a time: this runs only
/// while a commit waits to be made durable, at most [`TELEMETRY_DURABLE_EVERY`]).
fn recv_until(rx: &mut mpsc::Receiver<Job>, deadline: Instant) -> Next {
    loop {
        match rx.try_recv() {
            Ok(job) => return Next::Job(job),
            Err(mpsc::error::TryRecvError::Disconnected) => return Next::Closed,
            Err(mpsc::error::TryRecvError::Empty) if Instant::now() >= deadline => {
                return Next::Quiet;
            }
            Err(mpsc::error::TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn commit_batch(
    db: &Database,
    path: &Path,
    batch: Vec<(Vec<Mutation>, Option<Ack>)>,
    immediate: bool,
) {
    if batch.is_empty() {
        return;
    }
    let all: Vec<&Mutation> = batch.iter().flat_map(|(m, _)| m.iter()).collect();
    match commit(db, path, &all, immediate) {
        Ok(()) => {
            for (_, ack) in batch {
                if let Some(ack) = ack {
                    let _ = ack.send(Ok(()));
                }
            }
        }
        Err(e) if batch.len() == 1 => {
            tracing::error!(error = %e, "store write failed");
            if let Some((_, Some(ack))) = batch.into_iter().next() {
                let _ = ack.send(Err(e));
            }
        }
        Err(e) => {
            // One bad job must not fail its neighbours: retry each on its own.
            tracing::warn!(error = %e, jobs = batch.len(), "group commit failed; retrying jobs one by one");
            for (muts, ack) in batch {
                let refs: Vec<&Mutation> = muts.iter().collect();
                let res = commit(db, path, &refs, true);
                if let Err(e) = &res {
                    tracing::error!(error = %e, "store write failed");
                }
                if let Some(ack) = ack {
                    let _ = ack.send(res);
                }
            }
        }
    }
}

fn commit(
    db: &Database,
    path: &Path,
    muts: &[&Mutation],
    immediate: bool,
) -> Result<(), StoreError> {
    super::guarded(path, || {
        let mut txn = db.begin_write().map_err(StoreError::db)?;
        if !immediate {
            // Persisted by the next durable commit (at most TELEMETRY_DURABLE_EVERY away).
            txn.set_durability(redb::Durability::None)
                .map_err(StoreError::db)?;
        }
        let mut open = Open::new(&txn);
        let mut rest = muts;
        while let Some((first, tail)) = rest.split_first() {
            // Request records side by side go into rows of several ([`super::grouped`]).
            let run = rest
                .iter()
                .take(grouped::RECORDS_PER_ROW)
                .map_while(|m| record_put(m))
                .count();
            if run >= 2 {
                let (key, value) = grouped::group(rest[..run].iter().filter_map(|m| record_put(m)));
                open.requests()?
                    .insert(key, value.as_slice())
                    .map_err(StoreError::db)?;
                rest = &rest[run..];
            } else {
                apply(&mut open, first)?;
                rest = tail;
            }
        }
        drop(open);
        txn.commit().map_err(StoreError::db)
    })
}

/// A request record's key and value, when `m` stores one small enough to share a row.
fn record_put(m: &Mutation) -> Option<(u64, &[u8])> {
    match m {
        Mutation::Put(Table::Requests, Key::Int(k), v) if v.len() <= grouped::MAX_GROUPED => {
            Some((*k, v.as_slice()))
        }
        _ => None,
    }
}

/// The tables one commit has opened: each is opened once, however many of the commit's
/// mutations touch it (a request's record and its usage row, for each request of a batch).
struct Open<'t> {
    txn: &'t WriteTransaction,
    requests: Option<redb::Table<'t, u64, &'static [u8]>>,
    text: Vec<(Table, redb::Table<'t, &'static str, &'static [u8]>)>,
}

impl<'t> Open<'t> {
    fn new(txn: &'t WriteTransaction) -> Self {
        Open {
            txn,
            requests: None,
            text: Vec::new(),
        }
    }

    fn requests(&mut self) -> Result<&mut redb::Table<'t, u64, &'static [u8]>, StoreError> {
        let t = match self.requests.take() {
            Some(t) => t,
            None => self.txn.open_table(REQUESTS).map_err(StoreError::db)?,
        };
        Ok(self.requests.insert(t))
    }

    fn text(
        &mut self,
        table: Table,
        def: redb::TableDefinition<'static, &'static str, &'static [u8]>,
    ) -> Result<&mut redb::Table<'t, &'static str, &'static [u8]>, StoreError> {
        let i = match self.text.iter().position(|(t, _)| *t == table) {
            Some(i) => i,
            None => {
                let opened = self.txn.open_table(def).map_err(StoreError::db)?;
                self.text.push((table, opened));
                self.text.len() - 1
            }
        };
        Ok(&mut self.text[i].1)
    }
}

fn apply(open: &mut Open<'_>, m: &Mutation) -> Result<(), StoreError> {
    match m {
        Mutation::Put(table, key, value) => match (table.text_keyed(), key) {
            (Some(def), Key::Text(k)) => {
                open.text(*table, def)?
                    .insert(k.as_str(), value.as_slice())
                    .map_err(StoreError::db)?;
            }
            (None, Key::Int(k)) => {
                open.requests()?
                    .insert(*k, value.as_slice())
                    .map_err(StoreError::db)?;
            }
            _ => return Err(StoreError::KeyKind(*table)),
        },
        Mutation::Delete(table, key) => match (table.text_keyed(), key) {
            (Some(def), Key::Text(k)) => {
                open.text(*table, def)?
                    .remove(k.as_str())
                    .map_err(StoreError::db)?;
            }
            (None, Key::Int(k)) => {
                open.requests()?.remove(*k).map_err(StoreError::db)?;
            }
            _ => return Err(StoreError::KeyKind(*table)),
        },
        Mutation::DeleteIntBelow(table, bound) => {
            if table.text_keyed().is_some() {
                return Err(StoreError::KeyKind(*table));
            }
            open.requests()?
                .retain_in(..*bound, |_, _| false)
                .map_err(StoreError::db)?;
        }
        Mutation::DeleteTextBelow(table, bound) => {
            let def = table.text_keyed().ok_or(StoreError::KeyKind(*table))?;
            open.text(*table, def)?
                .retain_in::<&str, _>(..bound.as_str(), |_, _| false)
                .map_err(StoreError::db)?;
        }
    }
    Ok(())
}
