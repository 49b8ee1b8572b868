//! The request path's connections to the backend, on hyper's own HTTP/1.1 and HTTP/2
//! connections: one pool per way out (straight, or a proxy's tunnels) and serving thread, so a
//! pool is only ever touched by its own thread and its lock is never contended.
//!
//! A connection stays in its pool from its first request to its end. An HTTP/1.1 connection
//! takes a request when hyper says it is idle (`is_ready`: its last answer has been read to the
//! end); the request is handed to it under the pool's lock, so two requests never take the same
//! one. An HTTP/2 connection takes any number. A request that finds none opens one through the
//! connector (TLS decides between the two by ALPN). Nothing has to give a connection back when
//! its answer ends, and nothing is spawned per request: a look at the pool finds it idle again.
//! A connection idle for the idle timeout since it was last seen in use is let go at the next
//! look (its peer may have forgotten it); one that closed is dropped at the next look. A request a reused
//! connection could not take (it closed before the request was written) goes on another, as
//! the same request: it never reached the backend.

use std::sync::Mutex;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::client::conn::{TrySendError, http1, http2};
use hyper::header::HOST;
use hyper::http::uri::{Authority, PathAndQuery};
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::connect::Connection as _;
use hyper_util::rt::TokioExecutor;
use std::time::Instant;
use tower_service::Service as _;

use super::egress::{EgressError, TunnelConnector};

type Body = reqwest::Body;

/// How often a request may find a reused connection closed under it before it asks for a new
/// one (each such connection is dropped from the pool as it is found).
const STALE_TRIES: usize = 4;

/// The connections of one way out on one thread.
pub struct Pool {
    connector: TunnelConnector,
    idle_timeout: Duration,
    conns: Mutex<Vec<Conn>>,
    /// Speaks HTTP/2 on plain connections too (a test's backend without TLS).
    #[cfg(test)]
    h2_prior_knowledge: bool,
}

struct Conn {
    https: bool,
    authority: Authority,
    sender: Sender,
    /// When it was last known to be in use: given a request, or found busy by a look.
    active: Instant,
}

enum Sender {
    H1(http1::SendRequest<Body>),
    H2(http2::SendRequest<Body>),
}

/// Why a request got no answer head.
#[derive(Debug, thiserror::Error)]
pub enum Failed {
    /// No connection: the connector's failure (a proxy's own words first).
    #[error("{0}")]
    Connect(EgressError),
    /// The connection opened, but HTTP on it did not start.
    #[error("connection handshake: {0}")]
    Handshake(#[source] hyper::Error),
    /// The request was sent, or could not be, and no answer head came.
    #[error(transparent)]
    Send(hyper::Error),
}

type Sent = std::pin::Pin<
    Box<dyn Future<Output = Result<Response<Incoming>, TrySendError<Request<Body>>>> + Send>,
>;

impl Pool {
    pub fn new(connector: TunnelConnector, idle_timeout: Duration) -> Pool {
        Pool {
            connector,
            idle_timeout,
            conns: Mutex::new(Vec::new()),
            #[cfg(test)]
            h2_prior_knowledge: false,
        }
    }

    /// Sends `req` (an absolute URI) on a connection of this pool, opening one if none is
    /// free, and returns the answer once its head has come.
    pub async fn request(&self, mut req: Request<Body>) -> Result<Response<Incoming>, Failed> {
        let https = req.uri().scheme_str() == Some("https");
        let Some(authority) = req.uri().authority().cloned() else {
            return Err(Failed::Connect(EgressError::Target(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the request's URL names no host",
            ))));
        };
        for _ in 0..STALE_TRIES {
            let Some(sent) = self.send_on_idle(https, &authority, &mut req) else {
                break;
            };
            match sent.await {
                Ok(resp) => return Ok(resp),
                // Closed before it took the request: the request goes on elsewhere.
                Err(mut e) => match e.take_message() {
                    Some(back) => req = back,
                    None => return Err(Failed::Send(e.into_error())),
                },
            }
        }
        // Boxed: opening a connection is rare, and its future (the connector's, both
        // handshakes) would make every request's larger.
        Box::pin(self.send_on_new(https, authority, req)).await
    }

