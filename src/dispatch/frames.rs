//! A request's frames, run where they are read: the request's future is polled by whoever
//! reads its frames (the client's connection), so the connection and the request are one
//! task and a frame passes between them without waking another. If the reader goes before
//! the request has ended (the client left, or stalled and was closed), the rest of the
//! request moves to a task of its own: it sees its client gone, as it would have on a
//! separate task all along, and its record is kept.
//!
//! The frames pass through a [`channel`] of one sender and one receiver, bounded, made for
//! this: both ends are nearly always polled by one task, so a frame is a push and a pop under
//! a lock no one else is waiting on, and a waker is kept only by an end that has to wait.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use super::Frame;

/// A bounded channel of frames from a request (`Sender`) to its reader (`Receiver`).
pub(super) fn channel(capacity: usize) -> (Sender, Receiver) {
    let chan = Arc::new(Chan(Mutex::new(State {
        // A request's frames are most often taken as they come: a few at a time.
        queue: VecDeque::with_capacity(capacity.clamp(1, 4)),
        capacity: capacity.max(1),
        receiver_closed: false,
        sender_gone: false,
        receiver_waiting: None,
        sender_waiting: None,
    })));
    (Sender(Arc::clone(&chan)), Receiver(chan))
}

struct Chan(Mutex<State>);

impl Chan {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing done under the lock can panic half-way through a change of the state.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct State {
    queue: VecDeque<Frame>,
    capacity: usize,
    /// The receiver closed or went: nothing more is taken.
    receiver_closed: bool,
    /// The sender went: once the queue is empty, there is nothing more.
    sender_gone: bool,
    /// The receiver's waker, while it waits for a frame.
    receiver_waiting: Option<Waker>,
    /// The sender's waker, while it waits for room.
    sender_waiting: Option<Waker>,
}

/// Wakes the end that was waiting, if one was (called with the lock released).
fn wake(waiting: Option<Waker>) {
    if let Some(w) = waiting {
        w.wake();
    }
}

/// Why a frame was not sent; the frame comes back with it.
#[derive(Debug)]
pub(crate) enum TrySendError {
    /// The receiver is gone or closed.
    Closed(Frame),
    /// No room now.
    Full(Frame),
}

/// Why no frame was taken.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TryRecvError {
    /// None now.
    Empty,
    /// None ever again: the sender is gone and every frame it sent was taken.
    Disconnected,
}

/// The request's end of the channel.
pub struct Sender(Arc<Chan>);

impl Sender {
    /// Sends `frame` if there is room now.
    pub(crate) fn try_send(&self, frame: Frame) -> Result<(), TrySendError> {
        self.offer(frame, None)
    }

