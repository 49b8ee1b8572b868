//! The client-facing HTTP server: an accept loop over hyper of our own, so that every
//! connection is bounded and timed.
//!
//! - A new connection must send a whole request head within `header_read_timeout`; a kept-alive
//!   one is closed after `keepalive_idle_timeout` without a request, by the accept loop's sweep
//!   (every quarter of the timeout, within 10 ms and 1 s: none closes early and none lives
//!   past the timeout by more than two sweeps). hyper's own head timer did this with a
//!   timer made, registered and cancelled for every request.
//! - At most `max_connections` are open (lowered to what the open-file limit leaves room for,
//!   `daemon::fds`): beyond, the oldest idle one is closed to make room (else the one reading
//!   a request body the longest), else the new one is refused (with a warning at most every 10 s). A failed `accept` (out of descriptors all
//!   the same) closes the oldest idle one too, and is said at most every 10 s.
//! - A write to a client that makes no progress for `client_write_timeout` fails the
//!   connection and marks it stalled ([`ClientConn::stalled`]), so the request that was
//!   streaming to it ends as `client_stalled` and frees its account slot.
//! - Shutdown stops accepting and winds the connections down: each finishes the requests it
//!   has in flight and answers one more (`/readyz` says 503 meanwhile) with `Connection:
//!   close`; once nothing is in flight anywhere, the idle ones are closed.
//!
//! The admin socket keeps its own server (`axum::serve`): none of this limits it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, HttpBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::Edge;
use crate::base::cores;
use crate::base::names::named;
use crate::base::signal::Signal;

/// The limits of client connections (`[server]`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_read_timeout: Duration,
    pub keepalive_idle_timeout: Duration,
    pub client_write_timeout: Duration,
    pub max_connections: usize,
}

named! {
    /// Why the gateway closed (or refused) a client connection.
    pub enum Closed {
        /// No whole request head within `header_read_timeout`.
        HeadTimeout => "head_timeout",
        /// Kept alive with no request for `keepalive_idle_timeout`.
        IdleTimeout => "idle_timeout",
        /// The oldest idle connection, closed to make room under `max_connections`.
        Evicted => "evicted",
        /// Refused at `max_connections`: every open connection was busy.
        Refused => "refused",
        /// A write to it made no progress for `client_write_timeout`.
        Stalled => "stalled",
    }
}

/// What `/metrics` says of the client connections.
#[derive(Debug, Default)]
pub struct EdgeStats {
    open: AtomicU64,
    closed: [AtomicU64; Closed::ALL.len()],
}

impl EdgeStats {
    fn closed(&self, why: Closed) {
        self.closed[why as usize].fetch_add(1, Ordering::Relaxed);
        tracing::debug!(reason = why.as_str(), "client connection closed");
    }

    /// The connection gauge and the closed-by-reason counters, in the text format.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# HELP switchyard_client_connections Open client connections.\n\
             # TYPE switchyard_client_connections gauge\n\
             switchyard_client_connections {}",
            self.open.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP switchyard_client_connections_closed_total Client connections the gateway closed or refused, by reason.\n\
             # TYPE switchyard_client_connections_closed_total counter"
        );
        for why in Closed::ALL {
            let _ = writeln!(
                out,
                "switchyard_client_connections_closed_total{{reason=\"{}\"}} {}",
                why.as_str(),
                self.closed[*why as usize].load(Ordering::Relaxed)
            );
        }
    }
}

/// One client connection, as its requests see it (a request extension).
#[derive(Debug)]
pub struct ClientConn {
    id: u64,
    /// Requests whose answers are not sent whole yet.
    active: AtomicU32,
    /// A request head has arrived.
    started: AtomicBool,
    /// A write to the client made no progress for the write timeout.
    stalled: Arc<AtomicBool>,
    /// The server holds part of an answer not yet written to the client (its last frame was
    /// handed over, and the connection's writes have not caught up since).
    owed: Arc<AtomicBool>,
    /// Since when it has had no request in flight (ms since the server started).
    /// When it last became idle, on the registry's idle clock (a sequence: no two are equal).
    idle_since: AtomicU64,
    idle_clock: Arc<AtomicU64>,
    /// Since when (on the idle clock, plus one) a request of it has been reading its body;
    /// 0 when none is.
    reading_since: AtomicU64,
    /// Finish what is in flight, keep nothing alive.
    wind_down: Signal,
    /// Close at once, whatever it holds (evicted to make room, or idle too long).
    close: Signal,
    /// Closed by the sweep for being kept alive with no request too long.
    idle_expired: AtomicBool,
    /// Told when a connection has nothing left in flight.
    settled: Arc<tokio::sync::Notify>,
}

