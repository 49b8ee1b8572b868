//! Codex `auth.json` files and the claims inside their JWTs.
//!
//! We are not the token verifier (the backend is): the JWT payload is decoded without checking
//! its signature, only to learn the account id, email, plan and expiry.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::Value;

use crate::store::records::AccountSecrets;
use crate::store::secrets::Secret;

/// Claims namespace of ChatGPT tokens.
const AUTH_CLAIMS: &str = "https://api.openai.com/auth";
const PROFILE_CLAIMS: &str = "https://api.openai.com/profile";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthFileError {
    #[error("not a JSON auth file: {0}")]
    NotJson(String),
    #[error("has no ChatGPT tokens (`tokens` is missing or null; API-key logins cannot be pooled)")]
    NoTokens,
    #[error("`tokens.{0}` is missing or empty")]
    MissingToken(&'static str),
    #[error("`tokens.id_token` cannot be decoded: {0}")]
    BadIdToken(String),
    #[error(
        "no ChatGPT account id (neither `tokens.account_id` nor the id_token's chatgpt_account_id)"
    )]
    NoAccountId,
    /// Only an access token (a workspace's `at-…` token): whose it is, the auth server says.
    #[error("holds only an access token; it must be validated with the auth server")]
    AccessTokenOnly(Secret),
    #[error("the access token is a FedRAMP workspace's, which is not supported")]
    FedRamp,
}

/// What an auth.json says about its account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedAuth {
    pub chatgpt_account_id: String,
    pub chatgpt_user_id: Option<String>,
    pub email: Option<String>,
    pub plan: Option<String>,
    pub secrets: AccountSecrets,
}

#[derive(Deserialize)]
struct AuthJson {
    tokens: Option<TokensJson>,
}

#[derive(Deserialize)]
struct TokensJson {
    id_token: Option<String>,
    access_token: Option<String>,
    refresh_token: Option<String>,
    account_id: Option<String>,
}

/// The claims of a JWT we care about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    pub email: Option<String>,
    pub chatgpt_account_id: Option<String>,
    pub chatgpt_user_id: Option<String>,
    pub plan: Option<String>,
    pub exp: Option<u64>,
}

/// Decodes a JWT's payload (no signature check).
pub fn decode_claims(jwt: &str) -> Result<Claims, String> {
    let mut parts = jwt.split('.');
    let (Some(_header), Some(payload), Some(_sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not a JWT (expected three dot-separated parts)".into());
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|e| format!("payload is not base64url: {e}"))?;
    let v: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("payload is not JSON: {e}"))?;
    if !v.is_object() {
        return Err("payload is not a JSON object".into());
    }
    let s = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
    let auth = &v[AUTH_CLAIMS];
    Ok(Claims {
        email: s(&v["email"]).or_else(|| s(&v[PROFILE_CLAIMS]["email"])),
        chatgpt_account_id: s(&auth["chatgpt_account_id"]),
        chatgpt_user_id: s(&auth["chatgpt_user_id"]).or_else(|| s(&auth["user_id"])),
        plan: s(&auth["chatgpt_plan_type"]),
        exp: v["exp"].as_u64(),
    })
}

/// Parses an auth.json; `now` (unix seconds) stamps when the tokens were obtained.
pub fn parse(bytes: &[u8], now: u64) -> Result<ParsedAuth, AuthFileError> {
    let file: AuthJson =
        serde_json::from_slice(bytes).map_err(|e| AuthFileError::NotJson(e.to_string()))?;
    let tokens = file.tokens.ok_or(AuthFileError::NoTokens)?;
    let need = |v: Option<String>, name| {
        v.filter(|s| !s.is_empty())
            .ok_or(AuthFileError::MissingToken(name))
    };
    let access = need(tokens.access_token, "access_token")?;
    let no_refresh = tokens.refresh_token.as_deref().is_none_or(str::is_empty);
    let no_id = tokens.id_token.as_deref().is_none_or(str::is_empty);
    if no_refresh && no_id {
        return Err(AuthFileError::AccessTokenOnly(Secret::new(access)));
    }
    let refresh = need(tokens.refresh_token, "refresh_token")?;
    let id_token = need(tokens.id_token, "id_token")?;
    let claims = decode_claims(&id_token).map_err(AuthFileError::BadIdToken)?;
    // The access token is a JWT for the real backend; if it is not, we just do not know its
    // expiry and refresh when the backend says it expired.
    let access_claims = decode_claims(&access).ok();
    let chatgpt_account_id = tokens
        .account_id
        .filter(|s| !s.is_empty())
        .or(claims.chatgpt_account_id.clone())
        .ok_or(AuthFileError::NoAccountId)?;
    Ok(ParsedAuth {
        chatgpt_account_id,
        chatgpt_user_id: claims.chatgpt_user_id,
        email: claims.email,
        plan: claims
            .plan
            .or_else(|| access_claims.as_ref().and_then(|c| c.plan.clone())),
        secrets: AccountSecrets {
            access_token: Secret::new(access),
            refresh_token: Secret::new(refresh),
            id_token: Secret::new(id_token),
            access_expires_at: access_claims.and_then(|c| c.exp),
            refreshed_at: now,
            replaced: Vec::new(),
        },
    })
}

