//! The login flows' state: device codes (what each poll gets) and authorization codes (what
//! an exchange checks), with the sim's other state under its one lock.

use std::collections::VecDeque;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

use super::{
    AUTH_CODE_TTL_MS, AuthorizeAnswer, DEVICE_REDIRECT_URI, DeviceCode, DeviceCodeState,
    DeviceSettings, LoginControlError, POLL_GRACE_MS, pkce_challenge,
};

/// `interval` of a new device code, seconds, unless set otherwise.
const DEFAULT_INTERVAL_SECS: u64 = 5;
/// Lifetime of a new device code unless set otherwise (Codex's prompt says 15 minutes).
const DEFAULT_LIFETIME_MS: u64 = 15 * 60 * 1000;
/// Device codes, and authorization codes, remembered; the oldest are forgotten first.
const MAX_CODES: usize = 1000;

/// The login state, part of the sim's one locked `State`.
#[derive(Debug)]
pub(crate) struct Logins {
    pub(super) interval_secs: u64,
    pub(super) lifetime_ms: u64,
    /// How `/oauth/authorize` answers; `None`: as the first account.
    pub(super) authorize: Option<AuthorizeAnswer>,
    device: VecDeque<DeviceAuth>,
    codes: VecDeque<AuthCode>,
    /// Mixed into every secret, so two are never the same.
    counter: u64,
}

impl Default for Logins {
    fn default() -> Self {
        Self {
            interval_secs: DEFAULT_INTERVAL_SECS,
            lifetime_ms: DEFAULT_LIFETIME_MS,
            authorize: None,
            device: VecDeque::new(),
            codes: VecDeque::new(),
            counter: 0,
        }
    }
}

/// The PKCE pair and code an approved device code answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub authorization_code: String,
    pub code_challenge: String,
    pub code_verifier: String,
}

#[derive(Debug, Clone)]
enum DeviceAnswer {
    Pending,
    Approved { account_id: String, grant: Grant },
    Denied,
    Expired,
}

#[derive(Debug)]
struct DeviceAuth {
    id: String,
    user_code: String,
    interval_secs: u64,
    expires_at_ms: u64,
    answer: DeviceAnswer,
    last_poll_ms: Option<u64>,
    polls: u32,
    /// `slow_down` answers still owed to the slow-down control.
    slow_downs: u32,
}

/// What a poll of the token endpoint gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PollAnswer {
    SlowDown,
    Pending,
    Denied,
    Expired,
    Approved(Grant),
}

impl DeviceAuth {
    fn state(&self, now_ms: u64) -> DeviceCodeState {
        match &self.answer {
            DeviceAnswer::Pending if now_ms >= self.expires_at_ms => DeviceCodeState::Expired,
            DeviceAnswer::Pending => DeviceCodeState::Pending,
            DeviceAnswer::Approved { .. } => DeviceCodeState::Approved,
            DeviceAnswer::Denied => DeviceCodeState::Denied,
            DeviceAnswer::Expired => DeviceCodeState::Expired,
        }
    }

    fn poll(&mut self, now_ms: u64) -> PollAnswer {
        self.polls += 1;
        let previous = self.last_poll_ms.replace(now_ms);
        if self.slow_downs > 0 {
            self.slow_downs -= 1;
            return PollAnswer::SlowDown;
        }
        let gap_ms = (self.interval_secs * 1000).saturating_sub(POLL_GRACE_MS);
        if previous.is_some_and(|p| now_ms < p.saturating_add(gap_ms)) {
            return PollAnswer::SlowDown;
        }
        match (&self.answer, self.state(now_ms)) {
            (DeviceAnswer::Approved { grant, .. }, _) => PollAnswer::Approved(grant.clone()),
            (_, DeviceCodeState::Pending) => PollAnswer::Pending,
            (_, DeviceCodeState::Denied) => PollAnswer::Denied,
            _ => PollAnswer::Expired,
        }
    }

    fn view(&self, now_ms: u64) -> DeviceCode {
        DeviceCode {
            device_auth_id: self.id.clone(),
            user_code: self.user_code.clone(),
            state: self.state(now_ms),
            account_id: match &self.answer {
                DeviceAnswer::Approved { account_id, .. } => Some(account_id.clone()),
                _ => None,
            },
            interval_secs: self.interval_secs,
            expires_at_ms: self.expires_at_ms,
            polls: self.polls,
        }
    }
}

