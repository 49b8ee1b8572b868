//! The admin API's JSON shapes, shared by the daemon (which fills them) and the console and
//! CLI (which read them). The console's live feed will extend this module.

use serde::{Deserialize, Serialize};

/// Version of the admin API and console feed; a console refuses a daemon of another one.
pub const PROTOCOL_VERSION: u32 = 1;

/// `GET /api/admin/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub protocol: u32,
    pub pid: u32,
    pub uptime_s: u64,
    /// The client-facing listener.
    pub listen: String,
    /// Number of accounts in the pool.
    pub accounts: usize,
    /// Accounts per state (`ready`, `disabled`, ...).
    #[serde(default)]
    pub accounts_by_state: std::collections::BTreeMap<String, usize>,
    pub in_flight: u64,
    pub waiting: u64,
}

/// One account as the admin API shows it. Never carries a token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub id: String,
    pub label: String,
    pub email: Option<String>,
    pub plan: Option<String>,
    pub chatgpt_account_id: String,
    pub enabled: bool,
    /// `ready | cooling | half_open | needs_reauth | disabled`.
    pub state: String,
    /// RFC 3339.
    pub created_at: String,
}

/// `POST /api/admin/accounts`: the account, and whether it was new or updated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportedAccount {
    #[serde(flatten)]
    pub account: Account,
    pub created: bool,
}

/// One client key as listed. The key itself is shown only once, at creation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    pub id: String,
    pub name: String,
    /// The key's first characters, to recognise it.
    pub prefix: String,
    pub enabled: bool,
    pub created_at: String,
    pub revoked_at: Option<String>,
}

/// `POST /api/admin/keys`: the new key, with its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedKey {
    #[serde(flatten)]
    pub info: Key,
    /// The client key (`sk-sy-…`), shown this once.
    pub key: String,
}

/// `POST /api/admin/keys` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateKey {
    pub name: String,
}

/// Error body of every admin and `/v1` error: `{"error": {...}}`, the OpenAI shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub code: Option<String>,
    #[serde(default)]
    pub param: Option<String>,
}
