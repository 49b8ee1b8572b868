//! The one place values are encoded: a version byte, then postcard.
//!
//! Every stored type has its own version history ([`Versioned`]). A change of its fields makes a
//! new version: [`encode`] writes the newest, and the type's `decode_version` reads every older
//! one too (each version has a test with bytes an old release wrote). postcard is not
//! self-describing, so a value is only ever read with the shape of the version it was written
//! with; enums are stored by their names, so reordering a Rust enum cannot change what a stored
//! value means.

use serde::Serialize;
use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("empty value")]
    Empty,
    #[error("value format {found} is newer than this binary understands ({newest})")]
    UnknownVersion { found: u8, newest: u8 },
    #[error("malformed value: {0}")]
    Malformed(String),
}

/// A type stored in the database, with its version history.
pub trait Versioned: Serialize + Sized {
    /// What one value is, for errors and logs ("request record").
    const NAME: &'static str;
    /// The version [`encode`] writes.
    const VERSION: u8;
    /// Reads a value written as `version`: this one or any older one.
    fn decode_version(version: u8, body: &[u8]) -> Result<Self, CodecError>;
}

pub fn encode<T: Versioned>(value: &T) -> Result<Vec<u8>, CodecError> {
    postcard::to_extend(value, Wire::of::<T>().into_bytes())
        .map_err(|e| CodecError::Malformed(e.to_string()))
}

/// postcard's wire format written by hand, for the one value written on every answer (a
/// request's record): what serde's layers cost there was most of the record's encoding. Integers
/// are LEB128 varints (`u16` too), a `bool` one byte, an `Option` a 0 or 1 tag before its value,
/// a string and a sequence their length as a varint before their bytes or items, a struct its
/// fields in order. Tests hold what it writes equal to postcard's bytes for the same value.
pub struct Wire(Vec<u8>);

impl Wire {
    /// A value of type `T`'s newest version, its version byte written.
    pub fn of<T: Versioned>() -> Wire {
        // Room for a typical record up front: growing the buffer byte by byte from one element
        // cost more than the encoding itself.
        let mut out = Vec::with_capacity(256);
        out.push(T::VERSION);
        Wire(out)
    }

    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    pub fn bool(&mut self, v: bool) {
        self.0.push(u8::from(v));
    }

    pub fn str(&mut self, v: &str) {
        self.varint(v.len() as u64);
        self.0.extend_from_slice(v.as_bytes());
    }

    /// An `Option`: its tag, then `some` writes the value.
    pub fn opt<T>(&mut self, v: Option<T>, some: impl FnOnce(&mut Wire, T)) {
        self.bool(v.is_some());
        if let Some(v) = v {
            some(self, v);
        }
    }

    /// A sequence: its length, then `each` writes each item.
    pub fn seq<T>(
        &mut self,
        items: impl ExactSizeIterator<Item = T>,
        mut each: impl FnMut(&mut Wire, T),
    ) {
        self.varint(items.len() as u64);
        for item in items {
            each(self, item);
        }
    }

    pub fn opt_str(&mut self, v: Option<&str>) {
        self.opt(v, Wire::str);
    }

    pub fn opt_varint(&mut self, v: Option<u64>) {
        self.opt(v, Wire::varint);
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

pub fn decode<T: Versioned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.split_first() {
        None => Err(CodecError::Empty),
        Some((&version, _)) if version > T::VERSION => Err(CodecError::UnknownVersion {
            found: version,
            newest: T::VERSION,
        }),
        Some((&version, body)) => T::decode_version(version, body),
    }
}

/// Reads a version's body with the shape `S` it was written with.
pub fn body<S: DeserializeOwned>(body: &[u8]) -> Result<S, CodecError> {
    postcard::from_bytes(body).map_err(|e| CodecError::Malformed(e.to_string()))
}

/// The error for a version this type never had (0, or a gap).
pub fn unknown<T: Versioned>(found: u8) -> CodecError {
    CodecError::UnknownVersion {
        found,
        newest: T::VERSION,
    }
}

/// A type with one version so far.
macro_rules! versioned_once {
    ($($t:ty => $name:literal),+ $(,)?) => {$(
        impl $crate::store::codec::Versioned for $t {
            const NAME: &'static str = $name;
            const VERSION: u8 = 1;
            fn decode_version(
                version: u8,
                body: &[u8],
            ) -> Result<Self, $crate::store::codec::CodecError> {
                match version {
                    1 => $crate::store::codec::body(body),
                    found => Err($crate::store::codec::unknown::<Self>(found)),
                }
            }
        }
    )+};
}
pub(crate) use versioned_once;

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        id: String,
        n: u64,
    }

    #[derive(Deserialize)]
    struct SampleV1 {
        id: String,
    }

    impl Versioned for Sample {
        const NAME: &'static str = "sample";
        const VERSION: u8 = 2;
        fn decode_version(version: u8, b: &[u8]) -> Result<Self, CodecError> {
            match version {
                2 => body(b),
                1 => body::<SampleV1>(b).map(|v| Sample { id: v.id, n: 0 }),
                found => Err(unknown::<Self>(found)),
            }
        }
    }

    #[test]
    fn writes_the_newest_version_and_reads_older_ones() {
        let s = Sample {
            id: "a".into(),
            n: 7,
        };
        let bytes = encode(&s).unwrap();
        assert_eq!(bytes[0], 2);
        assert_eq!(decode::<Sample>(&bytes).unwrap(), s);
        // Version 1 was `{id}`: postcard writes a string as its length, then its bytes.
        assert_eq!(
            decode::<Sample>(&[1, 1, b'a']).unwrap(),
            Sample {
                id: "a".into(),
                n: 0
            }
        );
    }

    #[test]
    fn refuses_newer_versions_gaps_empty_and_garbage() {
        assert_eq!(decode::<Sample>(&[]), Err(CodecError::Empty));
        assert_eq!(
            decode::<Sample>(&[3, 0]),
            Err(CodecError::UnknownVersion {
                found: 3,
                newest: 2
            })
        );
        assert_eq!(
            decode::<Sample>(&[0, 0]),
            Err(CodecError::UnknownVersion {
                found: 0,
                newest: 2
            })
        );
        assert!(matches!(
            decode::<Sample>(&[2, 0xff]),
            Err(CodecError::Malformed(_))
        ));
    }
}
