//! `[upstream]`: where the Codex backend and its auth server are, and the client's timeouts.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use crate::base::duration::text as duration;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Codex backend base URL; `/responses` and `/models` are under it.
    #[serde(deserialize_with = "http_url")]
    pub base_url: String,
    /// Usage and limits endpoint (`wham/usage`).
    #[serde(deserialize_with = "http_url")]
    pub usage_url: String,
    /// OAuth token endpoint used to refresh account tokens (and to finish a login).
    #[serde(deserialize_with = "http_url")]
    pub oauth_token_url: String,
    /// The auth server `account login` talks to: the device-code endpoints
    /// (`/api/accounts/deviceauth/…`, `/codex/device`) and `/oauth/authorize` hang off it.
    #[serde(deserialize_with = "http_url")]
    pub auth_base_url: String,
    /// OAuth client id of Codex CLI.
    pub oauth_client_id: String,
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// Time allowed for the upstream's response headers.
    #[serde(with = "duration")]
    pub header_timeout: Duration,
    /// Longest silence allowed inside a stream.
    #[serde(with = "duration")]
    pub stream_idle_timeout: Duration,
    /// Fail over an account that shows nothing within this long ("0s" = off).
    #[serde(with = "duration")]
    pub first_output_timeout: Duration,
    /// At most this many failovers per request for a first-output timeout; the next timeout
    /// is answered to the client.
    pub first_output_switches: u32,
    /// The longest a request may take to get a first answer from any account, failovers and
    /// waits included.
    #[serde(with = "duration")]
    pub request_deadline: Duration,
    /// `client_version` sent when fetching the model catalog.
    pub client_version: String,
    /// Honour `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` (and `NO_PROXY`) for upstream traffic.
    /// Off: a proxy meant for something else must not catch the gateway's traffic (or the
    /// loopback a simulator listens on).
    pub use_env_proxy: bool,
    /// The egress proxy of every account without one of its own (`http://`, `https://`,
    /// `socks5://`, `socks5h://`, credentials allowed), for the backend and the auth server.
    #[serde(deserialize_with = "proxy_url")]
    pub proxy: Option<String>,
    /// The model of the one minimal request that proves a new, logged-in-again or long-cooled
    /// account before it takes requests.
    pub probe_model: String,
}

/// The model accounts are proved with, unless `[upstream] probe_model` says otherwise.
pub const DEFAULT_PROBE_MODEL: &str = "gpt-5.5";

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            base_url: "https://chatgpt.com/backend-api/codex".into(),
            usage_url: "https://chatgpt.com/backend-api/wham/usage".into(),
            oauth_token_url: "https://auth.openai.com/oauth/token".into(),
            auth_base_url: "https://auth.openai.com".into(),
            oauth_client_id: "app_EMoamEEZ73f0CkXaXp7hrann".into(),
            connect_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(60),
            stream_idle_timeout: Duration::from_secs(300),
            first_output_timeout: Duration::ZERO,
            first_output_switches: 1,
            request_deadline: Duration::from_secs(600),
            client_version: "0.169.0".into(),
            use_env_proxy: false,
            proxy: None,
            probe_model: DEFAULT_PROBE_MODEL.into(),
        }
    }
}

pub fn check_http_url(s: &str) -> Result<(), String> {
    let uri: axum::http::Uri = s.parse().map_err(|e| format!("`{s}` is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.authority().is_some() => Ok(()),
        _ => Err(format!("`{s}` must be an http:// or https:// URL")),
    }
}

fn http_url<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    check_http_url(&s).map_err(serde::de::Error::custom)?;
    Ok(s.trim_end_matches('/').to_string())
}

fn proxy_url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let s = String::deserialize(d)?;
    let p = super::egress::ProxyUrl::parse(&s).map_err(serde::de::Error::custom)?;
    Ok(Some(p.as_url()))
}