/// The login of a workspace access token, with the account its auth server's whoami named:
/// no refresh token and no id token (it is never refreshed), its expiry when the token says it.
pub fn from_whoami(
    access: Secret,
    who: &crate::upstream::Whoami,
    now: u64,
) -> Result<ParsedAuth, AuthFileError> {
    if who.chatgpt_account_is_fedramp {
        return Err(AuthFileError::FedRamp);
    }
    if who.chatgpt_account_id.is_empty() {
        return Err(AuthFileError::NoAccountId);
    }
    let exp = decode_claims(access.expose()).ok().and_then(|c| c.exp);
    Ok(ParsedAuth {
        chatgpt_account_id: who.chatgpt_account_id.clone(),
        chatgpt_user_id: who.chatgpt_user_id.clone().filter(|u| !u.is_empty()),
        email: who.email.clone().filter(|e| !e.is_empty()),
        plan: who.chatgpt_plan_type.clone().filter(|p| !p.is_empty()),
        secrets: AccountSecrets {
            access_token: access,
            refresh_token: Secret::new(String::new()),
            id_token: Secret::new(String::new()),
            access_expires_at: exp,
            refreshed_at: now,
            replaced: Vec::new(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::auth::{AuthSpec, auth_json, jwt};

    fn spec() -> AuthSpec {
        AuthSpec {
            email: "dev@example.com".into(),
            chatgpt_account_id: "acc-123".into(),
            chatgpt_user_id: "user-1".into(),
            plan: "plus".into(),
            access_exp: 2_000_000_000,
            token_tag: "t1".into(),
        }
    }

    #[test]
    fn reads_claims_and_tokens_of_a_codex_auth_file() {
        let p = parse(auth_json(&spec()).to_string().as_bytes(), 7).unwrap();
        assert_eq!(p.chatgpt_account_id, "acc-123");
        assert_eq!(p.chatgpt_user_id.as_deref(), Some("user-1"));
        assert_eq!(p.email.as_deref(), Some("dev@example.com"));
        assert_eq!(p.plan.as_deref(), Some("plus"));
        assert_eq!(p.secrets.access_expires_at, Some(2_000_000_000));
        assert_eq!(p.secrets.refreshed_at, 7);
        assert!(p.secrets.refresh_token.expose().contains("t1"));
    }

    #[test]
    fn rejects_non_json_missing_tokens_and_bad_id_tokens() {
        assert!(matches!(parse(b"hello", 0), Err(AuthFileError::NotJson(_))));
        assert_eq!(
            parse(
                br#"{"auth_mode":"apikey","OPENAI_API_KEY":"sk-x","tokens":null}"#,
                0
            ),
            Err(AuthFileError::NoTokens)
        );
        let mut v = auth_json(&spec());
        v["tokens"]["refresh_token"] = Value::Null;
        assert_eq!(
            parse(v.to_string().as_bytes(), 0),
            Err(AuthFileError::MissingToken("refresh_token"))
        );
        let mut v = auth_json(&spec());
        v["tokens"]["id_token"] = "abc.%%%.def".into();
        assert!(matches!(
            parse(v.to_string().as_bytes(), 0),
            Err(AuthFileError::BadIdToken(_))
        ));
        let mut v = auth_json(&spec());
        v["tokens"]["id_token"] = "only-one-part".into();
        assert!(matches!(
            parse(v.to_string().as_bytes(), 0),
            Err(AuthFileError::BadIdToken(_))
        ));
    }

    #[test]
    fn account_id_falls_back_to_the_id_token_claim() {
        let mut v = auth_json(&spec());
        v["tokens"]["account_id"] = Value::Null;
        assert_eq!(
            parse(v.to_string().as_bytes(), 0)
                .unwrap()
                .chatgpt_account_id,
            "acc-123"
        );
        let bare = serde_json::json!({"tokens": {
            "id_token": jwt(&serde_json::json!({"email": "x@y"})),
            "access_token": "a", "refresh_token": "r"}});
        assert_eq!(
            parse(bare.to_string().as_bytes(), 0),
            Err(AuthFileError::NoAccountId)
        );
    }
}