/// Where an authorization code may be redeemed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// [`DEVICE_REDIRECT_URI`], or `http://{issuer}/deviceauth/callback`.
    DeviceCallback,
    /// Exactly the `redirect_uri` given to `/oauth/authorize`.
    Exact(String),
}

#[derive(Debug)]
struct AuthCode {
    code: String,
    account_id: String,
    challenge: String,
    redirect: Redirect,
    issued_ms: u64,
    used: bool,
}

/// Why an `authorization_code` exchange was refused (all `invalid_grant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RedeemError {
    Unknown,
    Used,
    Expired,
    RedirectMismatch,
    VerifierMismatch,
}

impl RedeemError {
    pub fn description(self) -> &'static str {
        match self {
            RedeemError::Unknown => "The authorization code is invalid.",
            RedeemError::Used => "The authorization code has already been used.",
            RedeemError::Expired => "The authorization code has expired.",
            RedeemError::RedirectMismatch => {
                "The redirect_uri does not match the one the authorization code was issued for."
            }
            RedeemError::VerifierMismatch => "The code_verifier does not match the code_challenge.",
        }
    }
}

fn push_capped<T>(q: &mut VecDeque<T>, v: T) {
    if q.len() >= MAX_CODES {
        q.pop_front();
    }
    q.push_back(v);
}

/// Letters and digits that cannot be misread (32 of them, so a byte maps without bias).
const USER_CODE_ALPHABET: &[u8; 32] = b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789";

impl Logins {
    /// 32 bytes nobody can guess: SHA-256 of OS randomness, the instance nonce and a counter
    /// (the last two keep secrets distinct should the OS have no randomness to give).
    fn secret(&mut self, nonce: &str) -> [u8; 32] {
        self.counter += 1;
        let mut os = [0u8; 32];
        let _ = getrandom::fill(&mut os);
        Sha256::new()
            .chain_update(os)
            .chain_update(nonce.as_bytes())
            .chain_update(self.counter.to_le_bytes())
            .finalize()
            .into()
    }

    /// A new pending device code.
    pub fn issue_device_code(&mut self, now_ms: u64, nonce: &str) -> DeviceCode {
        let id = format!("deviceauth_{}", URL_SAFE_NO_PAD.encode(self.secret(nonce)));
        let user_code = loop {
            let bytes = self.secret(nonce);
            let mut code: String = bytes
                .iter()
                .take(9)
                .map(|b| char::from(USER_CODE_ALPHABET[usize::from(b % 32)]))
                .collect();
            code.insert(4, '-');
            if !self.device.iter().any(|d| d.user_code == code) {
                break code;
            }
        };
        let d = DeviceAuth {
            id,
            user_code,
            interval_secs: self.interval_secs,
            expires_at_ms: now_ms.saturating_add(self.lifetime_ms),
            answer: DeviceAnswer::Pending,
            last_poll_ms: None,
            polls: 0,
            slow_downs: 0,
        };
        let view = d.view(now_ms);
        push_capped(&mut self.device, d);
        view
    }

    pub fn device_codes(&self, now_ms: u64) -> Vec<DeviceCode> {
        self.device.iter().map(|d| d.view(now_ms)).collect()
    }

    /// Answers a poll; `None` when no code has this id and user code.
    pub fn poll(&mut self, id: &str, user_code: &str, now_ms: u64) -> Option<PollAnswer> {
        let d = self
            .device
            .iter_mut()
            .find(|d| d.id == id && d.user_code == user_code)?;
        Some(d.poll(now_ms))
    }

    fn device_mut(&mut self, user_code: &str) -> Result<&mut DeviceAuth, LoginControlError> {
        self.device
            .iter_mut()
            .find(|d| d.user_code == user_code)
            .ok_or_else(|| LoginControlError::UnknownUserCode(user_code.to_string()))
    }

    fn pending_mut(
        &mut self,
        user_code: &str,
        now_ms: u64,
    ) -> Result<&mut DeviceAuth, LoginControlError> {
        let d = self.device_mut(user_code)?;
        match d.state(now_ms) {
            DeviceCodeState::Pending => Ok(d),
            other => Err(LoginControlError::NotPending(other)),
        }
    }

