//! Compressed request bodies (`Content-Encoding: zstd`, `gzip` or `deflate`), decoded with the
//! body cap applied to the decoded bytes: a small body that inflates past the cap is refused as
//! soon as it passes it, having held nothing but the decoder's window. Pure functions over
//! bytes.

use std::io::Read;

/// How a body could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("the decoded request body exceeds {0} bytes")]
    TooLarge(usize),
    #[error("the request body is not valid {encoding}: {message}")]
    Invalid {
        encoding: &'static str,
        message: String,
    },
    #[error("the content encoding `{0}` is not supported (send zstd, gzip, deflate or none)")]
    Unsupported(String),
}

/// How much is read from a decoder at a time.
const CHUNK: usize = 64 * 1024;
/// The largest zstd window a body may declare: the decoder holds up to that much history, so a
/// header asking for more is refused rather than honoured (Codex's encoder uses 2 MiB).
const MAX_ZSTD_WINDOW: u64 = 8 * 1024 * 1024;

/// The body as sent (`encoding`: the `Content-Encoding` header, if any), decoded, at most
/// `cap` bytes long. An unencoded body is returned as it is.
///
/// Each encoding is read twice: once to count what it decodes to, holding nothing but the
/// decoder's own window, and once into a buffer of exactly that size. So a body that inflates
/// past the cap is refused having held almost nothing, and one that fits is held once.
pub fn decode(
    encoding: Option<&str>,
    body: bytes::Bytes,
    cap: usize,
) -> Result<bytes::Bytes, DecodeError> {
    // Several encodings apply in the order listed; Codex sends one.
    let mut body = body;
    let codings: Vec<String> = encoding
        .unwrap_or("")
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty() && c != "identity")
        .collect();
    for coding in codings.iter().rev() {
        let name = match coding.as_str() {
            "zstd" => "zstd",
            "gzip" | "x-gzip" => "gzip",
            "deflate" => "deflate",
            other => return Err(DecodeError::Unsupported(other.to_string())),
        };
        let len = drain(decoder(name, &body, cap)?, cap, name)?;
        let decoded = read_exact(decoder(name, &body, cap)?, len, name)?;
        body = decoded;
    }
    Ok(body)
}

/// A decoder of `body` in `encoding`.
fn decoder<'a>(
    encoding: &'static str,
    body: &'a [u8],
    cap: usize,
) -> Result<Box<dyn Read + 'a>, DecodeError> {
    Ok(match encoding {
        "zstd" => Box::new(zstd(body, cap)?),
        "gzip" => Box::new(flate2::read::MultiGzDecoder::new(body)),
        _ => Box::new(flate2::read::ZlibDecoder::new(body)),
    })
}

fn zstd(body: &[u8], cap: usize) -> Result<impl Read + '_, DecodeError> {
    use ruzstd::decoding::StreamingDecoder;
    use ruzstd::decoding::errors::FrameDecoderError;
    let decoder =
        StreamingDecoder::new_with_max_window_size(body, MAX_ZSTD_WINDOW).map_err(|e| match e {
            // More memory than a body is given: too large, like a body past the cap.
            FrameDecoderError::WindowSizeTooBig { .. } => DecodeError::TooLarge(cap),
            e => DecodeError::Invalid {
                encoding: "zstd",
                message: e.to_string(),
            },
        })?;
    // A frame that says its size says whether it fits before anything is decoded.
    if usize::try_from(decoder.decoder.content_size()).map_or(true, |n| n > cap) {
        return Err(DecodeError::TooLarge(cap));
    }
    Ok(decoder)
}

/// Reads `r` to its end, keeping nothing: how many bytes it yields, refused once past `cap`.
fn drain(mut r: impl Read, cap: usize, encoding: &'static str) -> Result<usize, DecodeError> {
    let mut chunk = vec![0u8; CHUNK];
    let mut total = 0usize;
    while let Some(n) = read_some(&mut r, &mut chunk, encoding)? {
        total += n;
        if total > cap {
            return Err(DecodeError::TooLarge(cap));
        }
    }
    Ok(total)
}

/// The `len` bytes `r` yields (as counted by [`drain`]).
fn read_exact(
    mut r: impl Read,
    len: usize,
    encoding: &'static str,
) -> Result<bytes::Bytes, DecodeError> {
    let mut out = vec![0u8; len];
    let mut at = 0;
    while at < len {
        match read_some(&mut r, &mut out[at..], encoding)? {
            Some(n) => at += n,
            None => break,
        }
    }
    if at != len {
        return Err(DecodeError::Invalid {
            encoding,
            message: "it decoded differently the second time".into(),
        });
    }
    Ok(bytes::Bytes::from(out))
}

