//! The shapes persisted in the store. Changing a field here means a new codec version (see
//! `codec.rs`), so these carry the fields later features need from the start.

use serde::{Deserialize, Serialize};

use super::secrets::Secret;

/// An upstream ChatGPT account, without its tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountRecord {
    /// Short stable id derived from the ChatGPT account and user ids.
    pub id: String,
    pub label: String,
    pub email: Option<String>,
    pub plan: Option<String>,
    pub chatgpt_account_id: String,
    pub chatgpt_user_id: Option<String>,
    pub enabled: bool,
    /// Lower goes first under the `fill_first` strategy.
    pub priority: i32,
    /// Per-account cap on concurrent requests; `None` uses the pool default.
    pub max_concurrency: Option<u32>,
    /// Unix seconds.
    pub created_at: u64,
    pub updated_at: u64,
}

/// An account's OAuth tokens; stored only sealed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountSecrets {
    pub access_token: Secret,
    pub refresh_token: Secret,
    pub id_token: Secret,
    /// `exp` of the access token (unix seconds) when it could be read.
    pub access_expires_at: Option<u64>,
    /// When the tokens were last obtained (unix seconds).
    pub refreshed_at: u64,
}

/// A client key: only its SHA-256 is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientKeyRecord {
    pub id: String,
    pub name: String,
    /// The first characters of the key, to recognise it in lists (`sk-sy-AbCd`).
    pub prefix: String,
    pub sha256: [u8; 32],
    pub enabled: bool,
    pub created_at: u64,
    pub revoked_at: Option<u64>,
}
