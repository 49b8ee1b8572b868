//! Logging an account in the way Codex CLI does (`../shared/codex-protocol.md` §J1, §J2): the
//! device-code flow (a code the operator enters on another machine's browser) and the PKCE
//! browser flow (an authorize URL; the final redirect URL comes back by the local callback or
//! pasted by hand). Both end in the authorization-code exchange at the token endpoint. Nothing
//! here stores anything: the caller imports the tokens in one write at the end.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::base::urlcode;

/// Codex's device codes live 15 minutes; polling stops then.
pub const DEVICE_CODE_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// The port Codex's browser login listens on, and the redirect registered for it.
pub const CALLBACK_PORT: u16 = 1455;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LoginError {
    #[error("device-code login is not enabled for {0} (404)")]
    NotEnabled(String),
    #[error("the login was denied")]
    Denied,
    #[error("the device code expired before the login was approved; run the command again")]
    Expired,
    #[error("the browser login failed: {0}")]
    Callback(String),
    #[error("{0}")]
    Transport(String),
    #[error("unexpected answer from {what}: {detail}")]
    Answer { what: String, detail: String },
}

/// A device code to show the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCode {
    pub device_auth_id: String,
    pub user_code: String,
    /// How often to poll, as the server said.
    pub interval: Duration,
    /// Where the operator enters the code.
    pub verification_url: String,
}

/// The tokens of a new login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginTokens {
    pub id_token: String,
    pub access_token: String,
    pub refresh_token: String,
}

impl LoginTokens {
    /// The login as a Codex `auth.json` (what the import path reads).
    pub fn auth_json(&self, now_secs: u64) -> Value {
        json!({
            "auth_mode": "chatgpt",
            "OPENAI_API_KEY": null,
            "tokens": {
                "id_token": self.id_token,
                "access_token": self.access_token,
                "refresh_token": self.refresh_token,
            },
            "last_refresh": crate::base::clock::rfc3339(now_secs),
        })
    }
}

fn transport(e: reqwest::Error) -> LoginError {
    LoginError::Transport(e.to_string())
}

fn base(auth_base: &str) -> &str {
    auth_base.trim_end_matches('/')
}

/// The error code of an auth-server answer: `{"error":{"code"}}`, `{"error":"…"}` or `{"code"}`.
fn error_code(v: &Value) -> Option<&str> {
    v["error"]["code"]
        .as_str()
        .or_else(|| v["error"].as_str())
        .or_else(|| v["code"].as_str())
}

/// Step 1: asks for a device code.
pub async fn request_device_code(
    http: &reqwest::Client,
    auth_base: &str,
    client_id: &str,
) -> Result<DeviceCode, LoginError> {
    let url = format!("{}/api/accounts/deviceauth/usercode", base(auth_base));
    let resp = http
        .post(&url)
        .json(&json!({ "client_id": client_id }))
        .send()
        .await
        .map_err(transport)?;
    let status = resp.status().as_u16();
    if status == 404 {
        return Err(LoginError::NotEnabled(base(auth_base).to_string()));
    }
    let text = resp.text().await.map_err(transport)?;
    let bad = |detail: String| LoginError::Answer {
        what: url.clone(),
        detail,
    };
    if !(200..300).contains(&status) {
        return Err(bad(format!("{status} {text}")));
    }
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let s = |k: &str| v[k].as_str().filter(|s| !s.is_empty()).map(str::to_string);
    let (Some(device_auth_id), Some(user_code)) = (
        s("device_auth_id"),
        s("user_code").or_else(|| s("usercode")),
    ) else {
        return Err(bad(format!("no device_auth_id or user_code in {text}")));
    };
    // A string of digits, as Codex reads it.
    let interval = s("interval")
        .and_then(|i| i.trim().parse::<u64>().ok())
        .unwrap_or(5);
    Ok(DeviceCode {
        device_auth_id,
        user_code,
        interval: Duration::from_secs(interval),
        verification_url: format!("{}/codex/device", base(auth_base)),
    })
}

/// Step 3: polls until the operator approves (then the authorization code and the PKCE
/// verifier the server made), denies, or the code expires. `slow_down` adds 5 s to the
/// interval; every other 403 or 404 means "not yet", as Codex reads them.
pub async fn poll_device_code(
    http: &reqwest::Client,
    auth_base: &str,
    code: &DeviceCode,
    deadline: Instant,
) -> Result<(String, String), LoginError> {
    let url = format!("{}/api/accounts/deviceauth/token", base(auth_base));
    let mut interval = code.interval;
    loop {
        tokio::time::sleep(interval).await;
        if Instant::now() >= deadline {
            return Err(LoginError::Expired);
        }
        let resp = http
            .post(&url)
            .json(&json!({"device_auth_id": code.device_auth_id, "user_code": code.user_code}))
            .send()
            .await
            .map_err(transport)?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(transport)?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        match status {
            200..=299 => {
                let s = |k: &str| v[k].as_str().filter(|s| !s.is_empty()).map(str::to_string);
                return match (s("authorization_code"), s("code_verifier")) {
                    (Some(c), Some(verifier)) => Ok((c, verifier)),
                    _ => Err(LoginError::Answer {
                        what: url,
                        detail: format!("no authorization_code or code_verifier in {text}"),
                    }),
                };
            }
            403 | 404 => match error_code(&v) {
                Some("slow_down") => interval += Duration::from_secs(5),
                Some("access_denied") => return Err(LoginError::Denied),
                Some("deviceauth_expired" | "expired_token") => return Err(LoginError::Expired),
                _ => {}
            },
            _ => {
                return Err(LoginError::Answer {
                    what: url,
                    detail: format!("{status} {text}"),
                });
            }
        }
    }
}

