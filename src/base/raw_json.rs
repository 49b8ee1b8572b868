//! A request body read once, in a form the size of its bytes: a JSON object whose top-level
//! members are kept as the text they were sent as (borrowed from the body), so that what the
//! gateway only forwards — the input, the tools, the instructions — is never built into a tree.
//! The few members it reads (`model`, `stream`, `prompt_cache_key`, `previous_response_id`,
//! `client_metadata`) are decoded from their text on demand; the members it changes are
//! replaced by new text. [`RawObject::encode`] writes the object back, member by member.
//!
//! A tree of serde values costs ~35 times the bytes of a body of small items (a 14 MiB body of
//! 7.5M tiny input items took 2 GB as one); this costs the body, plus a few words per member.

use std::borrow::Cow;

use bytes::Bytes;
use serde::de::{self, Deserializer as _, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

/// Top-level members an object may have: a request has a few dozen at most, and the search
/// for a member is a scan.
pub const MAX_MEMBERS: usize = 256;

/// `T` read from JSON `bytes`, as `serde_json::from_slice` reads it, with the bytes checked as
/// UTF-8 once as a whole instead of each string on its own (what `from_slice` does: a check
/// per key and per borrowed value). Bytes that are not UTF-8 as a whole are read by
/// `from_slice` itself, which accepts them where the bad bytes sit in a value it skips.
pub fn from_bytes<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> serde_json::Result<T> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
    }
}

/// Why a body is no [`RawObject`].
#[derive(Debug, thiserror::Error)]
pub enum RawError {
    #[error("the request body must be a JSON object")]
    NotAnObject,
    #[error("the request body has more than {MAX_MEMBERS} top-level fields")]
    TooManyMembers,
    #[error("invalid JSON body: {0}")]
    Json(#[from] serde_json::Error),
}

/// One member's value.
#[derive(Debug, Clone)]
enum Member<'a> {
    /// As sent, borrowed from the body.
    Sent(&'a RawValue),
    /// Made here.
    Made(Box<RawValue>),
    /// An array made of the elements of other arrays: each piece is the text between an
    /// array's brackets (possibly empty), written one after another with commas between.
    Joined(Vec<Bytes>),
}

impl Member<'_> {
    fn text(&self) -> Option<&str> {
        match self {
            Member::Sent(r) => Some(r.get()),
            Member::Made(r) => Some(r.get()),
            Member::Joined(_) => None,
        }
    }

    fn len(&self) -> usize {
        match self {
            Member::Sent(r) => r.get().len(),
            Member::Made(r) => r.get().len(),
            Member::Joined(pieces) => pieces.iter().map(|p| p.len() + 1).sum::<usize>() + 2,
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Member::Sent(r) => out.extend_from_slice(r.get().as_bytes()),
            Member::Made(r) => out.extend_from_slice(r.get().as_bytes()),
            Member::Joined(pieces) => {
                out.push(b'[');
                let mut first = true;
                for p in pieces.iter().filter(|p| !p.is_empty()) {
                    if !first {
                        out.push(b',');
                    }
                    out.extend_from_slice(p);
                    first = false;
                }
                out.push(b']');
            }
        }
    }
}

/// A member name, borrowed from the body unless it has escapes.
#[derive(serde::Deserialize)]
struct Name<'a>(#[serde(borrow)] Cow<'a, str>);

/// A JSON object with its members as text. Cloning copies a few words per member.
#[derive(Debug, Clone)]
pub struct RawObject<'a> {
    members: Vec<(Cow<'a, str>, Member<'a>)>,
}

struct Members;

impl<'de> Visitor<'de> for Members {
    type Value = Vec<(Cow<'de, str>, Member<'de>)>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members: Self::Value = Vec::new();
        while let Some(Name(name)) = map.next_key::<Name<'de>>()? {
            let value: &'de RawValue = map.next_value()?;
            // A name given twice keeps its first place and its last value, as a map does.
            match members.iter().position(|(n, _)| *n == name) {
                Some(at) => members[at].1 = Member::Sent(value),
                None if members.len() >= MAX_MEMBERS => {
                    return Err(de::Error::custom(RawError::TooManyMembers));
                }
                None => members.push((name, Member::Sent(value))),
            }
        }
        Ok(members)
    }
}

