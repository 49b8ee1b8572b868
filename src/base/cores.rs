//! The serving threads: one single-threaded runtime per core, each serving the client
//! connections placed on it from start to end. A connection's request, the reading of its
//! body and its upstream connection (each thread has its own upstream pool, by
//! [`slot`]) then share one thread, so handing an event or a chunk between them wakes no
//! other thread. On the work-stealing runtime they were spread over both cores and each hand-off
//! woke the other one: at 32 connections on 2 cores, this costs 37–40 µs of CPU per answer
//! against 52–53.
//!
//! The threads are started once per process, on the first connection, and live as long as it:
//! a request whose client left runs on to its end (and keeps its record) on its thread after
//! the server that accepted it has stopped.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;

thread_local! {
    /// This thread's slot: 0 off the serving threads, `1..=count()` on them.
    static SLOT: Cell<usize> = const { Cell::new(0) };
}

/// How many serving threads there are (one per core), whether or not they have started.
pub fn count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// This thread's slot: 0 off the serving threads, `1..=count()` on them. Whatever keeps a
/// per-thread copy (an upstream pool) keeps `count() + 1` and takes the one at this index.
pub fn slot() -> usize {
    SLOT.with(Cell::get)
}

/// The serving threads.
pub struct Cores {
    handles: Vec<Handle>,
    /// The connections open on each.
    open: Vec<AtomicUsize>,
}

/// A connection's place on a serving thread, counted there until it is dropped.
pub struct Placed {
    cores: &'static Cores,
    index: usize,
}

impl Placed {
    /// The runtime of the thread the connection is placed on.
    pub fn handle(&self) -> &'static Handle {
        &self.cores.handles[self.index]
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        self.cores.open[self.index].fetch_sub(1, Ordering::Relaxed);
    }
}

/// The serving threads, started on the first call; `None` when they cannot be (no room for
/// another thread or event queue): the caller then serves on its own runtime.
pub fn started() -> Option<&'static Cores> {
    static CORES: OnceLock<Option<Cores>> = OnceLock::new();
    CORES
        .get_or_init(|| match start(count()) {
            Ok(cores) => Some(cores),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the serving threads; serving on the main runtime");
                None
            }
        })
        .as_ref()
}

fn start(n: usize) -> std::io::Result<Cores> {
    let mut handles = Vec::with_capacity(n);
    for i in 1..=n {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        handles.push(runtime.handle().clone());
        std::thread::Builder::new()
            .name(format!("serve-{i}"))
            .spawn(move || {
                SLOT.with(|s| s.set(i));
                runtime.block_on(std::future::pending::<()>());
            })?;
    }
    let open = handles.iter().map(|_| AtomicUsize::new(0)).collect();
    Ok(Cores { handles, open })
}

impl Cores {
    /// A place for a new connection: the thread with the fewest open (the first of them).
    pub fn place(&'static self) -> Placed {
        let index = (0..self.open.len())
            .min_by_key(|&i| self.open[i].load(Ordering::Relaxed))
            .unwrap_or(0);
        self.open[index].fetch_add(1, Ordering::Relaxed);
        Placed { cores: self, index }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(cores: &Cores) -> Vec<usize> {
        cores
            .open
            .iter()
            .map(|o| o.load(Ordering::Relaxed))
            .collect()
    }

    /// Connections go to the thread with the fewest open and are uncounted when they end; a
    /// serving thread's slot is its index plus one, and 0 elsewhere.
    #[tokio::test]
    async fn connections_spread_over_the_threads_and_each_knows_its_slot() {
        let cores: &'static Cores = Box::leak(Box::new(start(3).expect("threads")));
        assert_eq!(slot(), 0, "off the serving threads");
        let first = cores.place();
        let second = cores.place();
        assert_eq!(open(cores), vec![1, 1, 0]);
        drop(first);
        assert_eq!(open(cores), vec![0, 1, 0], "uncounted when it ends");
        let placed: Vec<Placed> = (0..5).map(|_| cores.place()).collect();
        assert_eq!(open(cores), vec![2, 2, 2], "the fewest open first");
        let mut slots = Vec::new();
        for p in placed.iter().chain([&second]) {
            let (tx, rx) = tokio::sync::oneshot::channel();
            p.handle().spawn(async move {
                let _ = tx.send((slot(), std::thread::current().name().map(String::from)));
            });
            let (s, name) = rx.await.unwrap();
            assert_eq!(name, Some(format!("serve-{s}")));
            slots.push(s);
        }
        slots.sort_unstable();
        assert_eq!(slots, vec![1, 1, 2, 2, 3, 3]);
        drop((placed, second));
        assert_eq!(open(cores), vec![0, 0, 0]);
    }
}
