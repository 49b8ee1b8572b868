//! The way out to the backend: straight, or through an egress proxy (`http://`, `https://`,
//! `socks5://`, `socks5h://`, with optional credentials). A proxy always carries a tunnel —
//! `CONNECT host:port` or a SOCKS5 connect — for HTTP, SSE and WebSocket traffic alike, so the
//! backend sees the same bytes whichever way they went; only the TLS of an `https://` proxy
//! itself comes on top.
//!
//! The handshakes are generic over `AsyncRead + AsyncWrite` and bounded (a proxy's answer head
//! is at most 8 KiB), so they are tested without sockets.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine;
use futures_util::future::BoxFuture;
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Largest answer head a proxy may send to a `CONNECT`.
const MAX_CONNECT_HEAD: usize = 8 * 1024;

/// An egress proxy, parsed and checked. `Debug` and [`ProxyUrl::redacted`] never show the
/// password; [`ProxyUrl::as_url`] (what is sealed in the store) does.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    scheme: ProxyScheme,
    host: String,
    port: u16,
    credentials: Option<(String, String)>,
}

/// How a proxy is spoken to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyScheme {
    /// `CONNECT` over plain TCP.
    Http,
    /// `CONNECT` over TLS to the proxy.
    Https,
    /// SOCKS5, the target's name resolved here.
    Socks5,
    /// SOCKS5, the target's name resolved by the proxy.
    Socks5h,
}

impl ProxyScheme {
    fn name(self) -> &'static str {
        match self {
            ProxyScheme::Http => "http",
            ProxyScheme::Https => "https",
            ProxyScheme::Socks5 => "socks5",
            ProxyScheme::Socks5h => "socks5h",
        }
    }

    fn default_port(self) -> u16 {
        match self {
            ProxyScheme::Http => 80,
            ProxyScheme::Https => 443,
            ProxyScheme::Socks5 | ProxyScheme::Socks5h => 1080,
        }
    }
}

