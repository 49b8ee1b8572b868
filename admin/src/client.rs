//! The admin API's client: HTTP/1.1 over the daemon's Unix socket, or over TCP with the admin
//! token, and the console feed's WebSocket on the same transports. Its typed methods are the
//! only place outside the daemon's router that spells a path of the API: the management
//! commands and the console call them.

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite;

use crate::report::Report;
use crate::wire::{
    Account, AccountAction, AccountPatch, CreateKey, CreatedKey, ErrorBody, ExportedAccount,
    ImportedAccount, Key, KeyPolicyPatch, Reloaded, RequestRecord, Status, StoreReport,
    UsageBucket,
};

/// The root of every path of the admin API.
const ROOT: &str = "/api/admin";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the daemon at {at}: {source}")]
    Connect {
        at: String,
        #[source]
        source: std::io::Error,
    },
    #[error("admin API request failed: {0}")]
    Http(String),
    /// The daemon answered with an error; `message` is its own words.
    #[error("{message}")]
    Api { status: StatusCode, message: String },
    #[error("unexpected answer from the daemon: {0}")]
    Decode(String),
    #[error(
        "bad admin URL `{0}`: expected http://HOST:PORT (TLS is not spoken; use an SSH tunnel)"
    )]
    BadUrl(String),
}

/// Where the daemon's admin API is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Its Unix socket (no token: file permissions are the access control).
    Socket(PathBuf),
    /// Its TCP listener, `host:port`, with the admin token.
    Tcp { addr: String, token: String },
}

impl Target {
    /// A TCP target from `http://host:port[/]` (or `ws://`, or a bare `host:port`).
    pub fn from_url(url: &str, token: &str) -> Result<Target, ClientError> {
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("ws://"))
            .unwrap_or(url);
        if rest.contains("://") {
            return Err(ClientError::BadUrl(url.to_string()));
        }
        let addr = rest.trim_end_matches('/');
        if addr.is_empty() || addr.contains('/') || !addr.contains(':') {
            return Err(ClientError::BadUrl(url.to_string()));
        }
        Ok(Target::Tcp {
            addr: addr.to_string(),
            token: token.to_string(),
        })
    }

    fn token(&self) -> Option<&str> {
        match self {
            Target::Socket(_) => None,
            Target::Tcp { token, .. } => Some(token),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Socket(p) => write!(f, "{}", p.display()),
            Target::Tcp { addr, .. } => write!(f, "http://{addr}"),
        }
    }
}

/// A byte stream to the daemon.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The console feed's socket.
pub type FeedSocket = WebSocketStream<Box<dyn Io>>;

#[derive(Debug, Clone)]
pub struct AdminClient {
    target: Target,
}

impl AdminClient {
    pub fn new(target: Target) -> AdminClient {
        AdminClient { target }
    }

