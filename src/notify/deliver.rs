//! One message to one target: its shape for the target's kind, the send, and the retries.

use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Event, NotifyTarget, TargetKind};

/// The longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// One try's limit.
const TRY_TIMEOUT: Duration = Duration::from_secs(10);

/// The signature header of a webhook with a `secret`.
pub const SIGNATURE_HEADER: &str = "x-switchyard-signature";

/// The client deliveries use: straight out (never the upstream's egress proxy, which is for
/// the accounts), each try bounded.
pub fn client() -> reqwest::Client {
    crate::upstream::install_crypto_provider();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(TRY_TIMEOUT)
        .no_proxy()
        .build()
        .unwrap_or_default()
}

/// HMAC-SHA256 (RFC 2104) of `msg` under `key`, as lower-case hex.
pub fn hmac_sha256_hex(key: &[u8], msg: &[u8]) -> String {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| k.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    let outer = Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize();
    outer.iter().map(|b| format!("{b:02x}")).collect()
}

/// The webhook's JSON body: `event`, `at` (RFC 3339), `account`, `model`, `message`, and
/// the event's details.
pub fn webhook_body(event: &Event) -> Value {
    let mut body = json!({
        "event": event.kind.as_str(),
        "at": crate::base::clock::rfc3339(event.at_ms / 1000),
        "account": event.account,
        "model": event.model,
        "message": event.message,
        "source": "switchyard",
    });
    if let Some(obj) = body.as_object_mut() {
        for (k, v) in &event.details {
            obj.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    body
}

/// The message as plain text (ntfy, Telegram).
fn text(event: &Event) -> String {
    let mut t = format!("[{}] {}", event.kind.as_str(), event.message);
    if let Some(a) = &event.account {
        t.push_str(&format!("\naccount: {a}"));
    }
    if let Some(m) = &event.model {
        t.push_str(&format!("\nmodel: {m}"));
    }
    t
}

fn urgent(event: &Event) -> bool {
    matches!(
        event.kind,
        super::EventKind::AccountDeactivated | super::EventKind::PoolExhausted
    )
}

/// One try: `Ok` on a 2xx answer.
pub async fn send_once(
    client: &reqwest::Client,
    target: &NotifyTarget,
    event: &Event,
) -> Result<(), String> {
    let req = match target.kind {
        TargetKind::Webhook => {
            let body = webhook_body(event).to_string();
            let mut req = client
                .post(target.url.as_deref().unwrap_or_default())
                .header("content-type", "application/json")
                .header("x-switchyard-event", event.kind.as_str());
            if let Some(secret) = &target.secret {
                let sig = hmac_sha256_hex(secret.expose().as_bytes(), body.as_bytes());
                req = req.header(SIGNATURE_HEADER, format!("sha256={sig}"));
            }
            req.body(body)
        }
        TargetKind::Ntfy => {
            let mut req = client
                .post(target.url.as_deref().unwrap_or_default())
                .header("title", format!("Switchyard: {}", event.kind.as_str()))
                .header("tags", event.kind.as_str())
                .header("priority", if urgent(event) { "high" } else { "default" });
            if let Some(token) = &target.token {
                req = req.bearer_auth(token.expose());
            }
            req.body(text(event))
        }
        TargetKind::Telegram => {
            let token = target.bot_token.as_ref().map_or("", |t| t.expose());
            let url = format!(
                "{}/bot{token}/sendMessage",
                target.api_base.trim_end_matches('/')
            );
            client.post(url).json(&json!({
                "chat_id": target.chat_id,
                "text": text(event),
                "disable_web_page_preview": true,
            }))
        }
    };
    match req.send().await {
        // The bot token is in a Telegram URL: errors name the target, never the URL.
        Err(e) if e.is_timeout() => Err("no answer in time".into()),
        Err(e) if e.is_connect() => Err("cannot connect".into()),
        Err(_) => Err("the request failed".into()),
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("answered {}", r.status().as_u16())),
    }
}

/// Tries up to the target's `attempts`, waiting `backoff`, then twice as long each time.
pub async fn with_retries(
    client: &reqwest::Client,
    target: &NotifyTarget,
    name: &str,
    event: &Event,
) -> Result<(), String> {
    let mut wait = target.backoff;
    let mut last = String::new();
    for attempt in 1..=target.attempts.max(1) {
        match send_once(client, target, event).await {
            Ok(()) => {
                tracing::info!(
                    target = name,
                    event = event.kind.as_str(),
                    attempt,
                    "notification delivered"
                );
                return Ok(());
            }
            Err(why) => {
                tracing::debug!(target = name, event = event.kind.as_str(), attempt, error = %why, "notification not delivered");
                last = why;
            }
        }
        if attempt < target.attempts {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_BACKOFF);
        }
    }
    tracing::warn!(target = name, event = event.kind.as_str(), attempts = target.attempts, error = %last, "notification given up");
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_the_rfc_4231_vectors() {
        // Test case 2.
        assert_eq!(
            hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block.
        assert_eq!(
            hmac_sha256_hex(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            ),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn a_webhook_body_has_the_named_fields() {
        let e = Event::new(
            super::super::EventKind::PoolExhausted,
            1_767_225_600_000,
            "dry",
        )
        .model("gpt-5.5")
        .detail("reason", "quota");
        let b = webhook_body(&e);
        assert_eq!(b["event"], "pool_exhausted");
        assert_eq!(b["at"], "2026-01-01T00:00:00Z");
        assert_eq!(b["model"], "gpt-5.5");
        assert_eq!(b["account"], Value::Null);
        assert_eq!(b["message"], "dry");
        assert_eq!(b["reason"], "quota");
    }
}
