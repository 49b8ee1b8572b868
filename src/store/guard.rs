//! Every call into redb goes through [`guarded`]: redb trusts the file it opens, and a file
//! damaged outside it (a flipped byte, a truncation) can make it panic. Here such a panic is
//! caught and becomes [`StoreError::Damaged`], an error naming the file and the remedy, so no
//! input file can bring the process down.
//!
//! The default panic hook would still print the panic before it is caught; a hook installed
//! once keeps quiet for panics inside [`guarded`] (it keeps their message for the error) and
//! hands every other panic to the hook that was there before.

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Once;

use super::StoreError;

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
    static MESSAGE: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if INSIDE.with(Cell::get) {
                let payload = info.payload();
                let text = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "an internal check failed".into());
                MESSAGE.with(|m| *m.borrow_mut() = Some(text));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f` (which calls redb on the store at `path`); a panic inside it is the file's damage.
pub(crate) fn guarded<T>(
    path: &Path,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    install_hook();
    let was_inside = INSIDE.with(|i| i.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    INSIDE.with(|i| i.set(was_inside));
    match result {
        Ok(r) => r.map_err(|e| e.at(path)),
        Err(_) => {
            let detail = MESSAGE
                .with(|m| m.borrow_mut().take())
                .unwrap_or_else(|| "an internal check failed".into());
            Err(StoreError::Damaged {
                path: path.to_path_buf(),
                detail,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::panic)]
    fn a_panic_inside_becomes_a_damaged_store_error() {
        let err =
            guarded::<()>(Path::new("/x/switchyard.redb"), || panic!("bad page")).unwrap_err();
        assert!(
            matches!(&err, StoreError::Damaged { detail, .. } if detail == "bad page"),
            "{err}"
        );
        assert!(err.to_string().contains("/x/switchyard.redb"), "{err}");
        assert_eq!(guarded(Path::new("p"), || Ok(5)).unwrap(), 5);
    }
}
