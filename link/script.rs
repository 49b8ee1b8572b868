//! The linker script `build.rs` makes of `link/hot-functions.txt` (kept apart so that the
//! tests can read it too).

use std::fmt::Write as _;

/// The linker script for a list of names: a symbol's name without its hash, where a `*` stands
/// for any run of characters (a crate's hash in the newer mangling).
pub fn linker_script(list: &str) -> String {
    let mut s = String::from("SECTIONS {\n  .text : {\n");
    for name in list.lines().map(str::trim) {
        // A pattern is read up to white space and a few punctuation marks; names with any of
        // them (none the compiler makes) are left out rather than misread.
        if name.is_empty() || name.contains(|c: char| " \t(){};,=\"".contains(c)) {
            continue;
        }
        // The section of a function is `.text.` and its symbol's name; a legacy name ends in
        // `17h`, its 16-digit hash and `E`, which the list leaves out.
        let hash = if name.starts_with("_ZN") { "17h*" } else { "" };
        let _ = writeln!(s, "    *(.text.{name}{hash})");
    }
    s.push_str("  }\n}\nINSERT BEFORE .init;\n");
    s
}