impl ProxyUrl {
    /// Parses `scheme://[user[:password]@]host[:port]` (credentials percent-encoded); a path,
    /// query or fragment is refused, as is any other scheme.
    pub fn parse(s: &str) -> Result<ProxyUrl, String> {
        let url = reqwest::Url::parse(s.trim()).map_err(|e| format!("`{s}` is not a URL: {e}"))?;
        let scheme = match url.scheme() {
            "http" => ProxyScheme::Http,
            "https" => ProxyScheme::Https,
            "socks5" => ProxyScheme::Socks5,
            "socks5h" => ProxyScheme::Socks5h,
            other => {
                return Err(format!(
                    "proxy scheme `{other}`: use http://, https://, socks5:// or socks5h://"
                ));
            }
        };
        let host = match url.host_str() {
            Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']').to_string(),
            _ => return Err("the proxy URL has no host".into()),
        };
        if !(url.path().is_empty() || url.path() == "/")
            || url.query().is_some()
            || url.fragment().is_some()
        {
            return Err("a proxy URL is scheme://[user:password@]host:port, nothing after".into());
        }
        let decode = |s: &str| {
            crate::base::urlcode::decode(s, false)
                .ok_or_else(|| String::from("the proxy's credentials are not valid UTF-8"))
        };
        let credentials = if url.username().is_empty() && url.password().is_none() {
            None
        } else {
            let user = decode(url.username())?;
            let pass = decode(url.password().unwrap_or(""))?;
            if matches!(scheme, ProxyScheme::Socks5 | ProxyScheme::Socks5h)
                && (user.len() > 255 || pass.len() > 255)
            {
                return Err("SOCKS5 credentials are at most 255 bytes each".into());
            }
            Some((user, pass))
        };
        Ok(ProxyUrl {
            scheme,
            port: url.port().unwrap_or(scheme.default_port()),
            host,
            credentials,
        })
    }

    pub fn scheme(&self) -> ProxyScheme {
        self.scheme
    }

    fn authority(&self) -> String {
        authority(&self.host, self.port)
    }

    /// The whole URL, credentials included (what is sealed in the store).
    pub fn as_url(&self) -> String {
        match &self.credentials {
            Some((u, p)) => format!(
                "{}://{}:{}@{}",
                self.scheme.name(),
                crate::base::urlcode::encode(u),
                crate::base::urlcode::encode(p),
                self.authority()
            ),
            None => format!("{}://{}", self.scheme.name(), self.authority()),
        }
    }

    /// Whether it carries a password.
    pub fn has_password(&self) -> bool {
        self.credentials
            .as_ref()
            .is_some_and(|(_, p)| !p.is_empty())
    }

    /// The URL with the password replaced by `***` (for lists, logs and errors).
    pub fn redacted(&self) -> String {
        match &self.credentials {
            Some((u, _)) => format!(
                "{}://{}:***@{}",
                self.scheme.name(),
                crate::base::urlcode::encode(u),
                self.authority()
            ),
            None => self.as_url(),
        }
    }
}

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Display for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The proxy environment variables (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`, in
/// upper or lower case), read once.
#[derive(Debug, Default)]
pub struct EnvProxies {
    https: Option<Arc<ProxyUrl>>,
    http: Option<Arc<ProxyUrl>>,
    /// Hosts that go straight: `*`, a name (which covers its subdomains), an address.
    no_proxy: Vec<String>,
}

impl EnvProxies {
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> EnvProxies {
        let get = |name: &str| {
            var(name)
                .or_else(|| var(&name.to_lowercase()))
                .filter(|v| !v.trim().is_empty())
        };
        let parse = |name: &str| {
            let v = get(name)?;
            match ProxyUrl::parse(&v) {
                Ok(p) => Some(Arc::new(p)),
                Err(e) => {
                    tracing::warn!(variable = name, error = %e, "proxy variable ignored");
                    None
                }
            }
        };
        let all = parse("ALL_PROXY");
        EnvProxies {
            https: parse("HTTPS_PROXY").or_else(|| all.clone()),
            http: parse("HTTP_PROXY").or(all),
            no_proxy: get("NO_PROXY")
                .unwrap_or_default()
                .split(',')
                .map(|h| h.trim().trim_start_matches('.').to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
        }
    }

    /// The proxy for a connection to `host`, unless `NO_PROXY` lets it go straight.
    pub fn for_target(&self, https: bool, host: &str) -> Option<&Arc<ProxyUrl>> {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let straight = self
            .no_proxy
            .iter()
            .any(|n| n == "*" || host == *n || host.ends_with(&format!(".{n}")));
        if straight {
            return None;
        }
        if https {
            self.https.as_ref()
        } else {
            self.http.as_ref()
        }
    }
}

/// Why the way out could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// No TCP (or TLS) connection to the proxy.
    #[error("proxy unreachable: {proxy} ({source})")]
    ProxyUnreachable { proxy: String, source: io::Error },
    /// The proxy answered but would not open the tunnel.
    #[error("proxy {proxy} refused the tunnel to {target}: {reason}")]
    ProxyRefused {
        proxy: String,
        target: String,
        reason: String,
    },
    /// No connection to the target (direct).
    #[error("{0}")]
    Target(io::Error),
    #[error("no connection within {0:?}")]
    Timeout(Duration),
}

/// A connection on its way out: a TCP stream (straight, or tunnelled through a plain proxy,
/// whose tunnel is the stream itself), or a tunnel inside TLS to an `https://` proxy.
pub enum EgressStream {
    Tcp(TcpStream),
    ProxyTls(Box<TlsStream<TcpStream>>),
}

/// Opens a connection to `host:port`, through `proxy` when given, within `timeout`.
pub async fn connect(
    proxy: Option<&ProxyUrl>,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<EgressStream, EgressError> {
    match tokio::time::timeout(timeout, connect_now(proxy, host, port)).await {
        Ok(r) => r,
        Err(_) => Err(match proxy {
            Some(p) => EgressError::ProxyUnreachable {
                proxy: p.redacted(),
                source: io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no tunnel within {timeout:?}"),
                ),
            },
            None => EgressError::Timeout(timeout),
        }),
    }
}

async fn connect_now(
    proxy: Option<&ProxyUrl>,
    host: &str,
    port: u16,
) -> Result<EgressStream, EgressError> {
    let Some(p) = proxy else {
        let s = TcpStream::connect((host, port))
            .await
            .map_err(EgressError::Target)?;
        let _ = s.set_nodelay(true);
        return Ok(EgressStream::Tcp(s));
    };
    let unreachable = |source: io::Error| EgressError::ProxyUnreachable {
        proxy: p.redacted(),
        source,
    };
    let refused = |reason: String| EgressError::ProxyRefused {
        proxy: p.redacted(),
        target: authority(host, port),
        reason,
    };
    let tcp = TcpStream::connect((p.host.as_str(), p.port))
        .await
        .map_err(unreachable)?;
    let _ = tcp.set_nodelay(true);
    let creds = p
        .credentials
        .as_ref()
        .map(|(u, p)| (u.as_str(), p.as_str()));
    match p.scheme {
        ProxyScheme::Http => {
            let mut tcp = tcp;
            http_connect(&mut tcp, host, port, creds)
                .await
                .map_err(|e| tunnel_error(e, unreachable, refused))?;
            Ok(EgressStream::Tcp(tcp))
        }
        ProxyScheme::Https => {
            let name = rustls::pki_types::ServerName::try_from(p.host.clone())
                .map_err(|e| unreachable(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
            let mut tls = tokio_rustls::TlsConnector::from(tls_config(Alpn::None)?)
                .connect(name, tcp)
                .await
                .map_err(unreachable)?;
            http_connect(&mut tls, host, port, creds)
                .await
                .map_err(|e| tunnel_error(e, unreachable, refused))?;
            Ok(EgressStream::ProxyTls(Box::new(tls)))
        }
        ProxyScheme::Socks5 | ProxyScheme::Socks5h => {
            let target = if p.scheme == ProxyScheme::Socks5h {
                SocksTarget::Name(host.to_string())
            } else {
                let addr = tokio::net::lookup_host((host, port))
                    .await
                    .map_err(EgressError::Target)?
                    .next()
                    .ok_or_else(|| {
                        EgressError::Target(io::Error::new(
                            io::ErrorKind::NotFound,
                            format!("{host} has no address"),
                        ))
                    })?;
                SocksTarget::Ip(addr.ip())
            };
            let mut tcp = tcp;
            socks5_connect(&mut tcp, &target, port, creds)
                .await
                .map_err(|e| tunnel_error(e, unreachable, refused))?;
            Ok(EgressStream::Tcp(tcp))
        }
    }
}

/// A handshake that failed: cut off (the proxy is unreachable in effect), or refused.
enum Handshake {
    Io(io::Error),
    Refused(String),
}

impl From<io::Error> for Handshake {
    fn from(e: io::Error) -> Self {
        Handshake::Io(e)
    }
}

fn tunnel_error(
    e: Handshake,
    unreachable: impl FnOnce(io::Error) -> EgressError,
    refused: impl FnOnce(String) -> EgressError,
) -> EgressError {
    match e {
        Handshake::Io(e) => unreachable(e),
        Handshake::Refused(r) => refused(r),
    }
}

/// `CONNECT host:port`, then the proxy's answer head; a 2xx opens the tunnel. Reads byte by
/// byte so that nothing after the head is taken from the tunnel.
async fn http_connect<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    host: &str,
    port: u16,
    credentials: Option<(&str, &str)>,
) -> Result<(), Handshake> {
    let target = authority(host, port);
    let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some((u, p)) = credentials {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
        head.push_str(&format!("Proxy-Authorization: Basic {token}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await?;
    s.flush().await?;
    let mut answer = Vec::with_capacity(128);
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        if answer.len() >= MAX_CONNECT_HEAD {
            return Err(Handshake::Refused(format!(
                "an answer head over {MAX_CONNECT_HEAD} bytes"
            )));
        }
        if s.read(&mut byte).await? == 0 {
            return Err(Handshake::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the proxy closed the connection before answering CONNECT",
            )));
        }
        answer.push(byte[0]);
    }
    let line = answer
        .split(|b| *b == b'\n')
        .next()
        .map(|l| String::from_utf8_lossy(l).trim().to_string())
        .unwrap_or_default();
    let mut parts = line.split_whitespace();
    let version = parts.next().unwrap_or("");
    let status: u16 = parts.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    if !version.starts_with("HTTP/1.") {
        return Err(Handshake::Refused(format!("not an HTTP answer: `{line}`")));
    }
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(Handshake::Refused(line))
    }
}

/// Where a SOCKS5 proxy is asked to connect.
enum SocksTarget {
    Ip(IpAddr),
    Name(String),
}

/// A SOCKS5 connect (RFC 1928), with user/password authentication (RFC 1929) when given.
async fn socks5_connect<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    target: &SocksTarget,
    port: u16,
    credentials: Option<(&str, &str)>,
) -> Result<(), Handshake> {
    let refused = |r: &str| Err(Handshake::Refused(r.to_string()));
    if credentials.is_some() {
        s.write_all(&[5, 2, 0, 2]).await?;
    } else {
        s.write_all(&[5, 1, 0]).await?;
    }
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await?;
    if choice[0] != 5 {
        return refused("not a SOCKS5 proxy");
    }
    match (choice[1], credentials) {
        (0, _) => {}
        (2, Some((u, p))) => {
            let mut auth = vec![1, len_u8(u.len())];
            auth.extend_from_slice(u.as_bytes());
            auth.push(len_u8(p.len()));
            auth.extend_from_slice(p.as_bytes());
            s.write_all(&auth).await?;
            let mut status = [0u8; 2];
            s.read_exact(&mut status).await?;
            if status[1] != 0 {
                return refused("the proxy refused the user name and password");
            }
        }
        (0xff, None) | (2, None) => return refused("the proxy wants credentials"),
        _ => return refused("the proxy offers no authentication method this client has"),
    }
    let mut req = vec![5, 1, 0];
    match target {
        SocksTarget::Ip(IpAddr::V4(ip)) => {
            req.push(1);
            req.extend_from_slice(&ip.octets());
        }
        SocksTarget::Ip(IpAddr::V6(ip)) => {
            req.push(4);
            req.extend_from_slice(&ip.octets());
        }
        SocksTarget::Name(name) => {
            if name.len() > 255 {
                return refused("a host name over 255 bytes");
            }
            req.push(3);
            req.push(len_u8(name.len()));
            req.extend_from_slice(name.as_bytes());
        }
    }
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).await?;
    let mut reply = [0u8; 4];
    s.read_exact(&mut reply).await?;
    if reply[0] != 5 {
        return refused("not a SOCKS5 answer");
    }
    if reply[1] != 0 {
        return Err(Handshake::Refused(socks_reply(reply[1]).to_string()));
    }
    let rest = match reply[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        3 => {
            let mut n = [0u8; 1];
            s.read_exact(&mut n).await?;
            usize::from(n[0]) + 2
        }
        _ => return refused("an unknown address type in the answer"),
    };
    let mut bound = vec![0u8; rest];
    s.read_exact(&mut bound).await?;
    Ok(())
}

