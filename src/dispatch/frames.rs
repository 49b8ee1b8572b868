//! A request's frames, run where they are read: the request's future is polled by whoever
//! reads its frames (the client's connection), so the connection and the request are one
//! task and a frame passes between them without waking another. If the reader goes before
//! the request has ended (the client left, or stalled and was closed), the rest of the
//! request moves to a task of its own: it sees its client gone, as it would have on a
//! separate task all along, and its record is kept.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::mpsc::{self, error::TryRecvError};

use super::Frame;

/// A running request as its reader holds it.
type Run = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The frames of one request, with the request itself until it ends.
pub struct Frames {
    rx: mpsc::Receiver<Frame>,
    /// The request, until it has ended (then only what it left in the channel is read).
    run: Option<Run>,
}

impl Frames {
    /// The frames `run` sends on the channel `rx` receives from; `run` is driven by reading.
    pub(super) fn new(rx: mpsc::Receiver<Frame>, run: Run) -> Self {
        Frames { rx, run: Some(run) }
    }

    /// The next frame; `None` once the request has ended and its frames are read. Cancel-safe:
    /// a call dropped before it resolves loses nothing.
    pub async fn recv(&mut self) -> Option<Frame> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Polls for the next frame, running the request as far as it can go first.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Frame>> {
        // A frame already sent is taken without polling the request: it has nothing to do
        // until its frames are read, and the channel need not wake anyone.
        loop {
            match self.rx.try_recv() {
                Ok(frame) => return Poll::Ready(Some(frame)),
                Err(TryRecvError::Disconnected) => return Poll::Ready(None),
                Err(TryRecvError::Empty) => {}
            }
            let Some(run) = self.run.as_mut() else {
                return self.rx.poll_recv(cx);
            };
            if run.as_mut().poll(cx).is_ready() {
                // Ended: what it sent last is in the channel, which is now closed.
                self.run = None;
                continue;
            }
            // Still running: it waits on something that wakes this task (the upstream, a
            // timer, room in the channel), having sent what it could.
            return match self.rx.try_recv() {
                Ok(frame) => Poll::Ready(Some(frame)),
                Err(TryRecvError::Disconnected) => Poll::Ready(None),
                Err(TryRecvError::Empty) => Poll::Pending,
            };
        }
    }
}

impl Drop for Frames {
    /// The reader left first: the request goes on by itself to its end (it finds the channel
    /// closed, ends as its client's leaving, and keeps its record).
    fn drop(&mut self) {
        // Closed first: the request, polled on its new task perhaps before this reader is
        // gone, must find its client gone ([`super::client_left`] waits on nothing else).
        self.rx.close();
        if let Some(run) = self.run.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(run);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    /// A request whose reader has read one frame and left: the request is still waiting (on
    /// its upstream), goes on by itself once that answers, and finds its reader gone.
    #[tokio::test]
    async fn a_request_whose_reader_leaves_runs_on_to_its_end() {
        let (tx, rx) = mpsc::channel(1);
        let (answer, answered) = oneshot::channel::<()>();
        let (ended, end) = oneshot::channel();
        let run = Box::pin(async move {
            tx.send(Frame::KeepAlive).await.unwrap();
            let _ = answered.await;
            let _ = ended.send(tx.send(Frame::KeepAlive).await.is_err());
        });
        let mut frames = Frames::new(rx, run);
        assert!(matches!(frames.recv().await, Some(Frame::KeepAlive)));
        let waiting = std::future::poll_fn(|cx| Poll::Ready(frames.poll_recv(cx))).await;
        assert!(waiting.is_pending(), "the request waits on its upstream");
        drop(frames);
        answer.send(()).unwrap();
        assert!(end.await.unwrap(), "it ran on and found its reader gone");
    }

    /// A request waiting on its upstream finds at once that its reader left, though nothing
    /// was registered to wake it on that: the reader closes the channel before handing the
    /// request to a task of its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_request_finds_its_reader_gone_once_it_leaves() {
        let (tx, rx) = mpsc::channel(1);
        let (ended, end) = oneshot::channel();
        let run = Box::pin(async move {
            tokio::select! {
                () = std::future::pending::<()>() => {}
                () = super::super::client_left(&tx) => {
                    let _ = ended.send(());
                }
            }
        });
        let mut frames = Frames::new(rx, run);
        let waiting = std::future::poll_fn(|cx| Poll::Ready(frames.poll_recv(cx))).await;
        assert!(waiting.is_pending(), "the request waits on its upstream");
        drop(frames);
        tokio::time::timeout(std::time::Duration::from_secs(10), end)
            .await
            .expect("the request never found its reader gone")
            .unwrap();
    }

    /// A request that ends leaves its last frames to be read, then the end.
    #[tokio::test]
    async fn the_frames_a_request_sent_before_its_end_are_read_after_it() {
        let (tx, rx) = mpsc::channel(4);
        let run = Box::pin(async move {
            for _ in 0..3 {
                tx.send(Frame::KeepAlive).await.unwrap();
            }
        });
        let mut frames = Frames::new(rx, run);
        let mut n = 0;
        while let Some(frame) = frames.recv().await {
            assert!(matches!(frame, Frame::KeepAlive));
            n += 1;
        }
        assert_eq!(n, 3);
    }
}
