//! The header policy: which of a client's request headers go on to the backend, and which of
//! the backend's answer headers come back. Everything crosses, both ways, except what this one
//! table holds back, each row with its reason — so a header a newer Codex starts to send (or
//! the backend starts to answer) reaches the other side without a change here.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

/// Why a header does not cross as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Meant for one connection only (RFC 9110 §7.6.1), or for the WebSocket handshake of the
    /// client's own connection.
    HopByHop,
    /// The client's credentials towards the gateway, or an account choice the gateway makes.
    Credential,
    /// Names the client's device or the account: the gateway sets the account's own.
    Identity,
    /// Describes the body as the client framed it; the gateway frames what it sends itself.
    Framing,
    /// Decided by the gateway for the hop it makes (what it accepts, the turn-state token).
    Gateway,
    /// Says where the client is (its address, the proxies it came through): a pool must not
    /// link its accounts by their users' addresses.
    Origin,
    /// A cookie the backend sets is for its own origin, not the gateway's clients.
    Cookie,
}

/// The request headers held back, and why. Matched by name, case-insensitively (header names
/// are lowercase once parsed).
pub const REQUEST_HELD: &[(&str, Held)] = &[
    ("connection", Held::HopByHop),
    ("keep-alive", Held::HopByHop),
    ("proxy-connection", Held::HopByHop),
    ("proxy-authenticate", Held::HopByHop),
    ("proxy-authorization", Held::HopByHop),
    ("te", Held::HopByHop),
    ("trailer", Held::HopByHop),
    ("transfer-encoding", Held::HopByHop),
    ("upgrade", Held::HopByHop),
    ("sec-websocket-key", Held::HopByHop),
    ("sec-websocket-version", Held::HopByHop),
    ("sec-websocket-extensions", Held::HopByHop),
    ("sec-websocket-protocol", Held::HopByHop),
    ("authorization", Held::Credential),
    ("cookie", Held::Credential),
    ("x-api-key", Held::Credential),
    ("chatgpt-account-id", Held::Credential),
    ("openai-organization", Held::Credential),
    ("openai-project", Held::Credential),
    ("x-codex-installation-id", Held::Identity),
    ("x-openai-account-routing-override", Held::Identity),
    ("host", Held::Framing),
    ("content-length", Held::Framing),
    ("content-encoding", Held::Framing),
    ("content-type", Held::Framing),
    ("expect", Held::Framing),
    ("accept", Held::Gateway),
    ("accept-encoding", Held::Gateway),
    ("x-codex-turn-state", Held::Gateway),
    ("forwarded", Held::Origin),
    ("via", Held::Origin),
    ("x-forwarded-for", Held::Origin),
    ("x-forwarded-host", Held::Origin),
    ("x-forwarded-port", Held::Origin),
    ("x-forwarded-proto", Held::Origin),
    ("x-real-ip", Held::Origin),
    ("true-client-ip", Held::Origin),
    ("cf-connecting-ip", Held::Origin),
];

/// The answer headers held back, and why.
pub const ANSWER_HELD: &[(&str, Held)] = &[
    ("connection", Held::HopByHop),
    ("keep-alive", Held::HopByHop),
    ("proxy-authenticate", Held::HopByHop),
    ("proxy-connection", Held::HopByHop),
    ("te", Held::HopByHop),
    ("trailer", Held::HopByHop),
    ("transfer-encoding", Held::HopByHop),
    ("upgrade", Held::HopByHop),
    ("sec-websocket-accept", Held::HopByHop),
    ("sec-websocket-extensions", Held::HopByHop),
    ("sec-websocket-protocol", Held::HopByHop),
    ("set-cookie", Held::Cookie),
    ("content-length", Held::Framing),
    ("content-encoding", Held::Framing),
    ("content-type", Held::Framing),
    // The gateway's own server writes these for its answer.
    ("date", Held::Framing),
    ("server", Held::Framing),
    // The backend's origin's own advertisements (another protocol, its HSTS) are not true of
    // the gateway's address.
    ("alt-svc", Held::Framing),
    ("strict-transport-security", Held::Framing),
];

/// Why `name` is held back on its way upstream, if it is.
pub fn request_held(name: &HeaderName) -> Option<Held> {
    held(REQUEST_HELD, name)
}