impl<'a> RawObject<'a> {
    /// Reads `bytes` as one JSON object.
    pub fn parse(bytes: &'a [u8]) -> Result<RawObject<'a>, RawError> {
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        if first != Some(&b'{') {
            return match serde_json::from_slice::<de::IgnoredAny>(bytes) {
                Err(e) => Err(RawError::Json(e)),
                Ok(_) => Err(RawError::NotAnObject),
            };
        }
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let members = de.deserialize_map(Members).map_err(|e| {
            if e.to_string().contains("top-level fields") {
                RawError::TooManyMembers
            } else {
                RawError::Json(e)
            }
        })?;
        de.end()?;
        Ok(RawObject { members })
    }

    fn member(&self, name: &str) -> Option<&Member<'a>> {
        self.members.iter().find(|(n, _)| n == name).map(|(_, m)| m)
    }

    /// Whether the object has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// A member's text as sent (or as made here).
    pub fn raw(&self, name: &str) -> Option<&str> {
        self.member(name)?.text()
    }

    /// A member that is a string, decoded.
    pub fn str(&self, name: &str) -> Option<Cow<'_, str>> {
        let text = self.raw(name)?;
        serde_json::from_str::<Name<'_>>(text).ok().map(|n| n.0)
    }

    /// A member that is a boolean.
    pub fn bool(&self, name: &str) -> Option<bool> {
        serde_json::from_str(self.raw(name)?).ok()
    }

    /// A member decoded into a tree: for the small ones only (`client_metadata`).
    pub fn tree(&self, name: &str) -> Option<Value> {
        serde_json::from_str(self.raw(name)?).ok()
    }

    fn put(&mut self, name: &str, value: Member<'a>) {
        match self.members.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => *v = value,
            None => self.members.push((Cow::Owned(name.to_string()), value)),
        }
    }

    /// Sets a member to `value`, in its place if it was there, else last.
    pub fn set(&mut self, name: &str, value: &impl serde::Serialize) {
        if let Ok(raw) = serde_json::value::to_raw_value(value) {
            self.put(name, Member::Made(raw));
        }
    }

    /// Sets a member to the array whose elements are those of every array in `pieces`, each
    /// given as the text between its brackets ([`array_inner`]).
    pub fn set_joined(&mut self, name: &str, pieces: Vec<Bytes>) {
        self.put(name, Member::Joined(pieces));
    }

    /// Removes a member; whether it was there.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.members.len();
        self.members.retain(|(n, _)| n != name);
        self.members.len() != before
    }

    /// The object as JSON text, its members in their order.
    pub fn encode(&self) -> Vec<u8> {
        let len: usize = self
            .members
            .iter()
            .map(|(n, m)| n.len() + m.len() + 4)
            .sum::<usize>()
            + 2;
        let mut out = Vec::with_capacity(len);
        out.push(b'{');
        for (i, (name, value)) in self.members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            // A name is a string: its encoding cannot fail.
            let _ = serde_json::to_writer(&mut out, name.as_ref());
            out.push(b':');
            value.write(&mut out);
        }
        out.push(b'}');
        out
    }
}