    /// Sends `frame`, waiting for room; gives it back if the receiver closes or goes first.
    pub(crate) async fn send(&self, frame: Frame) -> Result<(), Frame> {
        let mut frame = Some(frame);
        std::future::poll_fn(|cx| {
            let Some(f) = frame.take() else {
                return Poll::Ready(Ok(()));
            };
            match self.offer(f, Some(cx.waker())) {
                Ok(()) => Poll::Ready(Ok(())),
                Err(TrySendError::Closed(f)) => Poll::Ready(Err(f)),
                Err(TrySendError::Full(f)) => {
                    frame = Some(f);
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Queues `frame` if the receiver is there and there is room; when there is none and
    /// `waiting` is given, that waker is woken once the receiver takes a frame or closes.
    fn offer(&self, frame: Frame, waiting: Option<&Waker>) -> Result<(), TrySendError> {
        let mut st = self.0.lock();
        if st.receiver_closed {
            return Err(TrySendError::Closed(frame));
        }
        if st.queue.len() >= st.capacity {
            if let Some(w) = waiting {
                st.sender_waiting = Some(w.clone());
            }
            return Err(TrySendError::Full(frame));
        }
        st.queue.push_back(frame);
        let receiver = st.receiver_waiting.take();
        drop(st);
        wake(receiver);
        Ok(())
    }

    /// Whether the receiver closed or went.
    pub(crate) fn is_closed(&self) -> bool {
        self.0.lock().receiver_closed
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.sender_gone = true;
        let receiver = st.receiver_waiting.take();
        drop(st);
        wake(receiver);
    }
}

/// The reader's end of the channel.
pub struct Receiver(Arc<Chan>);

impl Receiver {
    /// A frame sent, if there is one now.
    pub(crate) fn try_recv(&mut self) -> Result<Frame, TryRecvError> {
        self.take(None)
    }

    /// The next frame, or `None` once no more can come (the sender is gone, or this end
    /// closed) and every frame sent is taken.
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Frame>> {
        match self.take(Some(cx.waker())) {
            Ok(frame) => Poll::Ready(Some(frame)),
            Err(TryRecvError::Disconnected) => Poll::Ready(None),
            Err(TryRecvError::Empty) => Poll::Pending,
        }
    }

    /// Takes the next frame and wakes a sender waiting for room; when there is none and
    /// more may come, `waiting` (if given) is woken when one does or the sender goes.
    fn take(&mut self, waiting: Option<&Waker>) -> Result<Frame, TryRecvError> {
        let mut st = self.0.lock();
        let Some(frame) = st.queue.pop_front() else {
            if st.sender_gone || st.receiver_closed {
                return Err(TryRecvError::Disconnected);
            }
            if let Some(w) = waiting {
                st.receiver_waiting = Some(w.clone());
            }
            return Err(TryRecvError::Empty);
        };
        let sender = st.sender_waiting.take();
        drop(st);
        wake(sender);
        Ok(frame)
    }

    /// Refuses further frames (those already sent can still be taken) and tells a sender
    /// waiting for room.
    pub(crate) fn close(&mut self) {
        let mut st = self.0.lock();
        st.receiver_closed = true;
        let sender = st.sender_waiting.take();
        drop(st);
        wake(sender);
    }
}

impl Drop for Receiver {
    /// The frames not taken are dropped here, outside the lock.
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.receiver_closed = true;
        let frames = std::mem::take(&mut st.queue);
        let sender = st.sender_waiting.take();
        drop(st);
        drop(frames);
        wake(sender);
    }
}

/// A running request as its reader holds it.
type Run = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The frames of one request, with the request itself until it ends.
pub struct Frames {
    rx: Receiver,
    /// The request, until it has ended (then only what it left in the channel is read).
    run: Option<Run>,
}

impl Frames {
    /// The frames `run` sends on the channel `rx` receives from; `run` is driven by reading.
    pub(super) fn new(rx: Receiver, run: Run) -> Self {
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
    use crate::base::counted::counted;
    use tokio::sync::oneshot;

    fn poll_once<F: Future>(f: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(waker))
    }

    /// A full channel refuses a try and makes a send wait; taking a frame wakes the sender,
    /// whose frame then goes in; a receiver waiting for a frame is woken by the send.
    #[test]
    fn a_full_channel_makes_the_sender_wait_until_a_frame_is_taken() {
        let (tx, mut rx) = channel(1);
        let (rx_count, rx_waker) = counted();
        assert!(
            rx.poll_recv(&mut Context::from_waker(&rx_waker))
                .is_pending()
        );
        tx.try_send(Frame::KeepAlive).unwrap();
        assert_eq!(
            rx_count.wakes(),
            1,
            "the waiting receiver is woken by the frame"
        );
        assert!(matches!(
            tx.try_send(Frame::KeepAlive),
            Err(TrySendError::Full(_))
        ));

        let (tx_count, tx_waker) = counted();
        let mut send = std::pin::pin!(tx.send(Frame::KeepAlive));
        assert!(poll_once(send.as_mut(), &tx_waker).is_pending());
        assert_eq!(tx_count.wakes(), 0);
        assert!(matches!(rx.try_recv(), Ok(Frame::KeepAlive)));
        assert_eq!(
            tx_count.wakes(),
            1,
            "taking a frame wakes the waiting sender"
        );
        assert!(matches!(
            poll_once(send.as_mut(), &tx_waker),
            Poll::Ready(Ok(()))
        ));
        assert!(matches!(rx.try_recv(), Ok(Frame::KeepAlive)));
        assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    }

    /// Closing the receiver gives a waiting sender its frame back and refuses the next; the
    /// frames sent before can still be taken, then there are none ever again.
    #[test]
    fn a_closed_receiver_refuses_frames_and_keeps_those_sent_before() {
        let (tx, mut rx) = channel(1);
        tx.try_send(Frame::KeepAlive).unwrap();
        let (tx_count, tx_waker) = counted();
        let mut send = std::pin::pin!(tx.send(Frame::Body(bytes::Bytes::from_static(b"x"))));
        assert!(poll_once(send.as_mut(), &tx_waker).is_pending());
        assert!(!tx.is_closed());
        rx.close();
        assert!(tx.is_closed());
        assert_eq!(tx_count.wakes(), 1, "closing wakes the waiting sender");
        assert!(matches!(
            poll_once(send.as_mut(), &tx_waker),
            Poll::Ready(Err(Frame::Body(_)))
        ));
        assert!(matches!(
            tx.try_send(Frame::KeepAlive),
            Err(TrySendError::Closed(_))
        ));
        assert!(matches!(rx.try_recv(), Ok(Frame::KeepAlive)));
        assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Disconnected);
    }

    /// The sender's going wakes a waiting receiver, which takes what was sent and then reads
    /// the end; the receiver's going closes the channel for the sender.
    #[test]
    fn either_end_going_is_seen_by_the_other() {
        let (tx, mut rx) = channel(4);
        let (rx_count, rx_waker) = counted();
        tx.try_send(Frame::KeepAlive).unwrap();
        let mut cx = Context::from_waker(&rx_waker);
        assert!(matches!(rx.poll_recv(&mut cx), Poll::Ready(Some(_))));
        assert!(rx.poll_recv(&mut cx).is_pending());
        tx.try_send(Frame::KeepAlive).unwrap();
        drop(tx);
        assert_eq!(rx_count.wakes(), 1, "woken once, by the frame");
        assert!(matches!(rx.poll_recv(&mut cx), Poll::Ready(Some(_))));
        assert!(matches!(rx.poll_recv(&mut cx), Poll::Ready(None)));

        let (tx, rx) = channel(1);
        tx.try_send(Frame::KeepAlive).unwrap();
        let (tx_count, tx_waker) = counted();
        let mut send = std::pin::pin!(tx.send(Frame::KeepAlive));
        assert!(poll_once(send.as_mut(), &tx_waker).is_pending());
        drop(rx);
        assert_eq!(tx_count.wakes(), 1);
        assert!(tx.is_closed());
        assert!(matches!(
            poll_once(send.as_mut(), &tx_waker),
            Poll::Ready(Err(_))
        ));
    }

    /// A request whose reader has read one frame and left: the request is still waiting (on
    /// its upstream), goes on by itself once that answers, and finds its reader gone.
    #[tokio::test]
    async fn a_request_whose_reader_leaves_runs_on_to_its_end() {
        let (tx, rx) = channel(1);
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
        let (tx, rx) = channel(1);
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
        let (tx, rx) = channel(4);
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