    /// Hands `req` to an idle connection to `authority`, if there is one: a future of its
    /// answer (the request is with the connection once this returns `Some`).
    fn send_on_idle(
        &self,
        https: bool,
        authority: &Authority,
        req: &mut Request<Body>,
    ) -> Option<Sent> {
        let now = Instant::now();
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let mut i = 0;
        while i < conns.len() {
            let c = &mut conns[i];
            let (ready, closed) = match &c.sender {
                Sender::H1(s) => (s.is_ready(), s.is_closed()),
                Sender::H2(s) => (s.is_ready(), s.is_closed()),
            };
            if closed {
                conns.swap_remove(i);
                continue;
            }
            if !ready {
                c.active = now;
                i += 1;
                continue;
            }
            if now.duration_since(c.active) >= self.idle_timeout {
                // Dropping its only sender lets the connection close.
                conns.swap_remove(i);
                continue;
            }
            if c.https != https || c.authority != *authority {
                i += 1;
                continue;
            }
            c.active = now;
            let taken = std::mem::replace(req, Request::new(Body::from(bytes::Bytes::new())));
            return Some(send(&mut c.sender, taken));
        }
        None
    }

    /// Opens a connection for `req`, sends it there, and keeps the connection for the next.
    async fn send_on_new(
        &self,
        https: bool,
        authority: Authority,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, Failed> {
        let io = self
            .connector
            .clone()
            .call(req.uri().clone())
            .await
            .map_err(Failed::Connect)?;
        let h2 = io.connected().is_negotiated_h2();
        #[cfg(test)]
        let h2 = h2 || self.h2_prior_knowledge;
        let mut sender = if h2 {
            let (mut tx, conn) = http2::Builder::new(TokioExecutor::new())
                .handshake(io)
                .await
                .map_err(Failed::Handshake)?;
            drive(conn);
            tx.ready().await.map_err(Failed::Handshake)?;
            Sender::H2(tx)
        } else {
            let (mut tx, conn) = http1::Builder::new()
                .handshake(io)
                .await
                .map_err(Failed::Handshake)?;
            drive(conn);
            tx.ready().await.map_err(Failed::Handshake)?;
            Sender::H1(tx)
        };
        let sent = send(&mut sender, req);
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Conn {
                https,
                authority,
                sender,
                active: Instant::now(),
            });
        sent.await.map_err(|e| Failed::Send(e.into_error()))
    }

    /// The connections it holds (open or not yet found closed).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Runs a connection on a task of its own, to its end.
fn drive(conn: impl Future<Output = Result<(), hyper::Error>> + Send + 'static) {
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream connection ended");
        }
    });
}