fn len_u8(n: usize) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

fn socks_reply(code: u8) -> &'static str {
    match code {
        1 => "general SOCKS server failure",
        2 => "connection not allowed by ruleset",
        3 => "network unreachable",
        4 => "host unreachable",
        5 => "connection refused",
        6 => "TTL expired",
        7 => "command not supported",
        8 => "address type not supported",
        _ => "an unknown SOCKS5 error",
    }
}

/// What a TLS connection of the gateway's offers by ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alpn {
    /// Nothing: the connection to an `https://` proxy.
    None,
    /// HTTP/1.1: the backend through a proxy's tunnel.
    H1,
    /// HTTP/2, else HTTP/1.1: the backend straight.
    H2,
}

/// The TLS settings of the gateway's own TLS connections (to an `https://` proxy, and to the
/// backend): the platform's trust store, and what `alpn` offers.
fn tls_config(alpn: Alpn) -> Result<Arc<rustls::ClientConfig>, EgressError> {
    static CONFIGS: [OnceLock<Result<Arc<rustls::ClientConfig>, String>>; 3] =
        [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    CONFIGS[alpn as usize]
        .get_or_init(|| {
            super::install_crypto_provider();
            use rustls_platform_verifier::ConfigVerifierExt;
            let mut c =
                rustls::ClientConfig::with_platform_verifier().map_err(|e| e.to_string())?;
            c.alpn_protocols = match alpn {
                Alpn::None => Vec::new(),
                Alpn::H1 => vec![b"http/1.1".to_vec()],
                Alpn::H2 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            };
            Ok(Arc::new(c))
        })
        .clone()
        .map_err(|e| EgressError::Target(io::Error::other(format!("TLS settings: {e}"))))
}

/// Implements `AsyncRead` and `AsyncWrite` for a two-way enum of streams by handing each call
/// to the stream it holds.
macro_rules! either_io {
    ($t:ty, $a:ident, $b:ident) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::$a(s) => Pin::new(s).poll_read(cx, buf),
                    Self::$b(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
                }
            }
        }

        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::$a(s) => Pin::new(s).poll_write(cx, buf),
                    Self::$b(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::$a(s) => Pin::new(s).poll_flush(cx),
                    Self::$b(s) => Pin::new(s.as_mut()).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::$a(s) => Pin::new(s).poll_shutdown(cx),
                    Self::$b(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::$a(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    Self::$b(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    Self::$a(s) => s.is_write_vectored(),
                    Self::$b(s) => s.is_write_vectored(),
                }
            }
        }
    };
}

