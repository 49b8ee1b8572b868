//! Shutdown's cut of the requests in flight: set once, when the grace period is over, and
//! waited for by every request at each of its waits (the upstream's headers and events, a
//! queue, a credit's spend).
//!
//! A request asks whether it is cut at every poll of those waits: eight or more times per
//! answer. That ask is one atomic load and, while it waits, its task's waker kept in the
//! request's own list (a lock no other request takes). The cut itself takes the list of
//! every request in flight, which each request joins when it starts and leaves when it ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};

/// The dispatcher's cut, or a request's part of it (see [`Cut::join`]).
#[derive(Clone, Default)]
pub struct Cut {
    shared: Arc<Shared>,
    own: Option<Arc<Own>>,
}

#[derive(Default)]
struct Shared {
    cut: AtomicBool,
    next: AtomicU64,
    /// Every request in flight, by the number it joined with.
    waiting: Mutex<hashbrown::HashMap<u64, Weak<Own>>>,
}

/// The tasks waiting on one request's cut: nearly always one (its own), kept in place, and a
/// second when the request moved to a task of its own after its reader left. A waker stays
/// until the request ends; waking a task that no longer waits is harmless.
#[derive(Default)]
struct Wakers {
    first: Option<Waker>,
    more: Vec<Waker>,
}

impl Wakers {
    fn keep(&mut self, waker: &Waker) {
        match &self.first {
            None => self.first = Some(waker.clone()),
            Some(w) if w.will_wake(waker) => {}
            Some(_) => {
                if !self.more.iter().any(|w| w.will_wake(waker)) {
                    self.more.push(waker.clone());
                }
            }
        }
    }

    fn take(&mut self) -> Vec<Waker> {
        let mut all = std::mem::take(&mut self.more);
        all.extend(self.first.take());
        all
    }
}

/// A request's place in the list, with its wakers (one allocation); it leaves the list when
/// the last copy is dropped.
struct Own {
    shared: Arc<Shared>,
    id: u64,
    wakers: Mutex<Wakers>,
}

impl Drop for Own {
    fn drop(&mut self) {
        lock(&self.shared.waiting).remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Cut {
    /// A request's own part of this cut, cut with it.
    pub fn join(&self) -> Cut {
        Cut {
            shared: Arc::clone(&self.shared),
            own: Some(Own::join(&self.shared)),
        }
    }

    /// Cuts every request, those in flight and those still to come.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        // Taken out of the list first: a request that ends meanwhile (its part dropped
        // here) leaves the list under its lock.
        let waiting: Vec<Arc<Own>> = lock(&self.shared.waiting)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for own in waiting {
            let wakers = lock(&own.wakers).take();
            wakers.into_iter().for_each(Waker::wake);
        }
    }

    pub fn is_cut(&self) -> bool {
        self.shared.cut.load(Ordering::SeqCst)
    }

    /// Resolves when the cut is made (at once if it was).
    pub fn cut_off(&self) -> CutOff<'_> {
        CutOff {
            cut: self,
            temporary: None,
        }
    }
}

impl Own {
    fn join(shared: &Arc<Shared>) -> Arc<Own> {
        let own = Arc::new(Own {
            shared: Arc::clone(shared),
            id: shared.next.fetch_add(1, Ordering::Relaxed),
            wakers: Mutex::default(),
        });
        lock(&shared.waiting).insert(own.id, Arc::downgrade(&own));
        own
    }
}

/// The future of [`Cut::cut_off`]. On the dispatcher's own cut (no request's part) it joins
/// the list for as long as it waits.
pub struct CutOff<'a> {
    cut: &'a Cut,
    temporary: Option<Arc<Own>>,
}

impl Future for CutOff<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if this.cut.is_cut() {
            return Poll::Ready(());
        }
        let own = match &this.cut.own {
            Some(own) => &**own,
            None => this
                .temporary
                .get_or_insert_with(|| Own::join(&this.cut.shared)),
        };
        lock(&own.wakers).keep(cx.waker());
        // Made after the check above and before the waker was kept: seen here.
        if this.cut.is_cut() {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cut_wakes_every_waiter_and_every_later_wait_ends_at_once() {
        let root = Cut::default();
        let requests: Vec<Cut> = (0..3).map(|_| root.join()).collect();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut waits = tokio::task::JoinSet::new();
        for (i, r) in requests.iter().enumerate() {
            // Two tasks on one request's part, and one on the dispatcher's own.
            for _ in 0..2 {
                let (r, tx) = (r.clone(), tx.clone());
                waits.spawn(async move {
                    let started = r.cut_off();
                    let _ = tx.send(());
                    started.await;
                    i
                });
            }
        }
        let (r, tx2) = (root.clone(), tx.clone());
        waits.spawn(async move {
            let wait = r.cut_off();
            let _ = tx2.send(());
            wait.await;
            99
        });
        for _ in 0..7 {
            rx.recv().await.unwrap();
        }
        // Each has started (some may not have polled yet: they see the cut when they do).
        assert!(!root.is_cut());
        root.cut();
        let mut ended = Vec::new();
        while let Some(i) = waits.join_next().await {
            ended.push(i.unwrap());
        }
        ended.sort_unstable();
        assert_eq!(ended, [0, 0, 1, 1, 2, 2, 99]);
        assert!(requests.iter().all(Cut::is_cut));
        // A request joined after the cut is cut already.
        root.join().cut_off().await;
    }

    #[tokio::test]
    async fn a_request_leaves_the_list_when_its_last_copy_goes() {
        let root = Cut::default();
        let r = root.join();
        let copy = r.clone();
        assert_eq!(lock(&root.shared.waiting).len(), 1);
        drop(r);
        assert_eq!(lock(&root.shared.waiting).len(), 1);
        drop(copy);
        assert!(lock(&root.shared.waiting).is_empty());
        // The dispatcher's own wait joins for as long as it waits.
        let mut wait = Box::pin(root.cut_off());
        let waker = futures_util::task::noop_waker();
        assert!(
            wait.as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        assert_eq!(lock(&root.shared.waiting).len(), 1);
        drop(wait);
        assert!(lock(&root.shared.waiting).is_empty());
    }
}
