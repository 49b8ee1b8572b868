//! One device per account: the client's installation id replaced by the account's own
//! everywhere Codex puts one. Codex names its device in up to four places of a request — the
//! `x-codex-installation-id` header, the body's `client_metadata["x-codex-installation-id"]`,
//! and `installation_id` inside the turn-metadata JSON, which travels both as the
//! `x-codex-turn-metadata` header and as the string `client_metadata["x-codex-turn-metadata"]`
//! — and a WebSocket `response.create` frame carries the same `client_metadata`. The header is
//! held back ([`super::headers`]) and set per account; the others are rewritten here.
//!
//! The ids are found once per request; each attempt then replaces every occurrence of them in
//! the bytes it sends by its account's id. A UUID replaced by a UUID is a same-length splice:
//! the body is copied once, never parsed or encoded again. An id that could be escaped inside
//! JSON, or too short to stand for itself alone, is not searched for in bytes: such a request
//! has its fields replaced in the parsed body by [`PLACEHOLDER`] ([`normalise`]), which is.

use bytes::{Bytes, BytesMut};
use reqwest::header::HeaderValue;
use serde_json::{Map, Value};

/// The body field that holds the device id.
pub const INSTALLATION_FIELD: &str = "x-codex-installation-id";
/// The body field (a JSON string) and the header that hold the turn metadata.
pub const TURN_METADATA_FIELD: &str = "x-codex-turn-metadata";
/// The device id's key inside the turn metadata.
const TURN_METADATA_ID: &str = "installation_id";

/// What a client's id is replaced by in the parsed body when it cannot be found in bytes: a
/// UUID, so the same splice replaces it per account.
pub const PLACEHOLDER: &str = "00000000-0000-4000-8000-000000000000";

/// The shortest id searched for in bytes (a UUID is 36).
const MIN_SEARCHED: usize = 16;

/// The device ids a client sent, to be replaced in what goes upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientIds(Vec<Box<str>>);

