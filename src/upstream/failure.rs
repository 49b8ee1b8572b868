//! Typed facts about a failed (or suspicious) upstream exchange. Transports produce them;
//! `fleet::health` is the only place that decides what they mean.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::base::names::named;

named! {
    /// Where in the exchange a failure happened.
    pub enum Phase {
        /// Opening the connection (DNS, TCP, TLS).
        Connect => "connect",
        /// Connected, waiting for the response headers.
        PreHeaders => "pre_headers",
        /// Headers received, nothing delivered to the client yet.
        PreCommit => "pre_commit",
        /// After the first event the client renders: nothing can be replayed.
        MidStream => "mid_stream",
    }
}

named! {
    /// Which of the backend's endpoints answered.
    #[derive(Default)]
    pub enum Endpoint {
        /// `POST /responses` (and `/responses/compact`).
        #[default]
        Responses => "responses",
        /// The Responses WebSocket: its handshake or its frames.
        WebSocket => "websocket",
        /// The OAuth token endpoint (refresh).
        Token => "token",
        /// `wham/usage`.
        Usage => "usage",
        /// `GET /models`.
        Models => "models",
        /// `wham/rate-limit-reset-credits` (the list, or a consume).
        Credits => "credits",
    }
}

/// What we know about one failed attempt.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub endpoint: Endpoint,
    pub phase: Option<Phase>,
    /// HTTP status, when one arrived (200 for a failure event inside a stream).
    pub status: Option<u16>,
    pub error_type: Option<String>,
    pub error_code: Option<String>,
    pub message: Option<String>,
    pub retry_after: Option<Duration>,
    /// Unix seconds at which a quota window resets.
    pub resets_at: Option<u64>,
    pub resets_in_seconds: Option<u64>,
    /// The length of the usage window a limit is over, when the answer says it (minutes).
    pub limit_window_minutes: Option<u64>,
    /// A Cloudflare challenge (header `cf-mitigated` or an HTML body on a 403).
    pub cloudflare: bool,
    /// A transport failure (connect error, reset, timeout, EOF) described for the operator.
    pub transport: Option<String>,
    /// The upstream body, kept for caller errors that are returned as they are.
    pub body: Option<Bytes>,
    pub content_type: Option<String>,
    /// The access token was refreshed just before this exchange.
    pub after_refresh: bool,
    /// The answer's headers (lower-case names), for operators' rules.
    pub headers: Vec<(String, String)>,
}

/// The longest `Retry-After` (or "try again in …") honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

impl Facts {
    /// The same facts, from another endpoint.
    pub fn at(mut self, endpoint: Endpoint) -> Facts {
        self.endpoint = endpoint;
        self
    }

    /// A usage document that shows a window still used up: the account's quota is exhausted
    /// until `resets_at` (unix seconds), as if the backend had answered `usage_limit_reached`.
    pub fn usage_exhausted(resets_at: Option<u64>) -> Facts {
        Facts {
            endpoint: Endpoint::Usage,
            phase: Some(Phase::PreCommit),
            status: Some(200),
            error_type: Some("usage_limit_reached".into()),
            message: Some("usage still exhausted".into()),
            resets_at,
            ..Facts::default()
        }
    }

    pub fn transport(phase: Phase, what: impl Into<String>) -> Facts {
        Facts {
            phase: Some(phase),
            transport: Some(what.into()),
            ..Facts::default()
        }
    }

