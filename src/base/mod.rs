//! What every layer uses and that knows nothing of the rest of the crate: the clock, the
//! serving threads and their coarse timeouts, the stable names of enums, URL encoding, globs,
//! durations for people, periodic jobs, JSON objects read as raw members, and one-shot signals.

pub mod clock;
pub mod cores;
pub mod deadline;
pub mod duration;
pub mod glob;
pub mod job;
pub mod json_scan;
pub(crate) mod names;
pub mod raw_json;
pub mod signal;
pub(crate) mod urlcode;

/// A waker that counts its wakes, for tests of what wakes a task.
#[cfg(test)]
pub(crate) mod counted {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    pub struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Count {
        /// How many times it was woken.
        pub fn wakes(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// A counting waker, and its count.
    pub fn counted() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (Arc::clone(&c), Waker::from(c))
    }
}