/// The text between an array's brackets, trimmed; `None` when `text` is no array.
pub fn array_inner(text: &str) -> Option<&str> {
    let t = text.trim();
    let inner = t.strip_prefix('[')?.strip_suffix(']')?;
    Some(inner.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_as_a_whole_read_as_from_slice_reads_them() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Peek<'a> {
            #[serde(borrow)]
            model: Cow<'a, str>,
        }
        let cases: [&[u8]; 5] = [
            br#"{"model":"gpt-5.5","input":[{"text":"h\u00e9"}]}"#,
            "{\"model\":\"gpt\u{e9}\",\"x\":1}".as_bytes(),
            // Not UTF-8 in a skipped value: from_slice accepts it, and so does this.
            b"{\"x\":\"\xff\xfe\",\"model\":\"m\"}",
            // Not UTF-8 in the value read: refused by both.
            b"{\"model\":\"\xff\"}",
            br#"{"model":1}"#,
        ];
        for bytes in cases {
            let ours = from_bytes::<Peek<'_>>(bytes).map_err(|e| e.to_string());
            let theirs = serde_json::from_slice::<Peek<'_>>(bytes).map_err(|e| e.to_string());
            assert_eq!(
                ours.is_ok(),
                theirs.is_ok(),
                "{}",
                String::from_utf8_lossy(bytes)
            );
            if let (Ok(a), Ok(b)) = (ours, theirs) {
                assert_eq!(a, b);
            }
        }
        assert_eq!(
            from_bytes::<Peek<'_>>(b"{\"x\":\"\xff\",\"model\":\"m\"}")
                .unwrap()
                .model,
            "m"
        );
    }

    fn tree(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn members_are_read_changed_and_written_back_in_their_order() {
        let body = br#" {"model":"gpt-5","input":[{"type":"message","content":"h\u00e9"}],"stream":false,"prompt_cache_key":"s\"1","tools":[]} "#;
        let mut o = RawObject::parse(body).unwrap();
        assert_eq!(o.str("model").as_deref(), Some("gpt-5"));
        assert_eq!(o.str("prompt_cache_key").as_deref(), Some("s\"1"));
        assert_eq!(o.bool("stream"), Some(false));
        assert_eq!(o.raw("tools"), Some("[]"));
        o.set("model", &"gpt-5.5");
        o.set("stream", &true);
        assert!(o.remove("tools"));
        assert!(!o.remove("tools"));
        o.set("store", &false);
        let out = o.encode();
        let mut want = tree(body);
        want["model"] = "gpt-5.5".into();
        want["stream"] = true.into();
        want.as_object_mut().unwrap().remove("tools");
        want["store"] = false.into();
        assert_eq!(tree(&out), want);
        let keys: Vec<String> = tree(&out).as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            keys,
            ["model", "input", "stream", "prompt_cache_key", "store"]
        );
    }

    #[test]
    fn a_name_given_twice_keeps_its_first_place_and_last_value() {
        let o = RawObject::parse(br#"{"a":1,"b":2,"a":3}"#).unwrap();
        assert_eq!(o.encode(), br#"{"a":3,"b":2}"#);
        assert_eq!(
            tree(&o.encode()),
            serde_json::from_slice::<Value>(br#"{"a":1,"b":2,"a":3}"#).unwrap()
        );
    }

    #[test]
    fn joined_arrays_write_every_element_once() {
        let mut o = RawObject::parse(br#"{"input":[1]}"#).unwrap();
        o.set_joined(
            "input",
            vec![
                Bytes::from_static(br#"{"a":1},{"b":2}"#),
                Bytes::new(),
                Bytes::from_static(b"3"),
            ],
        );
        assert_eq!(
            tree(&o.encode())["input"],
            serde_json::json!([{"a":1},{"b":2},3])
        );
        o.set_joined("input", vec![Bytes::new()]);
        assert_eq!(o.encode(), br#"{"input":[]}"#);
        assert_eq!(array_inner(" [ 1, 2 ] "), Some("1, 2"));
        assert_eq!(array_inner("[]"), Some(""));
        assert_eq!(array_inner("\"x\""), None);
    }

    #[test]
    fn what_is_no_object_is_said() {
        assert!(matches!(
            RawObject::parse(b"[1]"),
            Err(RawError::NotAnObject)
        ));
        assert!(matches!(
            RawObject::parse(b"\"x\""),
            Err(RawError::NotAnObject)
        ));
        assert!(matches!(
            RawObject::parse(b"{\"a\":"),
            Err(RawError::Json(_))
        ));
        assert!(matches!(RawObject::parse(b"{} x"), Err(RawError::Json(_))));
        let many: String = format!(
            "{{{}}}",
            (0..=MAX_MEMBERS)
                .map(|i| format!("\"k{i}\":0"))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert!(matches!(
            RawObject::parse(many.as_bytes()),
            Err(RawError::TooManyMembers)
        ));
    }

    #[test]
    fn a_body_of_tiny_items_costs_its_bytes_not_a_tree() {
        // 200k items: the object holds one borrowed slice for them all.
        let items = vec!["{}"; 200_000].join(",");
        let body = format!("{{\"model\":\"m\",\"input\":[{items}]}}");
        let o = RawObject::parse(body.as_bytes()).unwrap();
        assert_eq!(o.members.len(), 2);
        assert_eq!(o.raw("input").map(str::len), Some(items.len() + 2));
        assert_eq!(o.encode(), body.as_bytes());
    }
}