/// Hands `req` to the connection: HTTP/1.1 takes the path alone and needs a `Host` (added
/// unless the request has one), HTTP/2 takes the whole URI.
fn send(sender: &mut Sender, mut req: Request<Body>) -> Sent {
    match sender {
        Sender::H1(s) => {
            if !req.headers().contains_key(HOST)
                && let Some(host) = super::host_value(req.uri())
            {
                req.headers_mut().insert(HOST, host);
            }
            let path = req
                .uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/"));
            *req.uri_mut() = Uri::from(path);
            Box::pin(s.try_send_request(req))
        }
        Sender::H2(s) => Box::pin(s.try_send_request(req)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    /// A backend on loopback that answers each request on a connection with `{}`; with
    /// `close_after`, closes the connection after its first answer (and says so); with `gate`,
    /// ends each answer only with a permit of it. Counts the connections it accepted.
    async fn backend(
        close_after: bool,
        gate: Option<Arc<tokio::sync::Semaphore>>,
    ) -> (String, Arc<AtomicUsize>, mpsc::Receiver<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let (closed_tx, closed) = mpsc::channel(8);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let closed_tx = closed_tx.clone();
                let gate = gate.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let mut head = Vec::new();
                    loop {
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match conn.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        head.clear();
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{";
                        if conn.write_all(answer).await.is_err() {
                            return;
                        }
                        if let Some(gate) = &gate {
                            gate.acquire().await.unwrap().forget();
                        }
                        if conn.write_all(b"}").await.is_err() {
                            return;
                        }
                        if close_after {
                            drop(conn);
                            let _ = closed_tx.send(()).await;
                            return;
                        }
                    }
                });
            }
        });
        (format!("http://{addr}/responses"), accepted, closed)
    }

    fn pool(idle_timeout: Duration) -> Pool {
        Pool::new(
            TunnelConnector::direct(Duration::from_secs(5)),
            idle_timeout,
        )
    }

    fn post(url: &str) -> Request<Body> {
        let mut req = Request::new(Body::from(bytes::Bytes::new()));
        *req.method_mut() = hyper::Method::POST;
        *req.uri_mut() = url.parse().unwrap();
        req
    }

    /// One request to its answer's end.
    async fn exchange(pool: &Pool, url: &str) -> Vec<u8> {
        let resp = pool.request(post(url)).await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    #[tokio::test]
    async fn requests_one_after_another_share_one_connection() {
        let (url, accepted, _) = backend(false, None).await;
        let pool = pool(Duration::from_secs(90));
        for _ in 0..3 {
            assert_eq!(exchange(&pool, &url).await, b"{}");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.held(), 1);
    }

    #[tokio::test]
    async fn requests_at_once_take_a_connection_each_and_both_are_used_again() {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (url, accepted, _) = backend(false, Some(Arc::clone(&gate))).await;
        let pool = pool(Duration::from_secs(90));
        // The first answer has not ended: its connection is busy when the second asks.
        let first = pool.request(post(&url)).await.unwrap();
        let second = pool.request(post(&url)).await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        gate.add_permits(1_000);
        for resp in [first, second] {
            assert_eq!(
                &resp.into_body().collect().await.unwrap().to_bytes()[..],
                b"{}"
            );
        }
        let (a, b) = tokio::join!(exchange(&pool, &url), exchange(&pool, &url));
        assert_eq!((a.as_slice(), b.as_slice()), (&b"{}"[..], &b"{}"[..]));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(pool.held(), 2);
    }

    /// A request whose answer is dropped half read (its client left mid-stream): its
    /// connection cannot carry another answer, and the next request is not sent on it.
    #[tokio::test]
    async fn an_answer_dropped_half_read_leaves_its_connection_unused() {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (url, accepted, _) = backend(false, Some(Arc::clone(&gate))).await;
        let pool = pool(Duration::from_secs(90));
        let mut body = pool.request(post(&url)).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"{");
        drop(body);
        gate.add_permits(1_000);
        assert_eq!(exchange(&pool, &url).await, b"{}");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_its_backend_closed_is_not_used_again() {
        let (url, accepted, mut closed) = backend(true, None).await;
        let pool = pool(Duration::from_secs(90));
        assert_eq!(exchange(&pool, &url).await, b"{}");
        closed.recv().await.unwrap();
        assert_eq!(exchange(&pool, &url).await, b"{}");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_idle_past_the_idle_timeout_is_let_go() {
        let (url, accepted, _) = backend(false, None).await;
        let pool = pool(Duration::ZERO);
        assert_eq!(exchange(&pool, &url).await, b"{}");
        assert_eq!(exchange(&pool, &url).await, b"{}");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(pool.held(), 1, "the idle one was dropped");
    }

    /// An HTTP/2 backend on loopback (no TLS): answers `{path} {authority}` to each request,
    /// counting the connections it accepted.
    async fn h2_backend() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let text = format!(
                        "{} {}",
                        req.uri().path(),
                        req.uri().authority().map_or("", |a| a.as_str())
                    );
                    Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                        bytes::Bytes::from(text),
                    )))
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(conn), service),
                );
            }
        });
        (format!("http://{addr}/responses"), accepted)
    }

    #[tokio::test]
    async fn http2_takes_requests_at_once_and_one_after_another_on_one_connection() {
        let (url, accepted) = h2_backend().await;
        let mut pool = pool(Duration::from_secs(90));
        pool.h2_prior_knowledge = true;
        let authority = url
            .trim_start_matches("http://")
            .trim_end_matches("/responses");
        let want = format!("/responses {authority}");
        assert_eq!(exchange(&pool, &url).await, want.as_bytes());
        // Two at once: the first answer is not read when the second is sent.
        let first = pool.request(post(&url)).await.unwrap();
        let second = pool.request(post(&url)).await.unwrap();
        for resp in [first, second] {
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], want.as_bytes());
        }
        assert_eq!(exchange(&pool, &url).await, want.as_bytes());
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.held(), 1);
    }

    #[tokio::test]
    async fn a_connection_refused_is_a_connect_failure_in_the_connector_s_words() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/responses", listener.local_addr().unwrap());
        drop(listener);
        let err = pool(Duration::from_secs(90))
            .request(post(&url))
            .await
            .unwrap_err();
        assert!(matches!(err, Failed::Connect(_)), "{err:?}");
    }
}
