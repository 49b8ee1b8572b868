//! The header policy: which of a client's request headers go on to the backend, and which of
//! the backend's answer headers come back. Everything crosses, both ways, except what this one
//! table holds back, each row with its reason — so a header a newer Codex starts to send (or
//! the backend starts to answer) reaches the other side without a change here.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

/// A table of held headers and its lookup, made from one list: the lookup is a `match` on the
/// name (compiled to a switch on its length and a comparison or two, where a scan of the table
/// compared each row), the table what the documentation and the tests read.
macro_rules! held_headers {
    (
        $(#[$table_doc:meta])* $table:ident,
        $(#[$lookup_doc:meta])* $lookup:ident,
        [$(($name:literal, $why:ident)),* $(,)?]
    ) => {
        $(#[$table_doc])*
        pub const $table: &[(&str, Held)] = &[$(($name, Held::$why)),*];

        $(#[$lookup_doc])*
        pub fn $lookup(name: &HeaderName) -> Option<Held> {
            match name.as_str() {
                $($name => Some(Held::$why),)*
                _ => None,
            }
        }
    };
}

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

held_headers!(
    /// The request headers held back, and why. Matched by name, case-insensitively (header
    /// names are lowercase once parsed).
    REQUEST_HELD,
    /// Why `name` is held back on its way upstream, if it is.
    request_held,
    [
        ("connection", HopByHop),
        ("keep-alive", HopByHop),
        ("proxy-connection", HopByHop),
        ("proxy-authenticate", HopByHop),
        ("proxy-authorization", HopByHop),
        ("te", HopByHop),
        ("trailer", HopByHop),
        ("transfer-encoding", HopByHop),
        ("upgrade", HopByHop),
        ("sec-websocket-key", HopByHop),
        ("sec-websocket-version", HopByHop),
        ("sec-websocket-extensions", HopByHop),
        ("sec-websocket-protocol", HopByHop),
        ("authorization", Credential),
        ("cookie", Credential),
        ("x-api-key", Credential),
        ("chatgpt-account-id", Credential),
        ("openai-organization", Credential),
        ("openai-project", Credential),
        ("x-codex-installation-id", Identity),
        ("x-openai-account-routing-override", Identity),
        ("host", Framing),
        ("content-length", Framing),
        ("content-encoding", Framing),
        ("content-type", Framing),
        ("expect", Framing),
        ("accept", Gateway),
        ("accept-encoding", Gateway),
        ("x-codex-turn-state", Gateway),
        ("forwarded", Origin),
        ("via", Origin),
        ("x-forwarded-for", Origin),
        ("x-forwarded-host", Origin),
        ("x-forwarded-port", Origin),
        ("x-forwarded-proto", Origin),
        ("x-real-ip", Origin),
        ("true-client-ip", Origin),
        ("cf-connecting-ip", Origin),
    ]
);

held_headers!(
    /// The answer headers held back, and why.
    ANSWER_HELD,
    /// Why `name` is held back on its way to the client, if it is.
    answer_held,
    [
        ("connection", HopByHop),
        ("keep-alive", HopByHop),
        ("proxy-authenticate", HopByHop),
        ("proxy-connection", HopByHop),
        ("te", HopByHop),
        ("trailer", HopByHop),
        ("transfer-encoding", HopByHop),
        ("upgrade", HopByHop),
        ("sec-websocket-accept", HopByHop),
        ("sec-websocket-extensions", HopByHop),
        ("sec-websocket-protocol", HopByHop),
        ("set-cookie", Cookie),
        ("content-length", Framing),
        ("content-encoding", Framing),
        ("content-type", Framing),
        // The gateway's own server writes these for its answer.
        ("date", Framing),
        ("server", Framing),
        // The backend's origin's own advertisements (another protocol, its HSTS) are not true of
        // the gateway's address.
        ("alt-svc", Framing),
        ("strict-transport-security", Framing),
    ]
);

/// The names a `Connection` header lists: hop-by-hop for this message too.
fn connection_listed(h: &HeaderMap) -> Vec<String> {
    h.get_all(reqwest::header::CONNECTION)
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
    // Room for all: most headers cross, and growing the list step by step cost more.
    let mut out = Vec::with_capacity(h.len());
    out.extend(
        h.iter()
            .filter(|(k, _)| held(k).is_none() && !listed.iter().any(|l| l == k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    out
}

/// The first value of each of `names` in `h`, found in one pass over its entries: a lookup by
/// a name that is not a standard one hashes the name each time, and a request is read for
/// several such names.
pub fn first_values<'h, const N: usize>(
    h: &'h HeaderMap,
    names: [&HeaderName; N],
) -> [Option<&'h HeaderValue>; N] {
    let mut out = [None; N];
    for (name, value) in h {
        if let Some(i) = names.iter().position(|n| *n == name)
            && out[i].is_none()
        {
            out[i] = Some(value);
        }
    }
    out
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
    fn first_values_are_what_a_lookup_by_each_name_gives() {
        let h = map(&[
            ("session_id", "s1"),
            ("x-codex-installation-id", "i1"),
            ("Session_Id", "s2"),
            ("authorization", "Bearer k"),
            ("x-codex-installation-id", "i2"),
        ]);
        let names = [
            HeaderName::from_static("x-codex-installation-id"),
            HeaderName::from_static("session_id"),
            HeaderName::from_static("conversation_id"),
            reqwest::header::AUTHORIZATION,
        ];
        let found = first_values(&h, [&names[0], &names[1], &names[2], &names[3]]);
        let looked: Vec<_> = names.iter().map(|n| h.get(n)).collect();
        assert_eq!(found.to_vec(), looked);
        assert_eq!(found[0].unwrap(), "i1");
        assert_eq!(found[1].unwrap(), "s1");
        assert_eq!(found[2], None);
        assert_eq!(first_values(&HeaderMap::new(), [&names[0]]), [None]);
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
        for (table, held) in [
            (
                REQUEST_HELD,
                request_held as fn(&HeaderName) -> Option<Held>,
            ),
            (ANSWER_HELD, answer_held),
        ] {
            for (i, (name, why)) in table.iter().enumerate() {
                assert_eq!(*name, name.to_ascii_lowercase());
                let parsed = HeaderName::from_bytes(name.as_bytes()).unwrap();
                assert_eq!(held(&parsed), Some(*why), "{name}");
                assert!(
                    table[i + 1..].iter().all(|(n, _)| n != name),
                    "{name} twice"
                );
            }
        }
    }
}
