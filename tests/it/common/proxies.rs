//! Egress proxies on loopback for tests: a CONNECT proxy and a SOCKS5 proxy. Each counts the
//! tunnels it opened, keeps their targets, and the local address of each of its connections
//! to a target — the address the backend sees a tunnelled request come from.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Seen {
    tunnels: usize,
    /// `host:port` of each tunnel, as the client asked for it.
    targets: Vec<String>,
    /// This proxy's end of each connection to a target.
    outbound: BTreeSet<String>,
    /// Requests that were not a tunnel (absolute-form HTTP and the like): refused.
    refused: usize,
}

/// A proxy on 127.0.0.1 and what it saw.
#[derive(Clone)]
pub struct Proxy {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    /// `user:password` it requires, if any.
    credentials: Option<(String, String)>,
}

impl Proxy {
    pub fn tunnels(&self) -> usize {
        self.seen.lock().unwrap().tunnels
    }

    pub fn targets(&self) -> Vec<String> {
        self.seen.lock().unwrap().targets.clone()
    }

    pub fn refused(&self) -> usize {
        self.seen.lock().unwrap().refused
    }

    /// Whether a connection the backend saw from `peer` was one of this proxy's.
    pub fn carried(&self, peer: &str) -> bool {
        self.seen.lock().unwrap().outbound.contains(peer)
    }

    /// `scheme://[user:password@]127.0.0.1:port`.
    pub fn url(&self, scheme: &str) -> String {
        match &self.credentials {
            Some((u, p)) => format!("{scheme}://{u}:{p}@{}", self.addr),
            None => format!("{scheme}://{}", self.addr),
        }
    }

    async fn open(&self, target: &str) -> Option<TcpStream> {
        let upstream = TcpStream::connect(target).await.ok()?;
        let mut seen = self.seen.lock().unwrap();
        seen.tunnels += 1;
        seen.targets.push(target.to_string());
        seen.outbound
            .insert(upstream.local_addr().unwrap().to_string());
        Some(upstream)
    }

    /// A CONNECT proxy: anything but `CONNECT` is answered 405; with credentials, a request
    /// without the right `Proxy-Authorization` is answered 407.
    pub async fn connect(credentials: Option<(&str, &str)>) -> Proxy {
        let (p, listener) = Self::bind(credentials).await;
        let me = p.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let me = me.clone();
                tokio::spawn(async move { me.serve_connect(client).await });
            }
        });
        p
    }

    /// A SOCKS5 proxy (no auth, or user/password when given).
    pub async fn socks5(credentials: Option<(&str, &str)>) -> Proxy {
        let (p, listener) = Self::bind(credentials).await;
        let me = p.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let me = me.clone();
                tokio::spawn(async move { me.serve_socks5(client).await });
            }
        });
        p
    }

    async fn bind(credentials: Option<(&str, &str)>) -> (Proxy, TcpListener) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy {
            addr: listener.local_addr().unwrap(),
            seen: Arc::default(),
            credentials: credentials.map(|(u, p)| (u.to_string(), p.to_string())),
        };
        (proxy, listener)
    }

    async fn serve_connect(self, mut client: TcpStream) {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() > 16 * 1024 || client.read(&mut b).await.unwrap_or(0) == 0 {
                return;
            }
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head).to_string();
        let mut words = head.split_whitespace();
        let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        if method != "CONNECT" {
            self.seen.lock().unwrap().refused += 1;
            let _ = client
                .write_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
                .await;
            return;
        }
        if let Some((u, p)) = &self.credentials {
            let want = format!(
                "proxy-authorization: basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
            .to_lowercase();
            if !head.to_lowercase().contains(&want) {
                let _ = client
                    .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
                    .await;
                return;
            }
        }
        let Some(mut upstream) = self.open(target).await else {
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
            return;
        };
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_ok()
        {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        }
    }

    async fn serve_socks5(self, mut c: TcpStream) {
        let _ = self.socks5_session(&mut c).await;
    }

    async fn socks5_session(&self, c: &mut TcpStream) -> std::io::Result<()> {
        let mut greet = [0u8; 2];
        c.read_exact(&mut greet).await?;
        let mut methods = vec![0u8; usize::from(greet[1])];
        c.read_exact(&mut methods).await?;
        let want = if self.credentials.is_some() { 2 } else { 0 };
        if greet[0] != 5 || !methods.contains(&want) {
            c.write_all(&[5, 0xff]).await?;
            return Ok(());
        }
        c.write_all(&[5, want]).await?;
        if let Some((u, p)) = &self.credentials {
            let mut v = [0u8; 2];
            c.read_exact(&mut v).await?;
            let mut user = vec![0u8; usize::from(v[1])];
            c.read_exact(&mut user).await?;
            let mut n = [0u8; 1];
            c.read_exact(&mut n).await?;
            let mut pass = vec![0u8; usize::from(n[0])];
            c.read_exact(&mut pass).await?;
            let ok = user == u.as_bytes() && pass == p.as_bytes();
            c.write_all(&[1, if ok { 0 } else { 1 }]).await?;
            if !ok {
                return Ok(());
            }
        }
        let mut req = [0u8; 4];
        c.read_exact(&mut req).await?;
        let host = match req[3] {
            1 => {
                let mut a = [0u8; 4];
                c.read_exact(&mut a).await?;
                std::net::Ipv4Addr::from(a).to_string()
            }
            4 => {
                let mut a = [0u8; 16];
                c.read_exact(&mut a).await?;
                format!("[{}]", std::net::Ipv6Addr::from(a))
            }
            3 => {
                let mut n = [0u8; 1];
                c.read_exact(&mut n).await?;
                let mut name = vec![0u8; usize::from(n[0])];
                c.read_exact(&mut name).await?;
                String::from_utf8_lossy(&name).to_string()
            }
            _ => return Ok(()),
        };
        let mut port = [0u8; 2];
        c.read_exact(&mut port).await?;
        let target = format!("{host}:{}", u16::from_be_bytes(port));
        let Some(mut upstream) = self.open(&target).await else {
            c.write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
            return Ok(());
        };
        c.write_all(&[5, 0, 0, 1, 127, 0, 0, 1, 0, 0]).await?;
        let _ = tokio::io::copy_bidirectional(c, &mut upstream).await;
        Ok(())
    }
}

/// A proxy address nothing listens on.
pub fn dead_proxy(scheme: &str) -> String {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    format!("{scheme}://{addr}")
}