impl ClientConn {
    /// The flag a request's dispatcher reads to tell a stalled client from one that left.
    pub fn stall_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stalled)
    }

    fn idle(&self) -> bool {
        self.active.load(Ordering::SeqCst) == 0
    }

    /// Marks a request of this connection reading its body until the guard is dropped: such
    /// a connection is closed to make room before any that is serving a request.
    pub fn reading_body(self: &Arc<Self>) -> ReadingBody {
        let tick = self.idle_clock.fetch_add(1, Ordering::SeqCst) + 1;
        self.reading_since.store(tick, Ordering::SeqCst);
        ReadingBody(Arc::clone(self))
    }
}

/// A request reading its body ([`ClientConn::reading_body`]).
pub struct ReadingBody(Arc<ClientConn>);

impl Drop for ReadingBody {
    fn drop(&mut self) {
        self.0.reading_since.store(0, Ordering::SeqCst);
    }
}

/// Marks a request in flight on its connection until the answer's body is sent whole (or
/// dropped).
struct Active {
    conn: Arc<ClientConn>,
}

impl Active {
    fn new(conn: Arc<ClientConn>) -> Active {
        conn.started.store(true, Ordering::SeqCst);
        conn.active.fetch_add(1, Ordering::SeqCst);
        Active { conn }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let tick = self.conn.idle_clock.fetch_add(1, Ordering::SeqCst);
        self.conn.idle_since.store(tick, Ordering::SeqCst);
        if self.conn.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.conn.settled.notify_waiters();
        }
    }
}

/// An answer's body that keeps its request marked in flight until it is done.
struct Tracked {
    inner: Body,
    active: Option<Active>,
}