    /// The user approves `user_code` as `account_id` (which the caller has checked): the
    /// server makes the PKCE pair and the authorization code the next poll gets.
    pub fn approve(
        &mut self,
        user_code: &str,
        account_id: &str,
        now_ms: u64,
        nonce: &str,
    ) -> Result<DeviceCode, LoginControlError> {
        self.pending_mut(user_code, now_ms)?;
        let mut verifier = self.secret(nonce).to_vec();
        verifier.extend(self.secret(nonce));
        let code_verifier = URL_SAFE_NO_PAD.encode(verifier);
        let code_challenge = pkce_challenge(&code_verifier);
        let authorization_code = self.issue_code(
            account_id,
            &code_challenge,
            Redirect::DeviceCallback,
            now_ms,
            nonce,
        );
        let d = self.device_mut(user_code)?;
        d.answer = DeviceAnswer::Approved {
            account_id: account_id.to_string(),
            grant: Grant {
                authorization_code,
                code_challenge,
                code_verifier,
            },
        };
        Ok(d.view(now_ms))
    }

    pub fn deny(&mut self, user_code: &str, now_ms: u64) -> Result<DeviceCode, LoginControlError> {
        let d = self.pending_mut(user_code, now_ms)?;
        d.answer = DeviceAnswer::Denied;
        Ok(d.view(now_ms))
    }

    /// Expires the code whatever its state (an authorization code it already led to stays
    /// redeemable).
    pub fn expire(
        &mut self,
        user_code: &str,
        now_ms: u64,
    ) -> Result<DeviceCode, LoginControlError> {
        let d = self.device_mut(user_code)?;
        d.answer = DeviceAnswer::Expired;
        Ok(d.view(now_ms))
    }

    /// The code's next poll is answered `slow_down` (one per call).
    pub fn slow_down(
        &mut self,
        user_code: &str,
        now_ms: u64,
    ) -> Result<DeviceCode, LoginControlError> {
        let d = self.device_mut(user_code)?;
        d.slow_downs += 1;
        Ok(d.view(now_ms))
    }

    pub fn settings(&self) -> DeviceSettings {
        DeviceSettings {
            interval_secs: self.interval_secs,
            lifetime_secs: self.lifetime_ms / 1000,
        }
    }

    /// A new authorization code for `account_id`, redeemable once with the verifier of
    /// `challenge` at `redirect`.
    pub fn issue_code(
        &mut self,
        account_id: &str,
        challenge: &str,
        redirect: Redirect,
        now_ms: u64,
        nonce: &str,
    ) -> String {
        let code = format!("ac_{}", URL_SAFE_NO_PAD.encode(self.secret(nonce)));
        push_capped(
            &mut self.codes,
            AuthCode {
                code: code.clone(),
                account_id: account_id.to_string(),
                challenge: challenge.to_string(),
                redirect,
                issued_ms: now_ms,
                used: false,
            },
        );
        code
    }