either_io!(EgressStream, Tcp, ProxyTls);

/// An HTTP connection to the backend, straight or through a proxy's tunnel, TLS inside for
/// `https://`.
pub struct TunnelConn {
    io: TokioIo<TunnelIo>,
    /// TLS agreed on HTTP/2.
    h2: bool,
}

enum TunnelIo {
    Plain(EgressStream),
    Tls(Box<TlsStream<EgressStream>>),
}

either_io!(TunnelIo, Plain, Tls);

impl hyper::rt::Read for TunnelConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TunnelConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Connection for TunnelConn {
    fn connected(&self) -> Connected {
        // Not `proxy(true)`: requests go in origin form, inside the tunnel.
        let c = Connected::new();
        if self.h2 { c.negotiated_h2() } else { c }
    }
}

/// The connector of an HTTP client to the backend: through one proxy (each connection a
/// tunnel to the request's host, HTTP/1.1), or straight (HTTP/2 where TLS agrees on it).
#[derive(Clone)]
pub struct TunnelConnector {
    proxy: Option<Arc<ProxyUrl>>,
    timeout: Duration,
}

impl TunnelConnector {
    pub fn new(proxy: Arc<ProxyUrl>, timeout: Duration) -> Self {
        TunnelConnector {
            proxy: Some(proxy),
            timeout,
        }
    }