    /// Facts of a non-2xx response.
    pub fn from_response(status: u16, headers: &HeaderMap, body: Bytes) -> Facts {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let content_type = header("content-type");
        let is_html = content_type
            .as_deref()
            .is_some_and(|c| c.contains("text/html"))
            || body.trim_ascii_start().starts_with(b"<");
        let mut f = Facts {
            phase: Some(Phase::PreCommit),
            status: Some(status),
            retry_after: header("retry-after")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER)),
            cloudflare: headers.contains_key("cf-mitigated") || (status == 403 && is_html),
            content_type,
            ..Facts::default()
        };
        if let Ok(v) = serde_json::from_slice::<Value>(&body) {
            f.absorb_error_json(&v);
        } else if !body.is_empty() && !is_html {
            f.message = Some(String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned());
        }
        f.body = Some(body);
        f.headers = headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        f
    }

    /// Facts of a `response.failed` or `error` event inside a 200 stream.
    pub fn from_event(phase: Phase, event: &Value) -> Facts {
        let mut f = Facts {
            phase: Some(phase),
            status: event["status"]
                .as_u64()
                .and_then(|s| u16::try_from(s).ok())
                .or(Some(200)),
            ..Facts::default()
        };
        if event["response"]["error"].is_object() {
            f.absorb_error_object(&event["response"]["error"]);
        } else {
            f.absorb_error_json(event);
        }
        // A streamed error may carry its answer's headers (a WebSocket error frame does).
        if let Some(headers) = event["headers"].as_object()
            && let Some(secs) = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("retry-after"))
                .and_then(|(_, v)| seconds(v))
        {
            f.retry_after = Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER));
        }
        f
    }

    /// Reads `{"error": {...}}`, `{"detail": "..."}` or `{"error": "code", ...}` shapes.
    fn absorb_error_json(&mut self, v: &Value) {
        match &v["error"] {
            Value::Object(_) => self.absorb_error_object(&v["error"]),
            Value::String(code) => {
                self.error_code = Some(code.clone());
                self.message = v["error_description"]
                    .as_str()
                    .or(v["message"].as_str())
                    .map(str::to_string);
            }
            _ => {}
        }
        if self.message.is_none() {
            self.message = match &v["detail"] {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("message").and_then(Value::as_str).map(str::to_string),
                _ => None,
            };
            if let Some(code) = v["detail"]["code"].as_str() {
                self.error_code.get_or_insert(code.to_string());
            }
        }
    }

    fn absorb_error_object(&mut self, e: &Value) {
        let s = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
        self.error_type = s(&e["type"]).or(self.error_type.take());
        self.error_code = s(&e["code"]).or(self.error_code.take());
        self.message = s(&e["message"]).or(self.message.take());
        self.resets_at = e["resets_at"].as_u64().or(self.resets_at);
        self.resets_in_seconds = e["resets_in_seconds"].as_u64().or(self.resets_in_seconds);
        self.limit_window_minutes = e["limit_window_minutes"]
            .as_u64()
            .or(self.limit_window_minutes);
        if self.retry_after.is_none()
            && let Some(secs) = ["retry_after", "retry_after_seconds"]
                .iter()
                .find_map(|k| seconds(&e[*k]))
                .or_else(|| self.message.as_deref().and_then(retry_hint))
        {
            self.retry_after = Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER));
        }
    }

    /// Whether the answer asks to be tried again later: a transport failure, a 429 or a 5xx.
    pub fn asks_to_retry_later(&self) -> bool {
        self.status.is_none_or(|s| s == 429 || s >= 500)
    }

    /// A short description for records and logs.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        match self.endpoint {
            Endpoint::Responses | Endpoint::WebSocket => {}
            Endpoint::Token => parts.push("token refresh:".to_string()),
            Endpoint::Usage => parts.push("usage probe:".to_string()),
            Endpoint::Credits => parts.push("reset credits:".to_string()),
            Endpoint::Models => parts.push("models:".to_string()),
        }
        if let Some(s) = self.status {
            parts.push(s.to_string());
        }
        if let Some(c) = self.error_code.as_deref().or(self.error_type.as_deref()) {
            parts.push(c.to_string());
        }
        if self.cloudflare {
            parts.push("cloudflare challenge".into());
        }
        if let Some(t) = &self.transport {
            parts.push(t.clone());
        } else if let Some(m) = &self.message {
            parts.push(m.chars().take(160).collect());
        }
        parts.join(" ")
    }
}

/// Whole seconds from a JSON number or numeric string (rounded up).
fn seconds(v: &Value) -> Option<u64> {
    let n = match v {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) => s.trim().parse::<f64>().ok()?,
        _ => return None,
    };
    (n.is_finite() && n >= 0.0).then(|| n.ceil() as u64)
}