/// One read: `None` at the end.
fn read_some(
    r: &mut impl Read,
    buf: &mut [u8],
    encoding: &'static str,
) -> Result<Option<usize>, DecodeError> {
    loop {
        return match r.read(buf) {
            Ok(0) => Ok(None),
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => Err(DecodeError::Invalid {
                encoding,
                message: e.to_string(),
            }),
        };
    }
}

/// zstd frames made without an encoder, for tests and load programs.
pub mod samples {
    /// A zstd frame of `data` in raw blocks (the format's own uncompressed form), which any
    /// decoder must read: what the tests and load programs send, without an encoder.
    pub fn zstd_stored(data: &[u8]) -> Vec<u8> {
        let mut f = vec![0x28, 0xb5, 0x2f, 0xfd];
        // Frame header: single segment, 8-byte content size.
        f.push(0b1110_0000);
        f.extend_from_slice(&(data.len() as u64).to_le_bytes());
        let blocks: Vec<&[u8]> = if data.is_empty() {
            vec![&[][..]]
        } else {
            data.chunks(128 * 1024).collect()
        };
        for (i, b) in blocks.iter().enumerate() {
            let last = u32::from(i + 1 == blocks.len());
            let header = last | ((b.len() as u32) << 3); // type 0: raw
            f.extend_from_slice(&header.to_le_bytes()[..3]);
            f.extend_from_slice(b);
        }
        f
    }

    /// A zstd frame that inflates one byte `n` times (RLE blocks), declaring no content size:
    /// a bomb of a few bytes per 128 KiB.
    pub fn zstd_rle_bomb(n: usize) -> Vec<u8> {
        let mut f = vec![0x28, 0xb5, 0x2f, 0xfd];
        // Frame header: no single segment, window descriptor 2 MiB (exponent 11), no size.
        f.push(0b0000_0000);
        f.push(11 << 3);
        let block = 128 * 1024;
        let count = n.div_ceil(block);
        for i in 0..count {
            let size = if i + 1 == count { n - i * block } else { block };
            let last = u32::from(i + 1 == count);
            let header = last | (1 << 1) | ((size as u32) << 3); // type 1: RLE
            f.extend_from_slice(&header.to_le_bytes()[..3]);
            f.push(b'{');
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::samples::{zstd_rle_bomb, zstd_stored};
    use super::*;

    #[test]
    fn an_unencoded_body_is_returned_as_it_is() {
        let b = bytes::Bytes::from_static(b"{\"model\":\"m\"}");
        assert_eq!(decode(None, b.clone(), 100).unwrap(), b);
        assert_eq!(decode(Some("identity"), b.clone(), 100).unwrap(), b);
    }

    #[test]
    fn zstd_gzip_and_deflate_bodies_are_decoded() {
        let json = br#"{"model":"gpt-5.5","input":[],"stream":true}"#;
        let z = zstd_stored(json);
        assert_eq!(&decode(Some("zstd"), z.into(), 1 << 20).unwrap()[..], json);
        let mut g = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        g.write_all(json).unwrap();
        let g = g.finish().unwrap();
        assert_eq!(&decode(Some("gzip"), g.into(), 1 << 20).unwrap()[..], json);
        let mut d = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        d.write_all(json).unwrap();
        let d = d.finish().unwrap();
        assert_eq!(
            &decode(Some("Deflate"), d.into(), 1 << 20).unwrap()[..],
            json
        );
    }

    #[test]
    fn a_bomb_is_refused_once_it_passes_the_cap() {
        let bomb = zstd_rle_bomb(1 << 30);
        assert!(bomb.len() < 40 * 1024, "{}", bomb.len());
        assert_eq!(
            decode(Some("zstd"), bomb.into(), 1 << 20),
            Err(DecodeError::TooLarge(1 << 20))
        );
        let mut g = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        g.write_all(&vec![b'a'; 8 << 20]).unwrap();
        let g = g.finish().unwrap();
        assert_eq!(
            decode(Some("gzip"), g.into(), 1 << 20),
            Err(DecodeError::TooLarge(1 << 20))
        );
    }

    #[test]
    fn broken_and_unknown_encodings_are_clear_errors() {
        assert!(matches!(
            decode(Some("zstd"), bytes::Bytes::from_static(b"not zstd"), 100),
            Err(DecodeError::Invalid {
                encoding: "zstd",
                ..
            })
        ));
        assert!(matches!(
            decode(Some("gzip"), bytes::Bytes::from_static(b"not gzip"), 100),
            Err(DecodeError::Invalid {
                encoding: "gzip",
                ..
            })
        ));
        assert_eq!(
            decode(Some("br"), bytes::Bytes::from_static(b"x"), 100),
            Err(DecodeError::Unsupported("br".into()))
        );
    }
}
