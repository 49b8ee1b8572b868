//! A one-shot signal that one task waits on: set once, seen by a single atomic load.
//!
//! A client connection's task waits on two of these (wind down, close) at every one of its
//! wakes, which while a request runs on it is every frame: a cancellation token there took
//! two locks per wake.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use futures_util::task::AtomicWaker;

/// Set once; [`Signal::wait`] resolves from then on. Only one task at a time may wait on
/// it (its waker is the one woken).
#[derive(Default)]
pub struct Signal {
    set: AtomicBool,
    waker: AtomicWaker,
}

impl std::fmt::Debug for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signal")
            .field("set", &self.is_set())
            .finish()
    }
}

impl Signal {
    pub fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.waker.wake();
    }

    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Resolves once the signal is set (at once if it is).
    pub fn wait(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.is_set() {
                return Poll::Ready(());
            }
            self.waker.register(cx.waker());
            // Set between the check and the registration: seen here.
            if self.is_set() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_waiting_task_wakes_when_it_is_set_and_a_later_wait_ends_at_once() {
        let s = Arc::new(Signal::default());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let waiter = {
            let s = Arc::clone(&s);
            tokio::spawn(async move {
                let wait = s.wait();
                let _ = tx.send(());
                wait.await;
            })
        };
        rx.await.unwrap();
        assert!(!s.is_set());
        s.set();
        waiter.await.unwrap();
        assert!(s.is_set());
        s.wait().await;
    }
}
