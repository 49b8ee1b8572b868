//! The events of one answer, whichever transport carries it: an SSE body split as it arrives,
//! or the frames of a turn on an upstream WebSocket. The dispatcher reads events already
//! received without waiting ([`EventStream::buffered`]) and waits only when none is left
//! ([`EventStream::next`]), so the events of one read are forwarded together.

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;

use super::event::Event;
use super::sse::{Piece, SseSplitter};
use super::ws::WsTurn;

/// What the stream gives next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Event(Event),
    /// The upstream's keep-alive comment.
    KeepAlive,
    /// Whole plain blocks were moved, as they came, into the buffer given to
    /// [`EventStream::next_or_run`].
    Moved,
}

/// Why a stream ended early, for the operator.
pub type StreamError = String;

pub struct EventStream(Source);

enum Source {
    Sse {
        body: BoxStream<'static, Result<Bytes, StreamError>>,
        split: SseSplitter,
        /// The body ended cleanly; what is buffered is all there is.
        ended: bool,
    },
    Ws(Box<WsTurn>),
}

impl EventStream {
    /// The SSE body of an HTTP answer; events larger than `max_event` end it with an error.
    pub fn sse(resp: impl super::ReadBody, max_event: usize) -> EventStream {
        let body = resp.chunks().boxed();
        EventStream(Source::Sse {
            body,
            split: SseSplitter::new(max_event),
            ended: false,
        })
    }

    /// The same from any byte stream (tests and benches).
    pub fn from_bytes(
        body: BoxStream<'static, Result<Bytes, StreamError>>,
        max_event: usize,
    ) -> EventStream {
        EventStream(Source::Sse {
            body,
            split: SseSplitter::new(max_event),
            ended: false,
        })
    }

    pub fn ws(turn: WsTurn) -> EventStream {
        EventStream(Source::Ws(Box::new(turn)))
    }

    /// Moves the whole plain SSE blocks already received into `out` as they came, up to the
    /// first one that needs a look of its own ([`SseSplitter::take_plain_run`]); a WebSocket
    /// turn has none. Returns how many were moved.
    pub fn take_plain_run(&mut self, out: &mut BytesMut) -> usize {
        match &mut self.0 {
            Source::Sse { split, .. } => split.take_plain_run(out),
            Source::Ws(_) => 0,
        }
    }

    /// Bytes received and not yet taken (of an SSE body).
    pub fn pending(&self) -> usize {
        match &self.0 {
            Source::Sse { split, .. } => split.pending(),
            Source::Ws(_) => 0,
        }
    }

    /// An event already received, without waiting.
    pub fn buffered(&mut self) -> Option<Result<Item, StreamError>> {
        match &mut self.0 {
            Source::Sse { split, .. } => match split.next_piece() {
                Ok(Some(p)) => Some(Ok(item(p))),
                Ok(None) => None,
                Err(e) => Some(Err(e.to_string())),
            },
            Source::Ws(_) => None,
        }
    }

    /// The next event, waiting for the network when none is buffered. `None` is the end of the
    /// stream (which, before a terminal event, is a failure for the caller to judge).
    pub async fn next(&mut self) -> Option<Result<Item, StreamError>> {
        self.next_or_run(None).await
    }

    /// The same, except that while `run` is given, the whole plain blocks at the front of what
    /// was received are moved into it as they came ([`SseSplitter::take_plain_run`]) and
    /// [`Item::Moved`] says so.
    pub async fn next_or_run(
        &mut self,
        mut run: Option<&mut BytesMut>,
    ) -> Option<Result<Item, StreamError>> {
        match &mut self.0 {
            Source::Sse { body, split, ended } => loop {
                if let Some(out) = run.as_deref_mut()
                    && split.take_plain_run(out) > 0
                {
                    return Some(Ok(Item::Moved));
                }
                match split.next_piece() {
                    Ok(Some(p)) => return Some(Ok(item(p))),
                    Ok(None) if *ended => return None,
                    Ok(None) => {}
                    Err(e) => return Some(Err(e.to_string())),
                }
                match body.next().await {
                    Some(Ok(chunk)) => split.push_bytes(chunk),
                    Some(Err(e)) => return Some(Err(e)),
                    None => *ended = true,
                }
            },
            Source::Ws(turn) => turn.next().await,
        }
    }
}

fn item(p: Piece) -> Item {
    match p {
        Piece::Event(e) => Item::Event(e),
        Piece::Comment => Item::KeepAlive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_of_one_read_are_buffered_and_a_clean_end_is_none() {
        let chunks: Vec<Result<Bytes, StreamError>> = vec![
            Ok(Bytes::from_static(
                b"data: {\"type\":\"a\"}\n\ndata: {\"type\":\"b\"}\n\n: ping\n\ndata: {\"ty",
            )),
            Ok(Bytes::from_static(b"pe\":\"c\"}\n\n")),
        ];
        let mut s = EventStream::from_bytes(futures_util::stream::iter(chunks).boxed(), 1024);
        assert!(s.buffered().is_none(), "nothing read yet");
        let kind = |i: Option<Result<Item, StreamError>>| match i {
            Some(Ok(Item::Event(e))) => e.kind().to_string(),
            Some(Ok(Item::KeepAlive)) => ":".into(),
            other => panic!("{other:?}"),
        };
        assert_eq!(kind(s.next().await), "a");
        assert_eq!(kind(s.buffered()), "b");
        assert_eq!(kind(s.buffered()), ":");
        assert!(s.buffered().is_none(), "the third event is not whole yet");
        assert_eq!(kind(s.next().await), "c");
        assert!(s.next().await.is_none());
    }

    #[tokio::test]
    async fn a_transport_error_ends_the_stream_with_its_description() {
        let chunks: Vec<Result<Bytes, StreamError>> = vec![
            Ok(Bytes::from_static(b"data: {\"type\":\"a\"}\n\n")),
            Err("connection reset".into()),
        ];
        let mut s = EventStream::from_bytes(futures_util::stream::iter(chunks).boxed(), 1024);
        assert!(matches!(s.next().await, Some(Ok(Item::Event(_)))));
        assert_eq!(s.next().await, Some(Err("connection reset".into())));
    }
}
