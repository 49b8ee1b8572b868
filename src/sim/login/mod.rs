//! The login side of the auth server (protocol §J1, §J2): device-code login
//! (`POST /api/accounts/deviceauth/usercode` and `/token`), the browser's `GET /oauth/authorize`,
//! and the `authorization_code` grant of `POST /oauth/token`. The sim's own base URL is the
//! issuer.
//!
//! The sim plays the user: a device code stays pending until a control approves it as an
//! account, denies or expires it; `/oauth/authorize` answers at once, logged in as the account
//! set by [`Sim::set_authorize_answer`] (default: the first one) or denying. A redeemed code is
//! a new refresh-token family of that account; the account's other families stay valid
//! (`Sim::revoke_family` ends one).
//!
//! Answers not pinned by the protocol notes, chosen here:
//! - a poll's answer, first match wins: 404 `deviceauth_not_found` (no code has that id and
//!   user code), `slow_down` owed to the control, `slow_down` for a poll sooner than `interval`
//!   seconds (less [`POLL_GRACE_MS`]) after the previous poll of the code (the required gap
//!   does not grow after a `slow_down`; the first poll is never too soon), then the code's
//!   state;
//! - an approved or denied code keeps its answer past its lifetime (only a pending code
//!   expires), and an approved code answers the same grant to every poll;
//! - an authorization code lives [`AUTH_CODE_TTL_MS`] and is spent only by a successful
//!   exchange (a wrong verifier or redirect leaves it usable);
//! - `/oauth/authorize` accepts only the redirects registered for Codex ([`REDIRECT_URIS`])
//!   and only a 43-character S256 challenge; a refused request is a 400, never a redirect.

mod authorize;
mod codes;
mod device;

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::Sim;
use super::server::{Outcome, json};

pub(crate) use authorize::{authorize, exchange};
pub(crate) use codes::{Logins, PollAnswer, Redirect};
pub(crate) use device::{poll, usercode};

/// How much sooner than `interval` a poll may come before it is `slow_down` (network jitter).
pub const POLL_GRACE_MS: u64 = 100;
/// An authorization code must be exchanged within this long (sim clock).
pub const AUTH_CODE_TTL_MS: u64 = 10 * 60 * 1000;
/// The redirect of the device flow's authorization code per the protocol notes. Also accepted:
/// `http://{issuer}/deviceauth/callback`, which Codex CLI 0.169 sends when pointed at another
/// issuer (`--experimental_issuer`; seen against this simulator).
pub const DEVICE_REDIRECT_URI: &str = "https://auth.openai.com/deviceauth/callback";
/// The browser flow's redirects registered for Codex's client id (its callback server's two
/// ports); `/oauth/authorize` refuses any other.
pub const REDIRECT_URIS: [&str; 2] = [
    "http://localhost:1455/auth/callback",
    "http://localhost:1457/auth/callback",
];
/// `error_description` of a denied browser login unless set otherwise.
const DEFAULT_DENIAL: &str = "The user denied the authorization request.";

/// Where a device code stands, as the controls show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceCodeState {
    Pending,
    Approved,
    Denied,
    Expired,
}

impl DeviceCodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceCodeState::Pending => "pending",
            DeviceCodeState::Approved => "approved",
            DeviceCodeState::Denied => "denied",
            DeviceCodeState::Expired => "expired",
        }
    }
}

/// One device code issued by `/api/accounts/deviceauth/usercode`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCode {
    pub device_auth_id: String,
    pub user_code: String,
    /// As of now (a pending code past its lifetime is `expired`).
    pub state: DeviceCodeState,
    /// The account it was approved as.
    pub account_id: Option<String>,
    /// The `interval` it was issued with, seconds.
    pub interval_secs: u64,
    /// Its `expires_at`, by the sim clock (unix ms).
    pub expires_at_ms: u64,
    /// Polls of `/api/accounts/deviceauth/token` so far, `slow_down` answers included.
    pub polls: u32,
}

/// How the simulated user answers `/oauth/authorize`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case", deny_unknown_fields)]
pub enum AuthorizeAnswer {
    /// Logged in as this account: redirect with `code` and `state`.
    Approve { account_id: String },
    /// Refused: redirect with `error=access_denied`, this `error_description` and `state`.
    Deny {
        #[serde(default = "default_denial")]
        error_description: String,
    },
}

fn default_denial() -> String {
    DEFAULT_DENIAL.to_string()
}

impl AuthorizeAnswer {
    /// A denial with the default description.
    pub fn deny() -> Self {
        AuthorizeAnswer::Deny {
            error_description: default_denial(),
        }
    }
}

