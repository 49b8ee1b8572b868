//! Links a release build of the binary with the functions every answer runs side by side at
//! the start of its code: an answer then touches half as many pages of code (docs/
//! architecture.md, Performance).
//!
//! `link/hot-functions.txt` lists them, hottest first, as `scripts/hot-functions.sh` found them
//! under a profiler: symbol names without the compiler's hashes, so that the list holds across
//! builds, profiles and toolchains (an instance of a generic function is listed with all its
//! instances). Each becomes a pattern over the input sections of a linker script that puts the
//! matching sections, in the list's order, at the start of `.text`; the linker appends the rest
//! of the code after them, and its own layout stays as it is otherwise (`INSERT BEFORE .init`,
//! where `.text` stands). The code stays in `.text`: a profiler that reads symbols only there
//! (valgrind's) names the hot functions as before.
//!
//! Only where the linker is the toolchain's own LLD (the default on x86-64 Linux since Rust
//! 1.90); a build given a linker or link arguments of its own links as it would without this.

use std::env;
use std::fmt::Write as _;
use std::path::Path;

const LIST: &str = "link/hot-functions.txt";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed={LIST}");
    println!("cargo::rerun-if-env-changed=RUSTC_LINKER");
    let var = |name: &str| env::var(name).unwrap_or_default();
    let release = var("PROFILE") == "release";
    let default_linker = var("TARGET") == "x86_64-unknown-linux-gnu"
        && env::var_os("RUSTC_LINKER").is_none()
        && !var("CARGO_ENCODED_RUSTFLAGS").contains("link");
    if !(release && default_linker) {
        return;
    }
    let list = match std::fs::read_to_string(Path::new(&var("CARGO_MANIFEST_DIR")).join(LIST)) {
        Ok(list) => list,
        Err(e) => {
            println!("cargo::warning={LIST}: {e}; the binary is linked in the linker's own order");
            return;
        }
    };
    let script = Path::new(&var("OUT_DIR")).join("hot-functions.ld");
    if let Err(e) = std::fs::write(&script, linker_script(&list)) {
        println!("cargo::warning={}: {e}", script.display());
        return;
    }
    println!(
        "cargo::rustc-link-arg-bin=switchyard=-Wl,-T,{}",
        script.display()
    );
}

/// The linker script for a list of names: a symbol's name without its hash, where a `*` stands
/// for any run of characters (a crate's hash in the newer mangling).
fn linker_script(list: &str) -> String {
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
