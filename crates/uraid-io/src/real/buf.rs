//! Aligned buffers for O_DIRECT, which needs memory aligned to the logical block size.

use std::alloc::{alloc, dealloc, Layout};

pub struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// Uninitialised contents; capacity rounded up to `align`.
    pub fn new(len: usize, align: usize) -> Self {
        let size = len.max(1).div_ceil(align) * align;
        let layout = Layout::from_size_align(size, align).expect("aligned buffer layout");
        // SAFETY: size > 0.
        let ptr = unsafe { alloc(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, layout }
    }
    pub fn capacity(&self) -> usize {
        self.layout.size()
    }
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    /// The bytes; may hold stale data from an earlier use (never uninitialised after the
    /// first write by the kernel, and callers only read what an I/O filled).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity bytes; u8 has no invalid bit patterns and the
        // executor only reads ranges the kernel filled.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusive through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}