/// Step 4: the authorization code for tokens.
pub async fn exchange_code(
    http: &reqwest::Client,
    token_url: &str,
    client_id: &str,
    (code, redirect_uri, verifier): (&str, &str, &str),
) -> Result<LoginTokens, LoginError> {
    let form = [
        ("grant_type", "authorization_code"),
        ("code", code),
        ("redirect_uri", redirect_uri),
        ("client_id", client_id),
        ("code_verifier", verifier),
    ]
    .iter()
    .map(|(k, v)| format!("{k}={}", urlcode::encode(v)))
    .collect::<Vec<_>>()
    .join("&");
    let resp = http
        .post(token_url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .map_err(transport)?;
    let status = resp.status().as_u16();
    let text = resp.text().await.map_err(transport)?;
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let bad = |detail: String| LoginError::Answer {
        what: token_url.to_string(),
        detail,
    };
    if !(200..300).contains(&status) {
        let why = v["error_description"]
            .as_str()
            .or_else(|| v["error"]["message"].as_str())
            .unwrap_or(&text);
        return Err(bad(format!(
            "{status} {}: {why}",
            error_code(&v).unwrap_or("error")
        )));
    }
    let s = |k: &str| v[k].as_str().filter(|s| !s.is_empty()).map(str::to_string);
    match (s("id_token"), s("access_token"), s("refresh_token")) {
        (Some(id_token), Some(access_token), Some(refresh_token)) => Ok(LoginTokens {
            id_token,
            access_token,
            refresh_token,
        }),
        _ => Err(bad(
            "the answer lacks id_token, access_token or refresh_token".into(),
        )),
    }
}

/// The device flow's redirect URI: Codex sends the issuer's own callback.
pub fn device_redirect_uri(auth_base: &str) -> String {
    format!("{}/deviceauth/callback", base(auth_base))
}

fn random_b64(n: usize) -> Result<String, LoginError> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf).map_err(|e| LoginError::Transport(format!("no randomness: {e}")))?;
    Ok(URL_SAFE_NO_PAD.encode(buf))
}

/// A PKCE pair and a state, as Codex makes them: verifier = base64url of 64 random bytes,
/// challenge = base64url(SHA-256(verifier)), state = base64url of 32 random bytes.
#[derive(Debug, Clone)]
pub struct Pkce {
    pub verifier: String,
    pub challenge: String,
    pub state: String,
}

impl Pkce {
    pub fn new() -> Result<Pkce, LoginError> {
        let verifier = random_b64(64)?;
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
        Ok(Pkce {
            verifier,
            challenge,
            state: random_b64(32)?,
        })
    }

    /// The authorize URL the operator opens.
    pub fn authorize_url(&self, auth_base: &str, client_id: &str, redirect_uri: &str) -> String {
        let q: String = [
            ("response_type", "code"),
            ("client_id", client_id),
            ("redirect_uri", redirect_uri),
            ("scope", "openid profile email offline_access"),
            ("code_challenge", &self.challenge),
            ("code_challenge_method", "S256"),
            ("id_token_add_organizations", "true"),
            ("codex_cli_simplified_flow", "true"),
            ("state", &self.state),
            ("originator", "codex_cli_rs"),
        ]
        .iter()
        .map(|(k, v)| format!("{k}={}", urlcode::encode(v)))
        .collect::<Vec<_>>()
        .join("&");
        format!("{}/oauth/authorize?{q}", base(auth_base))
    }

    /// The authorization code from the final redirect URL (or just its query), checking the
    /// state; an `error` in it is the login's failure.
    pub fn code_from_redirect(&self, url: &str) -> Result<String, LoginError> {
        let query = url.split_once('?').map_or(url, |(_, q)| q);
        let query = query.split('#').next().unwrap_or_default();
        let param = |name: &str| {
            query.split('&').find_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                (k == name).then(|| urlcode::decode(v, true).unwrap_or_else(|| v.to_string()))
            })
        };
        if let Some(e) = param("error") {
            let why = param("error_description").unwrap_or_default();
            return Err(if e == "access_denied" {
                LoginError::Denied
            } else {
                LoginError::Callback(format!("{e}: {why}"))
            });
        }
        if param("state").as_deref() != Some(self.state.as_str()) {
            return Err(LoginError::Callback(
                "the redirect's state does not match this login (an old or foreign URL)".into(),
            ));
        }
        param("code")
            .filter(|c| !c.is_empty())
            .ok_or_else(|| LoginError::Callback("the redirect URL has no code".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkce_pairs_match_and_redirects_are_checked() {
        let p = Pkce::new().unwrap();
        assert_eq!(p.verifier.len(), 86);
        assert_eq!(
            p.challenge,
            URL_SAFE_NO_PAD.encode(Sha256::digest(p.verifier.as_bytes()))
        );
        let url = p.authorize_url(
            "https://auth.example/",
            "cid",
            "http://localhost:1455/auth/callback",
        );
        assert!(url.starts_with("https://auth.example/oauth/authorize?response_type=code&client_id=cid&redirect_uri=http%3A%2F%2Flocalhost%3A1455%2Fauth%2Fcallback&"), "{url}");
        assert!(url.contains(&format!("state={}", p.state)));
        assert!(url.contains("code_challenge_method=S256"));
        let ok = format!(
            "http://localhost:1455/auth/callback?code=ab%2Fc&state={}",
            p.state
        );
        assert_eq!(p.code_from_redirect(&ok).unwrap(), "ab/c");
        assert!(matches!(
            p.code_from_redirect("http://localhost:1455/auth/callback?code=x&state=other"),
            Err(LoginError::Callback(_))
        ));
        assert_eq!(
            p.code_from_redirect(&format!(
                "?error=access_denied&error_description=no&state={}",
                p.state
            )),
            Err(LoginError::Denied)
        );
    }
}
