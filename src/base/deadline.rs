//! Timeouts that seldom fire, kept cheaply on the serving threads.
//!
//! Every answer arms two timeouts that almost never fire: the SSE answer's wait for its head
//! (`server.keepalive_after`) and the upstream's header timeout. tokio's timer enters each in
//! its wheel under the driver's lock when first polled and takes it out again when dropped,
//! about 550 instructions each. On a serving thread (`base::cores`: one runtime, whose tasks
//! never move) a deadline is instead an entry in the thread's own list, swept every [`TICK`]
//! by one task that lives while the list has entries: armed and dropped without a lock or a
//! system call. It fires up to a tick late, so only deadlines at least [`COARSE_FROM`] away
//! are kept there; shorter ones, and all off the serving threads, are tokio's own.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use super::cores;

/// How often a serving thread's list is swept: the most a coarse deadline fires late.
pub const TICK: Duration = Duration::from_millis(100);

/// The shortest timeout kept in a serving thread's list (a tick late is at most a tenth of it).
pub const COARSE_FROM: Duration = Duration::from_secs(1);

/// The timeout's future ran out first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

pin_project_lite::pin_project! {
    /// [`timeout`]'s future.
    pub struct Timeout<F> {
        #[pin]
        f: F,
        deadline: Deadline,
    }
}

/// Runs `f` until it ends or `after` has passed, whichever is first: `tokio::time::timeout`,
/// with the deadline kept coarsely where it can be (see the module).
pub fn timeout<F: Future>(after: Duration, f: F) -> Timeout<F> {
    Timeout {
        f,
        deadline: Deadline::after(after),
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.f.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        Pin::new(this.deadline).poll(cx).map(|()| Err(Elapsed))
    }
}

/// A moment to wait for: ready once it has passed. Nothing is armed until it is first polled.
pub struct Deadline(Kind);

enum Kind {
    /// In this serving thread's list, at this index once armed.
    Coarse {
        at: Instant,
        index: Option<usize>,
    },
    Exact(Pin<Box<tokio::time::Sleep>>),
}

impl Deadline {
    /// `after` from now.
    pub fn after(after: Duration) -> Deadline {
        let at = Instant::now() + after;
        if after >= COARSE_FROM && cores::slot() != 0 {
            Deadline(Kind::Coarse { at, index: None })
        } else {
            Deadline(Kind::Exact(Box::pin(tokio::time::sleep_until(at))))
        }
    }
}

impl Future for Deadline {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.get_mut().0 {
            Kind::Exact(sleep) => sleep.as_mut().poll(cx),
            Kind::Coarse { at, index } => {
                let at = *at;
                LIST.with(|list| {
                    let mut list = list.borrow_mut();
                    match *index {
                        None => {
                            *index = Some(list.arm(at, cx.waker()));
                            if !list.swept {
                                list.swept = true;
                                tokio::spawn(sweep());
                            }
                            Poll::Pending
                        }
                        Some(i) => list.poll(i, cx.waker()),
                    }
                })
            }
        }
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        if let Kind::Coarse { index: Some(i), .. } = self.0 {
            // After the thread's list is gone (the thread ending) there is nothing to take
            // out.
            let _ = LIST.try_with(|list| list.borrow_mut().disarm(i));
        }
    }
}

thread_local! {
    static LIST: RefCell<List> = const { RefCell::new(List::new()) };
}

/// One serving thread's coarse deadlines.
struct List {
    entries: Vec<Entry>,
    /// Indexes of free entries, to be used again.
    free: Vec<usize>,
    /// Entries armed and not yet fired.
    armed: usize,
    /// The sweeping task is alive.
    swept: bool,
}

enum Entry {
    Free,
    Armed { at: Instant, waker: Waker },
    Fired,
}

impl List {
    const fn new() -> List {
        List {
            entries: Vec::new(),
            free: Vec::new(),
            armed: 0,
            swept: false,
        }
    }

    fn arm(&mut self, at: Instant, waker: &Waker) -> usize {
        let entry = Entry::Armed {
            at,
            waker: waker.clone(),
        };
        self.armed += 1;
        match self.free.pop() {
            Some(i) => {
                self.entries[i] = entry;
                i
            }
            None => {
                self.entries.push(entry);
                self.entries.len() - 1
            }
        }
    }

    /// Ready once fired; else the waker to wake is the latest one.
    fn poll(&mut self, i: usize, waker: &Waker) -> Poll<()> {
        match &mut self.entries[i] {
            Entry::Armed { waker: w, .. } => {
                if !w.will_wake(waker) {
                    w.clone_from(waker);
                }
                Poll::Pending
            }
            Entry::Fired | Entry::Free => Poll::Ready(()),
        }
    }

    fn disarm(&mut self, i: usize) {
        if matches!(self.entries[i], Entry::Armed { .. }) {
            self.armed -= 1;
        }
        self.entries[i] = Entry::Free;
        self.free.push(i);
    }

    /// Fires every entry due at `now` and returns their wakers, to be woken once the list is
    /// no longer borrowed. `true` when nothing is left armed: the sweeping task then ends.
    fn due(&mut self, now: Instant) -> (Vec<Waker>, bool) {
        let mut wake = Vec::new();
        if self.armed > 0 {
            for e in &mut self.entries {
                if matches!(e, Entry::Armed { at, .. } if *at <= now)
                    && let Entry::Armed { waker, .. } = std::mem::replace(e, Entry::Fired)
                {
                    wake.push(waker);
                }
            }
            self.armed -= wake.len();
        }
        let done = self.armed == 0;
        if done {
            self.swept = false;
            // A burst of requests leaves its entries behind: give their room back.
            if self.free.len() == self.entries.len() {
                self.entries = Vec::new();
                self.free = Vec::new();
            }
        }
        (wake, done)
    }
}