    /// Connections made straight to the request's host.
    pub fn direct(timeout: Duration) -> Self {
        TunnelConnector {
            proxy: None,
            timeout,
        }
    }
}

impl tower_service::Service<Uri> for TunnelConnector {
    type Response = TunnelConn;
    type Error = EgressError;
    type Future = BoxFuture<'static, Result<TunnelConn, EgressError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), EgressError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let proxy = self.proxy.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let https = dst.scheme_str() == Some("https");
            let host = dst
                .host()
                .unwrap_or("")
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = dst.port_u16().unwrap_or(if https { 443 } else { 80 });
            let stream = connect(proxy.as_deref(), &host, port, timeout).await?;
            let alpn = if proxy.is_some() { Alpn::H1 } else { Alpn::H2 };
            let (io, h2) = if https {
                let name = rustls::pki_types::ServerName::try_from(host.clone()).map_err(|e| {
                    EgressError::Target(io::Error::new(io::ErrorKind::InvalidInput, e))
                })?;
                let tls = tokio_rustls::TlsConnector::from(tls_config(alpn)?)
                    .connect(name, stream)
                    .await
                    .map_err(EgressError::Target)?;
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                (TunnelIo::Tls(Box::new(tls)), h2)
            } else {
                (TunnelIo::Plain(stream), false)
            };
            Ok(TunnelConn {
                io: TokioIo::new(io),
                h2,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls_parse_with_their_credentials_and_print_redacted() {
        let p = ProxyUrl::parse("socks5h://us%40er:p%3Ass@proxy.lan:1081").unwrap();
        assert_eq!(p.scheme(), ProxyScheme::Socks5h);
        assert_eq!(
            p.credentials,
            Some(("us@er".to_string(), "p:ss".to_string()))
        );
        assert_eq!(p.redacted(), "socks5h://us%40er:***@proxy.lan:1081");
        assert_eq!(format!("{p:?}"), p.redacted());
        assert_eq!(ProxyUrl::parse(&p.as_url()).unwrap(), p);
        let h = ProxyUrl::parse("http://10.0.0.1").unwrap();
        assert_eq!(h.as_url(), "http://10.0.0.1:80");
        assert_eq!(
            ProxyUrl::parse("https://[::1]:8443").unwrap().as_url(),
            "https://[::1]:8443"
        );
        for bad in [
            "ftp://x:1",
            "socks4://x:1",
            "http://x:1/path",
            "http://x:1?q=1",
            "not a url",
            "http://",
        ] {
            assert!(ProxyUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn environment_proxies_follow_the_scheme_and_no_proxy() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            EnvProxies::from_env(move |k| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            })
        };
        let e = env(&[
            ("https_proxy", "http://secure:3128"),
            ("ALL_PROXY", "socks5h://all:1080"),
            ("NO_PROXY", "localhost, .internal.lan,10.0.0.7"),
        ]);
        let name = |p: Option<&Arc<ProxyUrl>>| p.map(|p| p.as_url());
        assert_eq!(
            name(e.for_target(true, "chatgpt.com")).as_deref(),
            Some("http://secure:3128")
        );
        assert_eq!(
            name(e.for_target(false, "chatgpt.com")).as_deref(),
            Some("socks5h://all:1080")
        );
        for straight in ["localhost", "api.internal.lan", "internal.lan", "10.0.0.7"] {
            assert!(e.for_target(true, straight).is_none(), "{straight}");
        }
        assert!(
            env(&[("NO_PROXY", "*"), ("HTTP_PROXY", "http://p:1")])
                .for_target(false, "x")
                .is_none()
        );
        assert!(
            env(&[("HTTP_PROXY", "ftp://bad")])
                .for_target(false, "x")
                .is_none()
        );
    }

    #[tokio::test]
    async fn connect_asks_for_the_tunnel_with_credentials_and_leaves_the_rest_to_it() {
        let (mut ours, mut proxy) = tokio::io::duplex(4096);
        let peer = tokio::spawn(async move {
            let mut buf = vec![0u8; 1024];
            let n = proxy.read(&mut buf).await.unwrap();
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            proxy
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\nfirst bytes")
                .await
                .unwrap();
            head
        });
        http_connect(&mut ours, "backend.test", 443, Some(("u", "p")))
            .await
            .ok()
            .unwrap();
        let mut rest = [0u8; 11];
        ours.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"first bytes");
        let head = peer.await.unwrap();
        assert!(
            head.starts_with("CONNECT backend.test:443 HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.contains("Proxy-Authorization: Basic dTpw\r\n"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn a_refused_connect_says_what_the_proxy_answered() {
        let (mut ours, mut proxy) = tokio::io::duplex(4096);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 1024];
            let _ = proxy.read(&mut buf).await;
            let _ = proxy
                .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
                .await;
        });
        match http_connect(&mut ours, "h", 80, None).await {
            Err(Handshake::Refused(r)) => assert!(r.contains("407"), "{r}"),
            _ => panic!("a 407 must refuse the tunnel"),
        }
    }