/// "try again in 20s" / "Please try again in 1.5s" -> seconds (rounded up).
fn retry_hint(message: &str) -> Option<u64> {
    let lower = message.to_ascii_lowercase();
    let rest = &lower[lower.find("try again in ")? + "try again in ".len()..];
    let num: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let value: f64 = num.parse().ok()?;
    let unit = rest[num.len()..].trim_start();
    let secs = if unit.starts_with("ms") {
        value / 1000.0
    } else if unit.starts_with('m') {
        value * 60.0
    } else {
        value
    };
    Some(secs.ceil().max(1.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn reads_a_quota_429() {
        let body = br#"{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_at":1767225600,"resets_in_seconds":14400}}"#;
        let f = Facts::from_response(429, &headers(&[]), Bytes::from_static(body));
        assert_eq!(f.error_type.as_deref(), Some("usage_limit_reached"));
        assert_eq!(f.resets_in_seconds, Some(14400));
        assert_eq!(f.resets_at, Some(1_767_225_600));
    }

    #[test]
    fn a_streamed_error_carries_its_retry_after_and_window() {
        let frame = serde_json::json!({"type": "error", "status": 429,
            "error": {"type": "usage_limit_reached", "limit_window_minutes": 300},
            "headers": {"Retry-After": "40", "x-codex-primary-used-percent": "100"}});
        let f = Facts::from_event(Phase::PreHeaders, &frame);
        assert_eq!(f.status, Some(429));
        assert_eq!(f.retry_after, Some(Duration::from_secs(40)));
        assert_eq!(f.limit_window_minutes, Some(300));
        let failed = serde_json::json!({"type": "response.failed", "response": {"error":
            {"code": "rate_limit_exceeded", "message": "slow", "retry_after": 2.5}}});
        let f = Facts::from_event(Phase::PreCommit, &failed);
        assert_eq!(f.retry_after, Some(Duration::from_secs(3)));
    }

    #[test]
    fn reads_retry_after_from_header_or_message() {
        let f = Facts::from_response(
            429,
            &headers(&[("retry-after", "7")]),
            Bytes::from_static(b"{}"),
        );
        assert_eq!(f.retry_after, Some(Duration::from_secs(7)));
        let body = br#"{"error":{"code":"rate_limit_exceeded","message":"Rate limit reached. Please try again in 1.5s."}}"#;
        let f = Facts::from_response(429, &headers(&[]), Bytes::from_static(body));
        assert_eq!(f.retry_after, Some(Duration::from_secs(2)));
    }

    #[test]
    fn retry_after_is_capped_at_seven_days() {
        let f = Facts::from_response(
            429,
            &headers(&[("retry-after", "99999999999")]),
            Bytes::new(),
        );
        assert_eq!(f.retry_after, Some(MAX_RETRY_AFTER));
        let body = br#"{"error":{"message":"Please try again in 99999999999s."}}"#;
        let f = Facts::from_response(429, &headers(&[]), Bytes::from_static(body));
        assert_eq!(f.retry_after, Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn spots_cloudflare_challenges() {
        let f = Facts::from_response(
            403,
            &headers(&[("content-type", "text/html")]),
            Bytes::from_static(b"<html>Just a moment</html>"),
        );
        assert!(f.cloudflare);
        let f = Facts::from_response(
            403,
            &headers(&[("cf-mitigated", "challenge")]),
            Bytes::new(),
        );
        assert!(f.cloudflare);
        let f = Facts::from_response(
            403,
            &headers(&[]),
            Bytes::from_static(br#"{"error":{"code":"account_deactivated"}}"#),
        );
        assert!(!f.cloudflare);
    }

    #[test]
    fn reads_detail_bodies_and_failed_events() {
        let f = Facts::from_response(400, &headers(&[]), Bytes::from_static(br#"{"detail":"The 'x' model is not supported when using Codex with a ChatGPT account."}"#));
        assert!(f.message.unwrap().contains("not supported"));
        let ev: Value = serde_json::from_str(r#"{"type":"response.failed","response":{"id":"r","status":"failed","error":{"code":"server_is_overloaded","message":"busy"}}}"#).unwrap();
        let f = Facts::from_event(Phase::PreCommit, &ev);
        assert_eq!(
            (f.status, f.error_code.as_deref()),
            (Some(200), Some("server_is_overloaded"))
        );
        let ev: Value = serde_json::from_str(r#"{"type":"error","status":429,"error":{"type":"usage_limit_reached","resets_in_seconds":60}}"#).unwrap();
        let f = Facts::from_event(Phase::PreCommit, &ev);
        assert_eq!((f.status, f.resets_in_seconds), (Some(429), Some(60)));
    }
}