    /// A client for `socket` if a daemon answers there.
    pub async fn connect(socket: &Path) -> Result<AdminClient, ClientError> {
        let client = AdminClient::new(Target::Socket(socket.to_path_buf()));
        client.stream().await?;
        Ok(client)
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    async fn stream(&self) -> Result<Box<dyn Io>, ClientError> {
        let connect_error = |source| ClientError::Connect {
            at: self.target.to_string(),
            source,
        };
        Ok(match &self.target {
            Target::Socket(path) => {
                Box::new(UnixStream::connect(path).await.map_err(connect_error)?)
            }
            Target::Tcp { addr, .. } => {
                let s = TcpStream::connect(addr.as_str())
                    .await
                    .map_err(connect_error)?;
                let _ = s.set_nodelay(true);
                Box::new(s)
            }
        })
    }

    /// `GET /status`: the daemon's version, protocol, pid and pool in numbers.
    pub async fn status(&self) -> Result<Status, ClientError> {
        self.get(&format!("{ROOT}/status")).await
    }

    /// `GET /accounts`.
    pub async fn accounts(&self) -> Result<Vec<Account>, ClientError> {
        self.get(&format!("{ROOT}/accounts")).await
    }

    /// `GET /accounts/{selector}`: one account by its id, chatgpt_account_id, email or label.
    pub async fn account(&self, selector: &str) -> Result<Account, ClientError> {
        self.get(&account_path(selector)).await
    }

    /// `POST /accounts`: imports a Codex `auth.json` (new, or an update of a known login).
    pub async fn import_account(&self, auth_json: &[u8]) -> Result<ImportedAccount, ClientError> {
        let path = format!("{ROOT}/accounts");
        self.call(Method::POST, &path, Some(auth_json.to_vec()))
            .await
    }

    /// `PUT /accounts/{id}`.
    pub async fn update_account(
        &self,
        id: &str,
        patch: &AccountPatch,
    ) -> Result<Account, ClientError> {
        self.call(Method::PUT, &account_path(id), Some(to_json(patch)?))
            .await
    }

    /// `DELETE /accounts/{id}`.
    pub async fn remove_account(&self, id: &str) -> Result<Account, ClientError> {
        self.call(Method::DELETE, &account_path(id), None).await
    }

    /// `POST /accounts/{id}/{action}`.
    pub async fn account_action(
        &self,
        id: &str,
        action: AccountAction,
    ) -> Result<Account, ClientError> {
        let path = format!("{}/{}", account_path(id), action.segment());
        self.call(Method::POST, &path, None).await
    }

    /// `POST /accounts/{id}/reset-window`: spends one reset credit on the account.
    pub async fn reset_window(&self, id: &str) -> Result<crate::wire::CreditSpend, ClientError> {
        let path = format!("{}/reset-window", account_path(id));
        self.call(Method::POST, &path, None).await
    }

    /// `POST /accounts/{id}/export`: the login as an `auth.json`; the account is disabled in
    /// the pool unless `keep`.
    pub async fn export_account(
        &self,
        id: &str,
        keep: bool,
    ) -> Result<ExportedAccount, ClientError> {
        let path = format!("{}/export?keep={keep}", account_path(id));
        self.call(Method::POST, &path, None).await
    }

    /// `GET /settings`: the scheduling settings in force.
    pub async fn settings(&self) -> Result<serde_json::Value, ClientError> {
        self.get(&format!("{ROOT}/settings")).await
    }

    /// `PUT /settings`: changes some of them live (`null` returns one to the config's value).
    pub async fn update_settings(
        &self,
        patch: &serde_json::Value,
    ) -> Result<serde_json::Value, ClientError> {
        let path = format!("{ROOT}/settings");
        self.call(Method::PUT, &path, Some(to_json(patch)?)).await
    }

    /// `GET /requests?limit=N`: the newest request records, newest first.
    pub async fn requests(&self, limit: usize) -> Result<Vec<RequestRecord>, ClientError> {
        self.get(&format!("{ROOT}/requests?limit={limit}")).await
    }

    /// `GET /keys`.
    pub async fn keys(&self) -> Result<Vec<Key>, ClientError> {
        self.get(&format!("{ROOT}/keys")).await
    }

    /// `GET /keys/{id}`: one key by its id or name.
    pub async fn key(&self, id: &str) -> Result<Key, ClientError> {
        self.get(&key_path(id)).await
    }

    /// `POST /keys`: a new key, with its secret (shown this once).
    pub async fn create_key(&self, key: &CreateKey) -> Result<CreatedKey, ClientError> {
        let path = format!("{ROOT}/keys");
        self.call(Method::POST, &path, Some(to_json(key)?)).await
    }

    /// `PATCH /keys/{id}`: changes a key's policy.
    pub async fn update_key(&self, id: &str, patch: &KeyPolicyPatch) -> Result<Key, ClientError> {
        self.call(Method::PATCH, &key_path(id), Some(to_json(patch)?))
            .await
    }

    /// `DELETE /keys/{id}`: revokes a key (by id, or the one active key of that name).
    pub async fn revoke_key(&self, id: &str) -> Result<Key, ClientError> {
        self.call(Method::DELETE, &key_path(id), None).await
    }

    /// `GET /usage?from=&to=`: the hourly usage buckets of the hours starting in `[from, to)`
    /// (unix seconds), what is not written yet included.
    pub async fn usage(&self, from: u64, to: u64) -> Result<Vec<UsageBucket>, ClientError> {
        self.get(&format!("{ROOT}/usage?from={from}&to={to}")).await
    }

    /// `GET /report`: the error report over `windows` (minutes; the daemon's defaults when
    /// empty), failures slower than `slow_ms` counted as slow (the daemon's default if none).
    pub async fn report(
        &self,
        windows: &[u64],
        slow_ms: Option<u64>,
    ) -> Result<Report, ClientError> {
        let mut query: Vec<String> = windows.iter().map(|w| format!("window={w}")).collect();
        query.extend(slow_ms.map(|ms| format!("slow_ms={ms}")));
        let path = match query.is_empty() {
            true => format!("{ROOT}/report"),
            false => format!("{ROOT}/report?{}", query.join("&")),
        };
        self.get(&path).await
    }

    /// `POST /reload`: the daemon applies `config_text` (the config file's contents; empty:
    /// it reads its own file again).
    pub async fn reload(&self, config_text: &str) -> Result<Reloaded, ClientError> {
        let path = format!("{ROOT}/reload");
        self.call(Method::POST, &path, Some(config_text.as_bytes().to_vec()))
            .await
    }

    /// `GET /doctor`: the daemon's view of its store.
    pub async fn doctor(&self) -> Result<StoreReport, ClientError> {
        self.get(&format!("{ROOT}/doctor")).await
    }

    /// `GET /backup`: a backup taken now, written to `out` as it arrives; `secret.key` is
    /// appended when `include_key`. Returns the bytes written.
    pub async fn backup(
        &self,
        include_key: bool,
        out: &mut impl std::io::Write,
    ) -> Result<u64, ClientError> {
        let path = format!("{ROOT}/backup?include_key={include_key}");
        self.download(Method::GET, &path, out).await
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(Method::GET, path, None).await
    }

    /// Sends one request on a fresh connection; returns the answer's status, its body and the
    /// connection's task (to abort once the body is read).
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Incoming, JoinHandle<()>), ClientError> {
        let http = |e: hyper::Error| ClientError::Http(e.to_string());
        let stream = self.stream().await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, "switchyard");
        if let Some(token) = self.target.token() {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ClientError::Http(e.to_string()))?;
        let resp = sender.send_request(req).await.map_err(http)?;
        Ok((resp.status(), resp.into_body(), conn))
    }

    /// Sends one request to any path; returns the decoded JSON of a 2xx answer, or the
    /// daemon's error. The typed methods above are the API; this is for what probes it
    /// (tests sending what no typed method would).
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        let (status, body, conn) = self.send(method, path, body).await?;
        let bytes = collect(body).await;
        conn.abort();
        let bytes = bytes?;
        if !status.is_success() {
            return Err(api_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// Sends one request and writes a 2xx answer's body to `out` as it arrives (a backup);
    /// returns the bytes written, or the daemon's error.
    async fn download(
        &self,
        method: Method,
        path: &str,
        out: &mut impl std::io::Write,
    ) -> Result<u64, ClientError> {
        let (status, mut body, conn) = self.send(method, path, None).await?;
        if !status.is_success() {
            let bytes = collect(body).await;
            conn.abort();
            return Err(api_error(status, &bytes?));
        }
        let mut written = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ClientError::Http(e.to_string()))?;
            if let Ok(data) = frame.into_data() {
                out.write_all(&data)
                    .map_err(|e| ClientError::Http(format!("cannot write: {e}")))?;
                written += data.len() as u64;
            }
        }
        conn.abort();
        Ok(written)
    }

    /// Opens the console feed (`GET /console`, WebSocket).
    pub async fn feed(&self) -> Result<FeedSocket, ClientError> {
        use tungstenite::client::IntoClientRequest;
        let stream = self.stream().await?;
        let mut req = format!("ws://switchyard{ROOT}/console")
            .into_client_request()
            .map_err(|e| ClientError::Http(e.to_string()))?;
        if let Some(token) = self.target.token() {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| ClientError::Http("the admin token is not a valid header".into()))?;
            req.headers_mut().insert(header::AUTHORIZATION, value);
        }
        match tokio_tungstenite::client_async(req, stream).await {
            Ok((socket, _)) => Ok(socket),
            Err(tungstenite::Error::Http(resp)) => {
                let status = resp.status();
                let body = resp.body().clone().unwrap_or_default();
                Err(match status {
                    StatusCode::NOT_FOUND => ClientError::Api {
                        status,
                        message: "the daemon has no console feed (an older version?)".into(),
                    },
                    _ => api_error(status, &body),
                })
            }
            Err(e) => Err(ClientError::Http(e.to_string())),
        }
    }
}

