//! Request records stored several to a row. One row per record cost the writer a B-tree insert
//! and its page writes for each answer, most of what keeping a record cost; the writer now
//! stores the records a commit holds side by side, up to [`RECORDS_PER_ROW`] to a row.
//!
//! A row of the `requests` table is either one record (its value a [`RequestRow`] as the codec
//! writes it: a version byte, 1 to 4 so far, then postcard) under the record's key, or a group:
//! [`GROUP`], then for each record its key (8 bytes, little-endian), its length (4 bytes,
//! little-endian) and its value, under the greatest of its keys. So a range of keys from `k` up
//! finds every group holding a record from `k` up, and retention (`DeleteIntBelow`) removes a
//! group only when all of its records are older than the bound. Record versions stay below
//! [`GROUP`]; an older binary reads a group as a value too new for it, counted and left out.
//!
//! [`RequestRow`]: super::records::RequestRow

use super::codec::CodecError;

/// Records stored in one row at most.
pub const RECORDS_PER_ROW: usize = 64;

/// The largest record stored in a group; a larger one (none is near it: a record is a few
/// hundred bytes) is stored alone.
pub const MAX_GROUPED: usize = 1 << 16;

/// The first byte of a group's value.
pub const GROUP: u8 = 0x80;

/// The row of `records` (key and value each, no value above [`MAX_GROUPED`]): its key, the
/// greatest of theirs, and its value.
pub fn group<'a>(records: impl IntoIterator<Item = (u64, &'a [u8])>) -> (u64, Vec<u8>) {
    let mut out = Vec::with_capacity(RECORDS_PER_ROW * 320);
    out.push(GROUP);
    let mut key = 0;
    for (k, value) in records {
        key = key.max(k);
        out.extend_from_slice(&k.to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
    (key, out)
}

/// The records of the row stored under `key`: itself when it is one record, else its group's.
pub fn records(key: u64, value: &[u8]) -> Result<Vec<(u64, &[u8])>, CodecError> {
    let Some((&GROUP, mut rest)) = value.split_first() else {
        return Ok(vec![(key, value)]);
    };
    let cut = |what: &str| CodecError::Malformed(format!("a group of records cut short in {what}"));
    let mut out = Vec::with_capacity(RECORDS_PER_ROW);
    while !rest.is_empty() {
        let (k, tail) = rest.split_at_checked(8).ok_or_else(|| cut("a key"))?;
        let (len, tail) = tail.split_at_checked(4).ok_or_else(|| cut("a length"))?;
        let len = u32::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
        let (v, tail) = tail.split_at_checked(len).ok_or_else(|| cut("a record"))?;
        out.push((u64::from_le_bytes(k.try_into().unwrap_or_default()), v));
        rest = tail;
    }
    if out.is_empty() {
        return Err(CodecError::Malformed("an empty group of records".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_reads_back_its_records_under_the_greatest_key() {
        let records: [(u64, &[u8]); 3] = [(7, b"\x04abc"), (9, b""), (8, b"\x04d")];
        let (key, value) = group(records);
        assert_eq!(key, 9);
        assert_eq!(super::records(key, &value).unwrap(), records.to_vec());
    }

    #[test]
    fn a_single_record_row_reads_as_itself() {
        assert_eq!(records(5, b"\x04x").unwrap(), vec![(5, &b"\x04x"[..])]);
        // Not a group: the codec says what is wrong with it.
        assert_eq!(records(5, b"").unwrap(), vec![(5, &b""[..])]);
    }

    /// Every cut of a group (what a torn copy of the file could hold) is refused whole, or reads
    /// as the records it still holds entire: never a record cut short.
    #[test]
    fn a_group_cut_anywhere_never_reads_as_a_cut_record() {
        let records: [(u64, &[u8]); 2] = [(1, b"\x04first"), (2, b"\x04second")];
        let (key, value) = group(records);
        for cut in 1..value.len() {
            match super::records(key, &value[..cut]) {
                Ok(read) => assert_eq!(read, records[..read.len()].to_vec(), "{cut}"),
                Err(e) => assert!(e.to_string().contains("group of records"), "{cut}: {e}"),
            }
        }
        assert!(super::records(key, &[GROUP]).is_err());
    }
}
