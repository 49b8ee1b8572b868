//! The one place values are encoded: a version byte, then postcard.
//!
//! postcard is not self-describing: a struct that gains a field needs a new version byte and a
//! decoder for the old one here. That is deliberate — the format changes in one place, with a
//! test, instead of silently.

use serde::{Serialize, de::DeserializeOwned};

/// The current value format.
pub const VERSION: u8 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("empty value")]
    Empty,
    #[error("value format {found} is newer than this binary understands ({VERSION})")]
    UnknownVersion { found: u8 },
    #[error("malformed value: {0}")]
    Malformed(String),
}

pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    postcard::to_extend(value, vec![VERSION]).map_err(|e| CodecError::Malformed(e.to_string()))
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.split_first() {
        None => Err(CodecError::Empty),
        Some((&VERSION, rest)) => {
            postcard::from_bytes(rest).map_err(|e| CodecError::Malformed(e.to_string()))
        }
        Some((&found, _)) => Err(CodecError::UnknownVersion { found }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        id: String,
        n: u64,
        opt: Option<i32>,
        list: Vec<String>,
    }

    #[test]
    fn round_trips_with_a_leading_version_byte() {
        let s = Sample {
            id: "a".into(),
            n: 7,
            opt: None,
            list: vec!["x".into()],
        };
        let bytes = encode(&s).unwrap();
        assert_eq!(bytes[0], VERSION);
        assert_eq!(decode::<Sample>(&bytes).unwrap(), s);
    }

    #[test]
    fn refuses_unknown_versions_empty_and_garbage() {
        assert_eq!(decode::<Sample>(&[]), Err(CodecError::Empty));
        assert_eq!(
            decode::<Sample>(&[VERSION + 1, 0]),
            Err(CodecError::UnknownVersion { found: VERSION + 1 })
        );
        assert!(matches!(
            decode::<Sample>(&[VERSION, 0xff]),
            Err(CodecError::Malformed(_))
        ));
    }
}
