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
use std::path::Path;

#[path = "link/script.rs"]
mod script;

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
    let ld = Path::new(&var("OUT_DIR")).join("hot-functions.ld");
    if let Err(e) = std::fs::write(&ld, script::linker_script(&list)) {
        println!("cargo::warning={}: {e}", ld.display());
        return;
    }
    println!(
        "cargo::rustc-link-arg-bin=switchyard=-Wl,-T,{}",
        ld.display()
    );
}