fn account_path(id: &str) -> String {
    format!("{ROOT}/accounts/{}", segment(id))
}

fn key_path(id: &str) -> String {
    format!("{ROOT}/keys/{}", segment(id))
}

/// A path segment: every byte but RFC 3986's unreserved ones percent-encoded.
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, ClientError> {
    serde_json::to_vec(v).map_err(|e| ClientError::Decode(e.to_string()))
}

/// A whole answer body.
async fn collect(body: Incoming) -> Result<Bytes, ClientError> {
    Ok(body
        .collect()
        .await
        .map_err(|e| ClientError::Http(e.to_string()))?
        .to_bytes())
}

fn api_error(status: StatusCode, bytes: &[u8]) -> ClientError {
    let message = serde_json::from_slice::<ErrorBody>(bytes)
        .map(|e| e.error.message)
        .unwrap_or_else(|_| format!("HTTP {status}: {}", String::from_utf8_lossy(bytes)));
    ClientError::Api { status, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_tcp_listener() {
        let t = Target::from_url("http://127.0.0.1:8080/", "tok").unwrap();
        assert_eq!(
            t,
            Target::Tcp {
                addr: "127.0.0.1:8080".into(),
                token: "tok".into()
            }
        );
        assert!(Target::from_url("localhost:9", "t").is_ok());
        for bad in ["https://host:443", "http://host", "http://host:1/x", ""] {
            assert!(Target::from_url(bad, "t").is_err(), "{bad}");
        }
    }
}
