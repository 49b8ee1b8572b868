//! A small HTTP/1.1 client for the admin API over its Unix socket, used by the management
//! commands when a daemon is running.

use std::path::{Path, PathBuf};

use axum::http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use switchyard_tui::wire::ErrorBody;
use tokio::net::UnixStream;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the daemon at {path}: {source}")]
    Connect {
        path: PathBuf,
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
}

#[derive(Debug, Clone)]
pub struct AdminClient {
    socket: PathBuf,
}

impl AdminClient {
    /// A client for `socket` if a daemon answers there.
    pub async fn connect(socket: &Path) -> Result<AdminClient, ClientError> {
        UnixStream::connect(socket)
            .await
            .map_err(|source| ClientError::Connect {
                path: socket.to_path_buf(),
                source,
            })?;
        Ok(AdminClient {
            socket: socket.to_path_buf(),
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends one request; returns the decoded JSON of a 2xx answer, or the daemon's error.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| ClientError::Connect {
                    path: self.socket.clone(),
                    source,
                })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?;
        let conn = tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, "switchyard");
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ClientError::Http(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?
            .to_bytes();
        conn.abort();
        if !status.is_success() {
            let message = serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|e| e.error.message)
                .unwrap_or_else(|_| format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes)));
            return Err(ClientError::Api { status, message });
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()))
    }
}