/// What new device codes are issued with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSettings {
    /// The `interval` answered (and enforced with `slow_down`), seconds.
    pub interval_secs: u64,
    /// Lifetime, seconds (sim clock).
    pub lifetime_secs: u64,
}

/// Why a login control call did nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginControlError {
    #[error("unknown user code {0}")]
    UnknownUserCode(String),
    #[error("unknown account {0}")]
    UnknownAccount(String),
    #[error("the device code is {}, not pending", .0.as_str())]
    NotPending(DeviceCodeState),
}

/// The PKCE S256 challenge of `verifier`: base64url (no padding) of its SHA-256.
pub fn pkce_challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// `{"error": {"code", "message"}}`, the shape of the device endpoints' errors.
fn error(status: u16, code: &str, message: &str) -> Outcome {
    json(
        status,
        &json!({"error": {"code": code, "message": message}}),
    )
    .into()
}

/// The login controls ([`Sim`]'s other controls are in `sim/mod.rs`; the same ones over HTTP
/// are under `/sim/login/`).
impl Sim {
    /// Every device code issued (the newest 1000), oldest first, with its state now.
    pub fn device_codes(&self) -> Vec<DeviceCode> {
        let now = self.now_ms();
        self.lock().logins.device_codes(now)
    }

    /// Resolves once at least `n` device codes have been issued, with all of them (a test
    /// waits here for its client to ask for a code, wrapped in a timeout).
    pub async fn wait_device_codes(&self, n: usize) -> Vec<DeviceCode> {
        let mut issued = self.inner.device_codes_issued.subscribe();
        // The sender lives as long as `self`: this never fails while we wait.
        let _ = issued.wait_for(|&k| k >= n).await;
        self.device_codes()
    }

    /// The user enters `user_code` and approves it as `account_id`: the next poll gets the
    /// authorization code and the PKCE pair.
    pub fn approve_device_code(
        &self,
        user_code: &str,
        account_id: &str,
    ) -> Result<DeviceCode, LoginControlError> {
        let now = self.now_ms();
        let mut st = self.lock();
        if st.account(account_id).is_none() {
            return Err(LoginControlError::UnknownAccount(account_id.to_string()));
        }
        st.logins.approve(user_code, account_id, now, self.nonce())
    }

    /// The user refuses: polls answer 403 `access_denied`.
    pub fn deny_device_code(&self, user_code: &str) -> Result<DeviceCode, LoginControlError> {
        let now = self.now_ms();
        self.lock().logins.deny(user_code, now)
    }

    /// The code expires now: polls answer 403 `deviceauth_expired`.
    pub fn expire_device_code(&self, user_code: &str) -> Result<DeviceCode, LoginControlError> {
        let now = self.now_ms();
        self.lock().logins.expire(user_code, now)
    }

    /// The code's next poll answers 403 `slow_down` (once per call).
    pub fn slow_down_device_code(&self, user_code: &str) -> Result<DeviceCode, LoginControlError> {
        let now = self.now_ms();
        self.lock().logins.slow_down(user_code, now)
    }

    /// The `interval` of device codes issued from now on (default 5; 0 never asks to slow
    /// down).
    pub fn set_device_interval(&self, secs: u64) {
        self.lock().logins.interval_secs = secs;
    }

    /// The lifetime of device codes issued from now on (default 15 minutes; whole seconds).
    pub fn set_device_lifetime(&self, lifetime: Duration) {
        self.lock().logins.lifetime_ms = lifetime.as_secs().saturating_mul(1000);
    }

    pub fn device_settings(&self) -> DeviceSettings {
        self.lock().logins.settings()
    }

    /// How `/oauth/authorize` answers from now on.
    pub fn set_authorize_answer(&self, answer: AuthorizeAnswer) -> Result<(), LoginControlError> {
        let mut st = self.lock();
        if let AuthorizeAnswer::Approve { account_id } = &answer
            && st.account(account_id).is_none()
        {
            return Err(LoginControlError::UnknownAccount(account_id.clone()));
        }
        st.logins.authorize = Some(answer);
        Ok(())
    }

    /// How `/oauth/authorize` answers now (by default as the first account; a sim without
    /// accounts denies).
    pub fn authorize_answer(&self) -> AuthorizeAnswer {
        let st = self.lock();
        match (&st.logins.authorize, st.accounts.first()) {
            (Some(a), _) => a.clone(),
            (None, Some(first)) => AuthorizeAnswer::Approve {
                account_id: first.id().to_string(),
            },
            (None, None) => AuthorizeAnswer::deny(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkce_challenge_is_the_rfc7636_example() {
        // RFC 7636, appendix B.
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }
}