/// An id that can be searched for in JSON bytes: long enough to stand for itself alone, and
/// made of characters JSON never escapes (so it appears the same at every level of nesting).
pub fn searchable(id: &str) -> bool {
    id.len() >= MIN_SEARCHED
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// The device id inside a turn-metadata JSON text, if it has one.
pub fn turn_metadata_id(text: &str) -> Option<String> {
    let v: Value = serde_json::from_str(text).ok()?;
    v.get(TURN_METADATA_ID)?.as_str().map(str::to_string)
}

impl ClientIds {
    /// The ids among `found` (empty ones left out), each once.
    pub fn of<'a>(found: impl IntoIterator<Item = &'a str>) -> ClientIds {
        let mut ids: Vec<Box<str>> = Vec::new();
        for id in found {
            if !id.is_empty() && !ids.iter().any(|i| &**i == id) {
                ids.push(id.into());
            }
        }
        ClientIds(ids)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every id can be replaced in bytes.
    pub fn all_searchable(&self) -> bool {
        self.0.iter().all(|id| searchable(id))
    }

    /// `bytes` with every occurrence of a client id replaced by `account`; `bytes` itself
    /// (shared, not copied) when none occurs.
    pub fn rewrite(&self, bytes: &Bytes, account: &str) -> Bytes {
        let hits = self.occurrences(bytes);
        if hits.is_empty() {
            return bytes.clone();
        }
        let grown: usize = hits
            .iter()
            .map(|(_, len)| account.len().saturating_sub(*len))
            .sum();
        let mut out = BytesMut::with_capacity(bytes.len() + grown);
        let mut at = 0;
        for (start, len) in hits {
            out.extend_from_slice(&bytes[at..start]);
            out.extend_from_slice(account.as_bytes());
            at = start + len;
        }
        out.extend_from_slice(&bytes[at..]);
        out.freeze()
    }

    /// A header value with every occurrence of a client id replaced by `account`.
    pub fn rewrite_header(&self, v: &HeaderValue, account: &str) -> HeaderValue {
        let bytes = Bytes::copy_from_slice(v.as_bytes());
        let out = self.rewrite(&bytes, account);
        HeaderValue::from_maybe_shared(out).unwrap_or_else(|_| v.clone())
    }

    /// Where the ids occur: (start, length), in order, never overlapping.
    fn occurrences(&self, bytes: &[u8]) -> Vec<(usize, usize)> {
        let mut hits: Vec<(usize, usize)> = Vec::new();
        for id in self.0.iter().filter(|id| searchable(id)) {
            let finder = memchr::memmem::Finder::new(id.as_bytes());
            hits.extend(finder.find_iter(bytes).map(|at| (at, id.len())));
        }
        hits.sort_unstable();
        // One id inside another (a shorter one found within a longer): keep the first.
        let mut kept: Vec<(usize, usize)> = Vec::with_capacity(hits.len());
        for h in hits {
            if kept.last().is_none_or(|(s, l)| h.0 >= s + l) {
                kept.push(h);
            }
        }
        kept
    }
}

/// The ids a parsed body carries: `client_metadata`'s own, and the one inside its turn
/// metadata.
pub fn body_ids(obj: &Map<String, Value>) -> Vec<String> {
    let Some(meta) = obj.get("client_metadata").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut ids = Vec::new();
    if let Some(id) = meta.get(INSTALLATION_FIELD).and_then(Value::as_str) {
        ids.push(id.to_string());
    }
    if let Some(id) = meta
        .get(TURN_METADATA_FIELD)
        .and_then(Value::as_str)
        .and_then(turn_metadata_id)
    {
        ids.push(id);
    }
    ids
}

/// Replaces the device id in a parsed body by [`PLACEHOLDER`] (both the field and the turn
/// metadata's), for ids that cannot be replaced in bytes.
pub fn normalise(obj: &mut Map<String, Value>) {
    let Some(meta) = obj
        .get_mut("client_metadata")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if meta.contains_key(INSTALLATION_FIELD) {
        meta.insert(INSTALLATION_FIELD.into(), Value::String(PLACEHOLDER.into()));
    }
    if let Some(text) = meta.get(TURN_METADATA_FIELD).and_then(Value::as_str)
        && let Some(replaced) = normalise_turn_metadata(text)
    {
        meta.insert(TURN_METADATA_FIELD.into(), Value::String(replaced));
    }
}

/// A turn-metadata JSON text with its device id replaced by [`PLACEHOLDER`] (`None`: it has
/// none, or it is not JSON).
pub fn normalise_turn_metadata(text: &str) -> Option<String> {
    let mut v: Value = serde_json::from_str(text).ok()?;
    let slot = v.get_mut(TURN_METADATA_ID)?;
    *slot = Value::String(PLACEHOLDER.into());
    serde_json::to_string(&v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: &str = "0b6a4c2e-8d1f-4e3a-9c5b-7a2d1e0f3b4c";
    const ACCOUNT: &str = "9f8e7d6c-5b4a-4321-8fed-cba987654321";

    fn codex_body(id: &str) -> Vec<u8> {
        let turn = serde_json::json!({"installation_id": id, "context_window_id": "w1",
            "request_kind": "turn", "sandbox": "seatbelt"});
        serde_json::to_vec(&serde_json::json!({
            "model": "gpt-5.5", "stream": true, "input": [],
            "client_metadata": {"session_id": "s1", "x-codex-installation-id": id,
                "x-codex-turn-metadata": turn.to_string()},
        }))
        .unwrap()
    }

    #[test]
    fn every_occurrence_of_the_clients_id_becomes_the_accounts() {
        let body = Bytes::from(codex_body(CLIENT));
        let ids = ClientIds::of(
            body_ids(&serde_json::from_slice(&body).unwrap())
                .iter()
                .map(String::as_str),
        );
        assert_eq!(ids, ClientIds::of([CLIENT]));
        let out = ids.rewrite(&body, ACCOUNT);
        let text = std::str::from_utf8(&out).unwrap();
        assert!(!text.contains(CLIENT), "{text}");
        assert_eq!(text.matches(ACCOUNT).count(), 2, "{text}");
        // Same length, and still the same JSON but for the ids.
        assert_eq!(out.len(), body.len());
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["client_metadata"][INSTALLATION_FIELD], ACCOUNT);
        let turn = v["client_metadata"][TURN_METADATA_FIELD].as_str().unwrap();
        assert_eq!(turn_metadata_id(turn).as_deref(), Some(ACCOUNT));
    }

    #[test]
    fn a_body_without_the_id_is_shared_not_copied() {
        let body = Bytes::from_static(b"{\"model\":\"gpt-5.5\"}");
        let out = ClientIds::of([CLIENT]).rewrite(&body, ACCOUNT);
        assert_eq!(out.as_ptr(), body.as_ptr());
    }

    #[test]
    fn ids_of_other_lengths_and_several_ids_are_all_replaced() {
        let body = Bytes::from_static(
            b"a-client-device-id-1 and another-device-id-22 and a-client-device-id-1",
        );
        let ids = ClientIds::of(["a-client-device-id-1", "another-device-id-22", ""]);
        let out = ids.rewrite(&body, ACCOUNT);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            format!("{ACCOUNT} and {ACCOUNT} and {ACCOUNT}")
        );
    }

    #[test]
    fn a_header_is_rewritten_too() {
        let h = HeaderValue::from_str(&format!("{{\"installation_id\":\"{CLIENT}\"}}")).unwrap();
        let out = ClientIds::of([CLIENT]).rewrite_header(&h, ACCOUNT);
        assert_eq!(
            out.to_str().unwrap(),
            format!("{{\"installation_id\":\"{ACCOUNT}\"}}")
        );
    }

    #[test]
    fn ids_that_json_may_escape_or_that_are_short_are_replaced_in_the_tree() {
        assert!(searchable(CLIENT));
        for id in [
            "short",
            "has \"quotes\" in it, long",
            "ünïcödé-device-identifier",
            "",
        ] {
            assert!(!searchable(id), "{id}");
        }
        let id = "my \"device\" / laptop number one";
        let mut obj: Map<String, Value> = serde_json::from_slice(&codex_body(id)).unwrap();
        normalise(&mut obj);
        let text = serde_json::to_string(&obj).unwrap();
        assert!(!text.contains("laptop"), "{text}");
        assert_eq!(
            body_ids(&obj),
            vec![PLACEHOLDER.to_string(), PLACEHOLDER.to_string()]
        );
        // Then the placeholder is what each attempt replaces.
        let out = ClientIds::of([PLACEHOLDER]).rewrite(&Bytes::from(text), ACCOUNT);
        assert_eq!(
            body_ids(&serde_json::from_slice(&out).unwrap()),
            vec![ACCOUNT.to_string(); 2]
        );
    }
}