    #[tokio::test]
    async fn socks5_connects_by_name_with_a_password() {
        let (mut ours, mut proxy) = tokio::io::duplex(4096);
        let peer = tokio::spawn(async move {
            let mut greet = [0u8; 4];
            proxy.read_exact(&mut greet).await.unwrap();
            assert_eq!(greet, [5, 2, 0, 2]);
            proxy.write_all(&[5, 2]).await.unwrap();
            let mut auth = [0u8; 1 + 1 + 4 + 1 + 2];
            proxy.read_exact(&mut auth).await.unwrap();
            assert_eq!(&auth, b"\x01\x04user\x02pw");
            proxy.write_all(&[1, 0]).await.unwrap();
            let mut req = [0u8; 4 + 1 + 7 + 2];
            proxy.read_exact(&mut req).await.unwrap();
            assert_eq!(&req[..5], &[5, 1, 0, 3, 7]);
            assert_eq!(&req[5..12], b"backend");
            assert_eq!(u16::from_be_bytes([req[12], req[13]]), 8443);
            proxy
                .write_all(&[5, 0, 0, 1, 127, 0, 0, 1, 0x1f, 0x90])
                .await
                .unwrap();
            proxy.write_all(b"tunnel").await.unwrap();
        });
        socks5_connect(
            &mut ours,
            &SocksTarget::Name("backend".into()),
            8443,
            Some(("user", "pw")),
        )
        .await
        .ok()
        .unwrap();
        let mut rest = [0u8; 6];
        ours.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"tunnel");
        peer.await.unwrap();
    }

    #[tokio::test]
    async fn a_socks5_refusal_is_named() {
        let (mut ours, mut proxy) = tokio::io::duplex(4096);
        tokio::spawn(async move {
            let mut greet = [0u8; 3];
            proxy.read_exact(&mut greet).await.unwrap();
            proxy.write_all(&[5, 0]).await.unwrap();
            let mut req = [0u8; 10];
            proxy.read_exact(&mut req).await.unwrap();
            proxy
                .write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0])
                .await
                .unwrap();
        });
        let target = SocksTarget::Ip("127.0.0.1".parse().unwrap());
        match socks5_connect(&mut ours, &target, 80, None).await {
            Err(Handshake::Refused(r)) => assert_eq!(r, "connection refused"),
            _ => panic!("a refusal must be reported"),
        }
    }

    #[tokio::test]
    async fn a_dead_proxy_is_unreachable_by_name() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let p = ProxyUrl::parse(&format!("http://u:secret@{addr}")).unwrap();
        let Err(e) = connect(Some(&p), "backend", 80, Duration::from_secs(5)).await else {
            panic!("nothing listens there");
        };
        let text = e.to_string();
        assert!(
            text.starts_with("proxy unreachable: http://u:***@"),
            "{text}"
        );
        assert!(!text.contains("secret"), "{text}");
    }
}
