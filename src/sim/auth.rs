//! Codex `auth.json` files for simulated accounts: JWT-shaped tokens with the real claim
//! layout (unsigned: the simulator, like our importer, does not verify signatures).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

/// One simulated account's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSpec {
    pub email: String,
    pub chatgpt_account_id: String,
    pub chatgpt_user_id: String,
    pub plan: String,
    /// `exp` of the access token, unix seconds.
    pub access_exp: u64,
    /// Distinguishes token generations (refresh rotates it).
    pub token_tag: String,
}

/// An unsigned JWT (`alg: none`) carrying `claims`.
pub fn jwt(claims: &Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    format!("{header}.{payload}.sig")
}

fn auth_claims(spec: &AuthSpec) -> Value {
    json!({
        "chatgpt_account_id": spec.chatgpt_account_id,
        "chatgpt_plan_type": spec.plan,
        "chatgpt_user_id": spec.chatgpt_user_id,
        "user_id": spec.chatgpt_user_id,
    })
}

pub fn id_token(spec: &AuthSpec) -> String {
    jwt(&json!({
        "iss": "https://auth.openai.com",
        "aud": ["app_EMoamEEZ73f0CkXaXp7hrann"],
        "email": spec.email,
        "email_verified": true,
        "exp": spec.access_exp,
        "https://api.openai.com/auth": auth_claims(spec),
    }))
}

pub fn access_token(spec: &AuthSpec) -> String {
    jwt(&json!({
        "iss": "https://auth.openai.com",
        "aud": ["https://api.openai.com/v1"],
        "exp": spec.access_exp,
        "jti": spec.token_tag,
        "https://api.openai.com/auth": auth_claims(spec),
        "https://api.openai.com/profile": {"email": spec.email},
    }))
}

pub fn refresh_token(spec: &AuthSpec) -> String {
    format!("rt_{}_{}", spec.chatgpt_account_id, spec.token_tag)
}

/// The auth.json Codex CLI writes after a ChatGPT login.
pub fn auth_json(spec: &AuthSpec) -> Value {
    json!({
        "auth_mode": "chatgpt",
        "OPENAI_API_KEY": null,
        "tokens": {
            "id_token": id_token(spec),
            "access_token": access_token(spec),
            "refresh_token": refresh_token(spec),
            "account_id": spec.chatgpt_account_id,
        },
        "last_refresh": "2026-11-30T10:11:12.123456Z",
    })
}
