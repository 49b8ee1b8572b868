//! The process's allocator: mimalloc, asked for memory the way its own fast path expects.
//!
//! mimalloc's aligned entry points take the fast path only for blocks of at most 1 KiB; a
//! larger one (a read buffer, a batch of events, a request body) goes through the generic
//! aligned allocation first. Nearly every allocation of this program asks for an alignment
//! of 8 or less, which every mimalloc block already has (block sizes are whole words), so
//! those go to the plain entry points and only the rare larger alignment to the aligned ones.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// Every block mimalloc hands out starts on a word boundary.
const WORD: usize = std::mem::size_of::<usize>();

/// A block for `layout` from the `plain` entry point when a word's alignment is enough (every
/// mimalloc block has it), else from the `aligned` one. Inlined, both are direct calls.
///
/// # Safety
/// As `GlobalAlloc::alloc`: `layout` has a non-zero size.
#[inline(always)]
unsafe fn block(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    // SAFETY: calls into the allocator with the size (and alignment) asked for.
    unsafe {
        if layout.align() <= WORD {
            plain(layout.size()) as *mut u8
        } else {
            aligned(layout.size(), layout.align()) as *mut u8
        }
    }
}

/// mimalloc behind the global allocator interface (see the module's documentation).
pub struct Alloc;

// SAFETY: each method forwards to the mimalloc function of the same contract; a block from
// either family of entry points is freed and resized by mimalloc alike (`mi_free` and
// `mi_realloc` accept any block, and the aligned resize keeps the alignment asked).
unsafe impl GlobalAlloc for Alloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain calls into the allocator; a null return is passed on as failure.
        unsafe { block(layout, mi::mi_malloc, mi::mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { block(layout, mi::mi_zalloc, mi::mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract).
        unsafe { mi::mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (the caller's contract).
        unsafe {
            if layout.align() <= WORD {
                mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8
            } else {
                mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of every size class up to a few pages, at each alignment, come back aligned,
    /// usable over their whole length, resized with their contents kept, and freed.
    #[test]
    fn blocks_are_aligned_usable_and_resized_with_their_contents() {
        let a = Alloc;
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [1, 7, 8, 24, 100, 1024, 1025, 3000, 70_000, 5 << 20] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: the layout is non-zero in size; each block is used within its
                // size and freed once with the layout it was made with.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    std::ptr::write_bytes(p, 0xab, size);
                    let q = a.realloc(p, layout, size * 2);
                    assert_eq!(q as usize % align, 0, "resized {size} align {align}");
                    assert!((0..size).all(|i| *q.add(i) == 0xab));
                    a.dealloc(q, Layout::from_size_align(size * 2, align).unwrap());
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0);
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