    /// Checks and spends an authorization code; returns the account it logs in as.
    /// `issuer_callback` is `http://{issuer}/deviceauth/callback` as the request names the
    /// issuer (its `Host`).
    pub fn redeem(
        &mut self,
        code: &str,
        redirect_uri: &str,
        verifier: &str,
        issuer_callback: Option<&str>,
        now_ms: u64,
    ) -> Result<String, RedeemError> {
        let c = self
            .codes
            .iter_mut()
            .find(|c| c.code == code)
            .ok_or(RedeemError::Unknown)?;
        if c.used {
            return Err(RedeemError::Used);
        }
        if now_ms >= c.issued_ms.saturating_add(AUTH_CODE_TTL_MS) {
            return Err(RedeemError::Expired);
        }
        let redirect_ok = match &c.redirect {
            Redirect::DeviceCallback => {
                redirect_uri == DEVICE_REDIRECT_URI || Some(redirect_uri) == issuer_callback
            }
            Redirect::Exact(uri) => redirect_uri == uri,
        };
        if !redirect_ok {
            return Err(RedeemError::RedirectMismatch);
        }
        if pkce_challenge(verifier) != c.challenge {
            return Err(RedeemError::VerifierMismatch);
        }
        c.used = true;
        Ok(c.account_id.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_767_225_600_000;

    fn logins_with_code() -> (Logins, DeviceCode) {
        let mut l = Logins::default();
        let d = l.issue_device_code(NOW, "n0nce");
        (l, d)
    }

    #[test]
    fn device_codes_look_like_the_real_ones_and_differ() {
        let (mut l, d) = logins_with_code();
        assert!(d.device_auth_id.starts_with("deviceauth_"));
        assert_eq!(d.user_code.len(), 10);
        assert_eq!(d.user_code.as_bytes()[4], b'-');
        assert!(
            d.user_code
                .chars()
                .all(|c| c == '-' || USER_CODE_ALPHABET.contains(&(c as u8)))
        );
        assert_eq!((d.interval_secs, d.expires_at_ms), (5, NOW + 900_000));
        let e = l.issue_device_code(NOW, "n0nce");
        assert_ne!(d.device_auth_id, e.device_auth_id);
        assert_ne!(d.user_code, e.user_code);
    }

    #[test]
    fn polling_faster_than_the_interval_is_slow_down_within_a_grace() {
        let (mut l, d) = logins_with_code();
        let poll = |l: &mut Logins, at| l.poll(&d.device_auth_id, &d.user_code, at);
        assert_eq!(poll(&mut l, NOW), Some(PollAnswer::Pending));
        assert_eq!(poll(&mut l, NOW + 4_000), Some(PollAnswer::SlowDown));
        // Measured from the previous poll, the slow one included.
        assert_eq!(poll(&mut l, NOW + 8_000), Some(PollAnswer::SlowDown));
        assert_eq!(
            poll(&mut l, NOW + 13_000 - POLL_GRACE_MS),
            Some(PollAnswer::Pending)
        );
        assert_eq!(l.poll(&d.device_auth_id, "WRONG-CODE0", NOW), None);
    }

    #[test]
    fn only_a_pending_code_expires_and_only_it_can_be_approved() {
        let (mut l, d) = logins_with_code();
        let e = l.issue_device_code(NOW, "n0nce");
        l.approve(&e.user_code, "sim-acct-1", NOW, "n0nce").unwrap();
        let later = NOW + 900_000;
        assert_eq!(
            l.approve(&d.user_code, "sim-acct-1", later, "n0nce"),
            Err(LoginControlError::NotPending(DeviceCodeState::Expired))
        );
        let states: Vec<_> = l.device_codes(later).iter().map(|c| c.state).collect();
        assert_eq!(
            states,
            [DeviceCodeState::Expired, DeviceCodeState::Approved]
        );
        assert_eq!(
            l.deny("NOPE-NOPE0", NOW),
            Err(LoginControlError::UnknownUserCode("NOPE-NOPE0".into()))
        );
    }

    #[test]
    fn an_authorization_code_is_checked_then_spent_once() {
        let mut l = Logins::default();
        let verifier = "v".repeat(43);
        let redirect = "http://localhost:1455/auth/callback";
        let code = l.issue_code(
            "sim-acct-2",
            &pkce_challenge(&verifier),
            Redirect::Exact(redirect.into()),
            NOW,
            "n",
        );
        let mut redeem = |code: &str, uri: &str, v: &str, at: u64| l.redeem(code, uri, v, None, at);
        assert_eq!(
            redeem("ac_nope", redirect, &verifier, NOW),
            Err(RedeemError::Unknown)
        );
        assert_eq!(
            redeem(&code, DEVICE_REDIRECT_URI, &verifier, NOW),
            Err(RedeemError::RedirectMismatch)
        );
        assert_eq!(
            redeem(&code, redirect, "w", NOW),
            Err(RedeemError::VerifierMismatch)
        );
        assert_eq!(
            redeem(&code, redirect, &verifier, NOW + AUTH_CODE_TTL_MS),
            Err(RedeemError::Expired)
        );
        assert_eq!(
            redeem(&code, redirect, &verifier, NOW),
            Ok("sim-acct-2".into())
        );
        assert_eq!(
            redeem(&code, redirect, &verifier, NOW),
            Err(RedeemError::Used)
        );
    }

    #[test]
    fn a_device_code_redeems_at_either_device_callback() {
        let (mut l, d) = logins_with_code();
        let e = l.issue_device_code(NOW, "n0nce");
        let issuer = "http://127.0.0.1:9090/deviceauth/callback";
        for (code, uri) in [(&d, DEVICE_REDIRECT_URI), (&e, issuer)] {
            l.approve(&code.user_code, "sim-acct-1", NOW, "n").unwrap();
            let Some(PollAnswer::Approved(g)) = l.poll(&code.device_auth_id, &code.user_code, NOW)
            else {
                panic!("approved code did not answer its grant");
            };
            assert_eq!(pkce_challenge(&g.code_verifier), g.code_challenge);
            assert_eq!(g.code_verifier.len(), 86);
            assert_eq!(
                l.redeem(
                    &g.authorization_code,
                    uri,
                    &g.code_verifier,
                    Some(issuer),
                    NOW
                ),
                Ok("sim-acct-1".into())
            );
        }
    }
}