/// Why `name` is held back on its way to the client, if it is.
pub fn answer_held(name: &HeaderName) -> Option<Held> {
    held(ANSWER_HELD, name)
}

fn held(table: &[(&str, Held)], name: &HeaderName) -> Option<Held> {
    let name = name.as_str();
    table.iter().find(|(n, _)| *n == name).map(|(_, why)| *why)
}

/// The names a `Connection` header lists: hop-by-hop for this message too.
fn connection_listed(h: &HeaderMap) -> Vec<String> {
    h.get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect()
}

/// The client's headers that go upstream, in the order they came.
pub fn forwarded(h: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    crossing(h, request_held)
}

/// The backend's answer headers that go to the client (HTTP answers and the WebSocket
/// upgrade's alike).
pub fn relayed(h: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    crossing(h, answer_held)
}

fn crossing(
    h: &HeaderMap,
    held: fn(&HeaderName) -> Option<Held>,
) -> Vec<(HeaderName, HeaderValue)> {
    let listed = connection_listed(h);
    h.iter()
        .filter(|(k, _)| held(k).is_none() && !listed.iter().any(|l| l == k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn names(v: &[(HeaderName, HeaderValue)]) -> Vec<&str> {
        v.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn every_request_header_goes_upstream_but_what_the_table_holds() {
        let h = map(&[
            ("authorization", "Bearer sk-sy-client"),
            ("chatgpt-account-id", "the-clients-own"),
            ("cookie", "a=b"),
            (
                "x-codex-installation-id",
                "11111111-2222-3333-4444-555555555555",
            ),
            ("content-length", "12"),
            ("content-encoding", "zstd"),
            ("accept-encoding", "zstd,gzip"),
            ("x-codex-turn-state", "ts"),
            ("x-forwarded-for", "203.0.113.7"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "only this hop"),
            ("x-codex-routing-hint", "model=gpt-5.5;tier=ultrafast"),
            ("x-openai-internal-codex-responses-lite", "1"),
            ("x-codex-guardian", "reviewer"),
            ("x-responsesapi-include-timing-metrics", "true"),
            ("x-openai-product-sku", "codex"),
            ("x-openai-internal-tool-call-id", "call_1"),
            ("x-codex-turn-metadata", "{\"installation_id\":\"x\"}"),
            ("session-id", "s"),
            ("user-agent", "codex_exec/0.171.0"),
            ("x-something-new", "v"),
        ]);
        assert_eq!(
            names(&forwarded(&h)),
            vec![
                "x-codex-routing-hint",
                "x-openai-internal-codex-responses-lite",
                "x-codex-guardian",
                "x-responsesapi-include-timing-metrics",
                "x-openai-product-sku",
                "x-openai-internal-tool-call-id",
                "x-codex-turn-metadata",
                "session-id",
                "user-agent",
                "x-something-new",
            ]
        );
    }

    #[test]
    fn every_answer_header_comes_back_but_what_the_table_holds() {
        let h = map(&[
            ("content-type", "text/event-stream"),
            ("content-length", "10"),
            ("transfer-encoding", "chunked"),
            ("set-cookie", "__cf_bm=x; Domain=chatgpt.com"),
            ("date", "Tue, 01 Dec 2026 00:00:00 GMT"),
            ("x-codex-primary-used-percent", "12"),
            ("x-reasoning-included", "true"),
            ("openai-model", "gpt-5.5"),
            ("x-models-etag", "e"),
            ("x-codex-websocket-max-message-bytes", "16777216"),
            ("x-request-id", "req_1"),
            ("x-codex-something-new", "v"),
        ]);
        assert_eq!(
            names(&relayed(&h)),
            vec![
                "x-codex-primary-used-percent",
                "x-reasoning-included",
                "openai-model",
                "x-models-etag",
                "x-codex-websocket-max-message-bytes",
                "x-request-id",
                "x-codex-something-new",
            ]
        );
    }

    #[test]
    fn the_tables_name_each_header_once_in_lowercase() {
        for table in [REQUEST_HELD, ANSWER_HELD] {
            for (i, (name, _)) in table.iter().enumerate() {
                assert_eq!(*name, name.to_ascii_lowercase());
                assert!(HeaderName::from_bytes(name.as_bytes()).is_ok(), "{name}");
                assert!(
                    table[i + 1..].iter().all(|(n, _)| n != name),
                    "{name} twice"
                );
            }
        }
    }
}