/// The task that fires this thread's deadlines as they come due, while any are armed.
async fn sweep() {
    loop {
        tokio::time::sleep(TICK).await;
        let (wake, done) = LIST.with(|list| list.borrow_mut().due(Instant::now()));
        for w in wake {
            w.wake();
        }
        if done {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::counted::counted as waker;

    /// An entry fires at the first sweep at or after its moment, once; a disarmed one never
    /// does, and its room is used again.
    #[test]
    fn entries_fire_when_due_and_not_after_being_disarmed() {
        let t0 = Instant::now();
        let (count, w) = waker();
        let mut list = List::new();
        let early = list.arm(t0 + Duration::from_secs(1), &w);
        let late = list.arm(t0 + Duration::from_secs(3), &w);
        let gone = list.arm(t0 + Duration::from_secs(1), &w);
        list.disarm(gone);
        assert_eq!(list.armed, 2);

        let (wake, done) = list.due(t0 + Duration::from_millis(999));
        assert!(wake.is_empty() && !done, "nothing due yet");
        assert!(list.poll(early, &w).is_pending());

        let (wake, done) = list.due(t0 + Duration::from_secs(1));
        assert_eq!(wake.len(), 1, "only the first is due");
        assert!(!done, "the second is still armed");
        wake.into_iter().for_each(Waker::wake);
        assert_eq!(count.wakes(), 1);
        assert!(list.poll(early, &w).is_ready());
        assert!(list.poll(late, &w).is_pending());

        let (wake, _) = list.due(t0 + Duration::from_secs(2));
        assert!(wake.is_empty(), "a fired entry does not fire again");

        let again = list.arm(t0 + Duration::from_secs(9), &w);
        assert_eq!(again, gone, "a free entry is used again");
        list.disarm(again);
        let (wake, done) = list.due(t0 + Duration::from_secs(3));
        assert_eq!(wake.len(), 1);
        assert!(done, "nothing is left armed");
        assert!(!list.swept);
    }

    /// The latest waker is the one woken.
    #[test]
    fn the_latest_waker_is_woken() {
        let t0 = Instant::now();
        let (first, w1) = waker();
        let (second, w2) = waker();
        let mut list = List::new();
        let i = list.arm(t0, &w1);
        assert!(list.poll(i, &w2).is_pending());
        let (wake, _) = list.due(t0);
        wake.into_iter().for_each(Waker::wake);
        assert_eq!(first.wakes(), 0);
        assert_eq!(second.wakes(), 1);
    }

    /// Once every entry is gone, the list gives back its room.
    #[test]
    fn an_empty_list_gives_back_its_room() {
        let t0 = Instant::now();
        let (_, w) = waker();
        let mut list = List::new();
        let ids: Vec<usize> = (0..100).map(|_| list.arm(t0, &w)).collect();
        ids.into_iter().for_each(|i| list.disarm(i));
        let (_, done) = list.due(t0);
        assert!(done);
        assert_eq!(list.entries.capacity(), 0);
        assert_eq!(list.free.capacity(), 0);
    }

    /// On a serving thread, a timeout of at least [`COARSE_FROM`] is kept in the thread's
    /// list and fires (a tick late at most); one whose future ends first gives its entry back.
    #[tokio::test]
    async fn a_coarse_timeout_fires_on_a_serving_thread() {
        let cores = cores::started().expect("serving threads");
        let placed = cores.place();
        let (tx, rx) = tokio::sync::oneshot::channel();
        placed.handle().spawn(async move {
            let ended = timeout(Duration::from_secs(5), async { 7 }).await;
            let coarse = matches!(
                &Deadline::after(COARSE_FROM).0,
                Kind::Coarse { index: None, .. }
            );
            let short = matches!(&Deadline::after(TICK).0, Kind::Exact(_));
            let start = Instant::now();
            let fired = timeout(COARSE_FROM, std::future::pending::<()>()).await;
            let took = start.elapsed();
            let left = LIST.with(|l| l.borrow().armed);
            let _ = tx.send((ended, coarse, short, fired, took, left));
        });
        let (ended, coarse, short, fired, took, left) =
            tokio::time::timeout(Duration::from_secs(30), rx)
                .await
                .expect("the coarse deadline fired")
                .expect("the task ran");
        assert_eq!(ended, Ok(7));
        assert!(coarse, "kept in the thread's list");
        assert!(short, "a short one is tokio's");
        assert_eq!(fired, Err(Elapsed));
        assert!(took >= COARSE_FROM, "not before its moment: {took:?}");
        assert_eq!(left, 0, "nothing left armed");
    }

    /// Off the serving threads every deadline is tokio's, and paused time moves it.
    #[tokio::test(start_paused = true)]
    async fn off_the_serving_threads_a_timeout_is_tokios() {
        assert!(matches!(
            &Deadline::after(Duration::from_secs(60)).0,
            Kind::Exact(_)
        ));
        let r = timeout(Duration::from_secs(60), std::future::pending::<()>()).await;
        assert_eq!(r, Err(Elapsed));
        assert_eq!(timeout(Duration::from_secs(60), async { 1 }).await, Ok(1));
    }
}