impl HttpBody for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        // Done once the last frame is handed over, before it is written: a client that has
        // read the whole answer finds its connection idle, whichever thread serves it.
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_))))
            || (polled.is_ready() && self.inner.is_end_stream())
        {
            // Owed until the connection's writes catch up: marked before the request is out
            // of flight, so whoever finds the connection idle finds it owing.
            if let Some(active) = &self.active {
                active.conn.owed.store(true, Ordering::SeqCst);
            }
            self.active = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Counts events that are logged at most every 10 s.
#[derive(Default)]
struct Throttle(Mutex<(u64, Option<Instant>)>);

impl Throttle {
    /// Counts one; the count since the last time it said so, when it is time to say it.
    fn count(&self) -> Option<u64> {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        t.0 += 1;
        if t.1.is_some_and(|at| at.elapsed() < Duration::from_secs(10)) {
            return None;
        }
        let n = t.0;
        *t = (0, Some(Instant::now()));
        Some(n)
    }
}

/// The open connections.
struct Registry {
    conns: Mutex<HashMap<u64, Arc<ClientConn>>>,
    /// Shutdown has begun: every connection winds down at its next request.
    draining: AtomicBool,
    next: AtomicU64,
    /// Orders the moments connections became idle.
    idle_clock: Arc<AtomicU64>,
    /// Refused connections since the last warning.
    refused: Throttle,
    /// Failed accepts (out of descriptors) since the last warning.
    accept_failures: Throttle,
    settled: Arc<tokio::sync::Notify>,
    stats: Arc<EdgeStats>,
}

impl Registry {
    fn new(stats: Arc<EdgeStats>) -> Registry {
        Registry {
            conns: Mutex::new(HashMap::new()),
            draining: AtomicBool::new(false),
            next: AtomicU64::new(0),
            idle_clock: Arc::new(AtomicU64::new(0)),
            refused: Throttle::default(),
            accept_failures: Throttle::default(),
            settled: Arc::new(tokio::sync::Notify::new()),
            stats,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ClientConn>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes room for one more connection: true when there is (closing the oldest idle one if
    /// needed), false when every connection is busy.
    fn admit(&self, max: usize) -> bool {
        let conns = self.lock();
        if conns.len() < max {
            return true;
        }
        self.evict_oldest_idle(&conns)
    }

    /// Closes one connection to make room, the first there is of, each oldest first: one kept
    /// alive with no request; one reading a request body (a slow body holds its place no
    /// better than an idle socket); one that has not sent its first head yet (a new client's
    /// comes at once, so it goes last). False when every connection is serving a request.
    fn evict_oldest_idle(&self, conns: &HashMap<u64, Arc<ClientConn>>) -> bool {
        let rank = |c: &Arc<ClientConn>| {
            // Still writing the end of an answer: busy, as if it were serving it.
            if c.owed.load(Ordering::SeqCst) {
                return None;
            }
            let reading = c.reading_since.load(Ordering::SeqCst);
            if c.idle() && c.started.load(Ordering::SeqCst) {
                Some((0, c.idle_since.load(Ordering::SeqCst)))
            } else if reading != 0 {
                Some((1, reading))
            } else if c.idle() {
                Some((2, c.idle_since.load(Ordering::SeqCst)))
            } else {
                None
            }
        };
        let oldest_idle = conns
            .values()
            .filter(|c| !c.close.is_set())
            .filter_map(|c| Some((rank(c)?, c)))
            .min_by_key(|(r, _)| *r)
            .map(|(_, c)| c);
        match oldest_idle {
            Some(c) => {
                c.close.set();
                self.stats.closed(Closed::Evicted);
                true
            }
            None => false,
        }
    }

    fn register(&self) -> Arc<ClientConn> {
        let conn = Arc::new(ClientConn {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            active: AtomicU32::new(0),
            started: AtomicBool::new(false),
            stalled: Arc::new(AtomicBool::new(false)),
            owed: Arc::new(AtomicBool::new(false)),
            idle_since: AtomicU64::new(self.idle_clock.fetch_add(1, Ordering::SeqCst)),
            idle_clock: Arc::clone(&self.idle_clock),
            reading_since: AtomicU64::new(0),
            wind_down: Signal::default(),
            close: Signal::default(),
            idle_expired: AtomicBool::new(false),
            settled: Arc::clone(&self.settled),
        });
        self.lock().insert(conn.id, Arc::clone(&conn));
        self.stats.open.fetch_add(1, Ordering::Relaxed);
        conn
    }

    fn remove(&self, id: u64) {
        if self.lock().remove(&id).is_some() {
            self.stats.open.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn refused(&self) {
        self.stats.closed(Closed::Refused);
        if let Some(refused) = self.refused.count() {
            tracing::warn!(
                refused,
                "client connection limit reached and every connection is busy: refusing new ones"
            );
        }
    }

    /// `accept` failed (out of file descriptors, most likely): said at most every 10 s, with
    /// how many failed since. An idle connection is closed to give its descriptor back.
    fn accept_failed(&self, e: &io::Error) {
        if let Some(failures) = self.accept_failures.count() {
            tracing::warn!(
                error = %e,
                failures,
                "cannot accept a connection; closing the oldest idle one"
            );
        }
        self.evict_oldest_idle(&self.lock());
    }

    /// Closes the connections kept alive with no request for `timeout` or longer. `seen` is
    /// the sweep's memory: when it first found each idle connection idle, and since which
    /// request (a connection that served one since is seen anew). A connection is idle once
    /// its last answer is written whole and no body is being read, as hyper's head timer
    /// started once it waited for a next head; a head arriving slowly does not count.
    fn sweep_idle(
        &self,
        seen: &mut HashMap<u64, (u64, tokio::time::Instant)>,
        now: tokio::time::Instant,
        timeout: Duration,
    ) {
        let conns = self.lock();
        seen.retain(|id, _| conns.contains_key(id));
        for (id, c) in conns.iter() {
            let idle = c.idle()
                && c.started.load(Ordering::SeqCst)
                && !c.owed.load(Ordering::SeqCst)
                && c.reading_since.load(Ordering::SeqCst) == 0;
            if !idle {
                seen.remove(id);
                continue;
            }
            let since = c.idle_since.load(Ordering::SeqCst);
            match seen.get(id) {
                Some(&(s, at)) if s == since => {
                    if now.saturating_duration_since(at) >= timeout {
                        c.idle_expired.store(true, Ordering::SeqCst);
                        c.close.set();
                    }
                }
                _ => {
                    seen.insert(*id, (since, now));
                }
            }
        }
    }

    /// Shutdown: connections with requests in flight finish them and close; idle ones do so
    /// after their next request.
    fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
        for c in self.lock().values() {
            if !c.idle() {
                c.wind_down.set();
            }
        }
    }

    /// Resolves once no connection has a request in flight.
    async fn quiet(&self) {
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.lock().values().all(|c| c.idle()) {
                return;
            }
            settled.await;
        }
    }

    /// The end of shutdown: every connection closes once what it holds of an answer is out
    /// (at once when it holds nothing; a client that stopped reading is cut by the write
    /// timeout, and the daemon's drain bounds the rest).
    fn close_all(&self) {
        for c in self.lock().values() {
            c.wind_down.set();
        }
    }
}

/// Serves `app` on `listener` until `stop` is cancelled, then drains: the requests in flight
/// finish (their connections still answer new requests meanwhile), then every connection is
/// closed once what it holds of an answer is written. Aborting the returned future's task
/// cuts every connection.
pub async fn serve(
    listener: TcpListener,
    app: Edge,
    limits: Limits,
    stats: Arc<EdgeStats>,
    stop: CancellationToken,
) {
    let registry = Arc::new(Registry::new(stats));
    let mut tasks = JoinSet::new();
    let idle_timeout = limits.keepalive_idle_timeout;
    // A quarter of the timeout, within 10 ms and a second (a timeout of zero closes a
    // connection within two sweeps of its answer, without a sweep every millisecond).
    let mut sweep = tokio::time::interval(
        (idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)),
    );
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = HashMap::new();
    loop {
        let tcp = tokio::select! {
            _ = stop.cancelled() => break,
            _ = sweep.tick() => {
                registry.sweep_idle(&mut seen, tokio::time::Instant::now(), idle_timeout);
                continue;
            }
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors and the like: say so, and keep serving.
                    registry.accept_failed(&e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        while tasks.try_join_next().is_some() {}
        if !registry.admit(limits.max_connections) {
            registry.refused();
            drop(tcp);
            continue;
        }
        // Events are small writes: without TCP_NODELAY, delayed ACKs add ~40 ms per turn.
        let _ = tcp.set_nodelay(true);
        let conn = registry.register();
        let Some(cores) = cores::started() else {
            tasks.spawn(connection(
                tcp,
                app.clone(),
                limits,
                conn,
                Arc::clone(&registry),
            ));
            continue;
        };
        // Served on a thread of its own from here to its end (`base::cores`): the socket
        // leaves this runtime's event queue for that thread's.
        let placed = cores.place();
        let on = placed.handle();
        let (app, registry) = (app.clone(), Arc::clone(&registry));
        let moved = tcp.into_std();
        tasks.spawn_on(
            async move {
                let _placed = placed;
                match moved.and_then(TcpStream::from_std) {
                    Ok(tcp) => connection(tcp, app, limits, conn, registry).await,
                    Err(e) => {
                        registry.accept_failed(&e);
                        registry.remove(conn.id);
                    }
                }
            },
            on,
        );
    }
    drop(listener);
    registry.drain();
    registry.quiet().await;
    registry.close_all();
    while tasks.join_next().await.is_some() {}
}

async fn connection(
    tcp: TcpStream,
    app: Edge,
    limits: Limits,
    conn: Arc<ClientConn>,
    registry: Arc<Registry>,
) {
    let io = TokioIo::new(ClientIo::new(
        tcp,
        limits.client_write_timeout,
        conn.stall_flag(),
        Arc::clone(&conn.owed),
    ));
    let service = {
        let conn = Arc::clone(&conn);
        let registry = Arc::clone(&registry);
        hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let active = Active::new(Arc::clone(&conn));
            if registry.draining.load(Ordering::SeqCst) {
                conn.wind_down.set();
            }
            let conn = Arc::clone(&conn);
            let app = app.clone();
            async move {
                let resp = app.call(req.map(Body::new), Some(conn)).await;
                Ok::<_, Infallible>(resp.map(|inner| {
                    // An empty answer is never polled: it is done before its head is written.
                    let active = (!inner.is_end_stream()).then_some(active);
                    Body::new(Tracked { inner, active })
                }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // Idle kept-alive connections are the sweep's (see `serve`); the first head has its own
    // timer below.
    builder.header_read_timeout(None).keep_alive(true);
    let served = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(served);
    let first_head = tokio::time::sleep(limits.header_read_timeout);
    tokio::pin!(first_head);
    let mut winding_down = false;
    // A `select!` precondition is read when the `select!` starts, not when a branch fires: the
    // head timer is disarmed here, once it fires, if a request arrived meanwhile.
    let mut head_timer = true;
    let closed = loop {
        tokio::select! {
            served = &mut served => {
                break match served {
                    _ if conn.stalled.load(Ordering::SeqCst) => Some(Closed::Stalled),
                    _ => None,
                };
            }
            _ = conn.wind_down.wait(), if !winding_down => {
                winding_down = true;
                served.as_mut().graceful_shutdown();
            }
            _ = &mut first_head, if head_timer && !conn.started.load(Ordering::SeqCst) => {
                if conn.started.load(Ordering::SeqCst) {
                    head_timer = false;
                    continue;
                }
                break Some(Closed::HeadTimeout);
            }
            // Evicted (counted then), or idle too long.
            _ = conn.close.wait() => {
                break conn.idle_expired.load(Ordering::SeqCst).then_some(Closed::IdleTimeout);
            }
        }
    };
    if let Some(why) = closed {
        registry.stats.closed(why);
    }
    registry.remove(conn.id);
}

/// A client's socket whose writes fail when they make no progress for a while (the client
/// stopped reading), marking the connection stalled.
pub struct ClientIo<S> {
    inner: S,
    timeout: Duration,
    stalled: Arc<AtomicBool>,
    /// Cleared once everything handed to the socket's writer is written (hyper flushes its
    /// socket only when it holds nothing more to write).
    owed: Arc<AtomicBool>,
    /// Armed while a write waits.
    waiting: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> ClientIo<S> {
    pub fn new(
        inner: S,
        timeout: Duration,
        stalled: Arc<AtomicBool>,
        owed: Arc<AtomicBool>,
    ) -> ClientIo<S> {
        ClientIo {
            inner,
            timeout,
            stalled,
            owed,
            waiting: None,
        }
    }

    /// A write is pending: fails it once it has waited for the whole timeout.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let timeout = self.timeout;
        let waiting = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if waiting.as_mut().poll(cx).is_ready() {
            self.stalled.store(true, Ordering::SeqCst);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of its answer for the write timeout",
            )));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ClientIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ClientIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.pending(cx),
            ready => {
                self.waiting = None;
                ready
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.pending(cx),
            ready => {
                self.waiting = None;
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.pending(cx),
            ready => {
                self.waiting = None;
                if matches!(ready, Poll::Ready(Ok(()))) {
                    self.owed.store(false, Ordering::SeqCst);
                }
                ready
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const BIG: usize = 1 << 20;

    /// A server of `/big` (1 MiB) and `/small` on a listener whose connections have small send
    /// buffers, so that most of a big answer stays with the server; with its stats.
    async fn small_buffered_server(
        max_connections: usize,
        client_write_timeout: Duration,
    ) -> (
        SocketAddr,
        CancellationToken,
        tokio::task::JoinHandle<()>,
        Arc<EdgeStats>,
    ) {
        let router = axum::Router::new()
            .route("/big", axum::routing::get(|| async { vec![b'x'; BIG] }))
            .route("/small", axum::routing::get(|| async { "ok" }));
        let edge = crate::api::Edge::with_router(router, crate::api::test_state());
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(4096).unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(64).unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            header_read_timeout: Duration::from_secs(30),
            keepalive_idle_timeout: Duration::from_secs(30),
            client_write_timeout,
            max_connections,
        };
        let stop = CancellationToken::new();
        let stats = Arc::new(EdgeStats::default());
        let server = tokio::spawn(serve(
            listener,
            edge,
            limits,
            Arc::clone(&stats),
            stop.clone(),
        ));
        (addr, stop, server, stats)
    }

    /// A client with a small receive buffer that asked for `/big` and read only its head: the
    /// request is over, and the server holds most of its answer.
    async fn slow_reader_of_big(addr: SocketAddr) -> tokio::net::TcpStream {
        let client = tokio::net::TcpSocket::new_v4().unwrap();
        client.set_recv_buffer_size(4096).unwrap();
        let mut slow = client.connect(addr).await.unwrap();
        slow.write_all(b"GET /big HTTP/1.1\r\nhost: gateway\r\n\r\n")
            .await
            .unwrap();
        let head = read_until(&mut slow, b"\r\n\r\n").await;
        assert!(head.contains(&format!("content-length: {BIG}")), "{head}");
        slow
    }

    /// Reads byte by byte until `end`.
    async fn read_until(s: &mut tokio::net::TcpStream, end: &[u8]) -> String {
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(end) {
            assert_eq!(s.read(&mut byte).await.unwrap(), 1, "closed early");
            got.push(byte[0]);
        }
        String::from_utf8(got).unwrap()
    }

    /// What the server still holds of an answer when shutdown closes the connections (its
    /// request over, the client slow to read it) goes out before the connection closes.
    #[tokio::test]
    async fn an_answer_still_held_when_shutdown_closes_the_connections_goes_out_whole() {
        let (addr, stop, server, _) = small_buffered_server(16, Duration::from_secs(30)).await;
        let mut slow = slow_reader_of_big(addr).await;
        // A client idle since its answer: closed when every connection is.
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET /small HTTP/1.1\r\nhost: gateway\r\n\r\n")
            .await
            .unwrap();
        read_until(&mut idle, b"\r\n\r\nok").await;

        stop.cancel();
        let mut byte = [0u8; 1];
        assert_eq!(
            idle.read(&mut byte).await.unwrap(),
            0,
            "the idle one is closed"
        );
        // Only now does the slow client read on.
        let mut body = Vec::new();
        slow.read_to_end(&mut body).await.unwrap();
        assert_eq!(body.len(), BIG, "the answer was cut");
        server.await.unwrap();
    }

    /// At the connection cap, a connection still writing the end of its answer is not taken
    /// for an idle one: a connection that has sent nothing yet is closed to make room instead.
    #[tokio::test]
    async fn a_connection_still_writing_its_answer_is_not_evicted_as_idle() {
        let (addr, stop, server, _) = small_buffered_server(2, Duration::from_secs(30)).await;
        let mut slow = slow_reader_of_big(addr).await;
        // The second of two, accepted before the third: it has sent nothing.
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        third
            .write_all(b"GET /small HTTP/1.1\r\nhost: gateway\r\n\r\n")
            .await
            .unwrap();
        read_until(&mut third, b"\r\n\r\nok").await;
        // The slow client reads on: all of its answer comes.
        let mut body = vec![0u8; BIG];
        slow.read_exact(&mut body)
            .await
            .expect("the answer was cut");
        let mut byte = [0u8; 1];
        assert_eq!(
            silent.read(&mut byte).await.unwrap(),
            0,
            "the silent one made room"
        );
        stop.cancel();
        server.await.unwrap();
    }

    /// Its worst user: a client that never reads the rest of its answer does not hold the end
    /// of shutdown open; the write timeout closes it, as a stalled client.
    #[tokio::test]
    async fn a_client_that_never_reads_its_answer_does_not_hold_shutdown_open() {
        let (addr, stop, server, stats) =
            small_buffered_server(16, Duration::from_millis(200)).await;
        let slow = slow_reader_of_big(addr).await;
        stop.cancel();
        server.await.unwrap();
        assert_eq!(
            stats.closed[Closed::Stalled as usize].load(Ordering::Relaxed),
            1
        );
        drop(slow);
    }

    #[tokio::test]
    async fn a_write_that_makes_no_progress_fails_and_marks_the_connection() {
        // A pipe of 64 bytes nobody reads.
        let (ours, mut theirs) = tokio::io::duplex(64);
        let stalled = Arc::new(AtomicBool::new(false));
        let mut io = ClientIo::new(
            ours,
            Duration::from_millis(50),
            Arc::clone(&stalled),
            Arc::default(),
        );
        io.write_all(&[0; 64]).await.unwrap();
        let err = io.write_all(&[0; 64]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(stalled.load(Ordering::SeqCst));
        // A reader that keeps up is never cut.
        let (ours, mut reader) = tokio::io::duplex(64);
        let stalled = Arc::new(AtomicBool::new(false));
        let mut io = ClientIo::new(
            ours,
            Duration::from_millis(50),
            Arc::clone(&stalled),
            Arc::default(),
        );
        let drain = tokio::spawn(async move {
            let mut buf = vec![0; 1 << 16];
            let mut n = 0;
            while n < 1 << 16 {
                n += reader.read(&mut buf).await.unwrap();
            }
        });
        io.write_all(&vec![1; 1 << 16]).await.unwrap();
        drain.await.unwrap();
        assert!(!stalled.load(Ordering::SeqCst));
        let _ = theirs.read(&mut [0; 1]).await;
    }
}
