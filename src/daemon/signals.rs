//! The signals a switchyard process acts on, taken in one place: `serve` stops on SIGTERM
//! (gracefully) and SIGINT (fast) and reloads on SIGHUP; the demo also stops on SIGHUP (its
//! terminal went away); a login in progress gives up on any of the three.

use std::future::Future;
use std::task::Poll;

use tokio::signal::unix::{SignalKind, signal};

/// One signal of the three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Terminate,
    Interrupt,
    Hangup,
}

impl Signal {
    fn kind(self) -> SignalKind {
        match self {
            Signal::Terminate => SignalKind::terminate(),
            Signal::Interrupt => SignalKind::interrupt(),
            Signal::Hangup => SignalKind::hangup(),
        }
    }

    /// How a process told to stop by this signal stops: SIGTERM lets work in flight finish;
    /// SIGINT and SIGHUP do not wait.
    pub fn shutdown_kind(self) -> ShutdownKind {
        match self {
            Signal::Terminate => ShutdownKind::Graceful,
            Signal::Interrupt | Signal::Hangup => ShutdownKind::Fast,
        }
    }
}

/// How to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownKind {
    /// Stop accepting, let in-flight work finish within the grace period.
    Graceful,
    /// Stop now.
    Fast,
}

/// What stops `serve` (SIGHUP reloads it instead).
pub const STOP: &[Signal] = &[Signal::Terminate, Signal::Interrupt];

/// The signals listened for.
#[derive(Debug)]
pub struct Signals(Vec<(Signal, tokio::signal::unix::Signal)>);

/// Starts listening for `which`. The handlers are installed by this call, not when the
/// result is first waited on, so a signal that arrives in between is not lost.
pub fn listen(which: &[Signal]) -> std::io::Result<Signals> {
    which
        .iter()
        .map(|s| Ok((*s, signal(s.kind())?)))
        .collect::<std::io::Result<Vec<_>>>()
        .map(Signals)
}

impl Signals {
    /// The next signal of those listened for.
    pub async fn next(&mut self) -> Signal {
        std::future::poll_fn(|cx| {
            for (which, stream) in &mut self.0 {
                if stream.poll_recv(cx).is_ready() {
                    return Poll::Ready(*which);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// Resolves at the first of `which`, with how to stop. Without handlers (they could not be
/// installed, which is said in the log) it never resolves.
pub fn stop_on(which: &[Signal]) -> impl Future<Output = ShutdownKind> + use<> {
    let signals = listen(which);
    async move {
        match signals {
            Ok(mut s) => s.next().await.shutdown_kind(),
            Err(e) => {
                tracing::error!(error = %e, "cannot install signal handlers; stop with SIGKILL");
                std::future::pending().await
            }
        }
    }
}
