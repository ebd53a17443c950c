//! One member's rows of a stripe head, held without copying where the bytes already exist:
//! a window (some rows) or the whole head height, over a shared buffer. A member read that
//! fills some rows is adopted as a window of its own, a write piece is a window onto the
//! request's payload (md's skip_copy), and a head that needs more rows than a window holds
//! widens it into a buffer of the full height.
//!
//! Offsets are byte ranges within the head (row r starts at r * 512), whatever the window.

use std::ops::Range;

use crate::api::IoBytes;

#[derive(Clone, Debug)]
pub(crate) struct Block {
    /// Byte offset within the head of `bytes[0]`.
    start: usize,
    bytes: IoBytes,
}

impl Block {
    /// `bytes` holding the head's byte range starting at `start`.
    pub(crate) fn window(start: usize, bytes: IoBytes) -> Self {
        Block { start, bytes }
    }

    /// The head's bytes `rg`, which this block must cover.
    pub(crate) fn rows(&self, rg: Range<usize>) -> &[u8] {
        debug_assert!(self.covers(rg.clone()), "block {:?} does not hold {rg:?}", self.span());
        &self.bytes[rg.start - self.start..rg.end - self.start]
    }

    /// Writable bytes `rg` (copy-on-write: a shared buffer is copied first, window only).
    pub(crate) fn rows_mut(&mut self, rg: Range<usize>) -> &mut [u8] {
        debug_assert!(self.covers(rg.clone()), "block {:?} does not hold {rg:?}", self.span());
        let at = self.start;
        &mut self.bytes.make_mut()[rg.start - at..rg.end - at]
    }

    /// A shared view of bytes `rg`, to carry a member write.
    pub(crate) fn view(&self, rg: Range<usize>) -> IoBytes {
        debug_assert!(self.covers(rg.clone()), "block {:?} does not hold {rg:?}", self.span());
        self.bytes.view(rg.start - self.start..rg.end - self.start)
    }

    pub(crate) fn span(&self) -> Range<usize> {
        self.start..self.start + self.bytes.len()
    }

    pub(crate) fn covers(&self, rg: Range<usize>) -> bool {
        self.start <= rg.start && rg.end <= self.start + self.bytes.len()
    }

    /// The buffer, when this block is the whole of one it alone holds (so it may be reused).
    pub(crate) fn into_sole_buffer(self) -> Option<IoBytes> {
        self.bytes.is_sole_owner().then_some(self.bytes)
    }

    /// True when the bytes are a window into a larger buffer (a request's payload): such a
    /// block pins that buffer while cached.
    pub(crate) fn borrows_larger_buffer(&self) -> bool {
        !self.bytes.is_whole()
    }

    /// Copy a window that borrows a larger buffer into a buffer of its own.
    pub(crate) fn detach(&mut self) {
        self.bytes.make_mut();
    }

    /// Copy the bytes into `whole` (a buffer of the full head height) and hold that instead;
    /// the block's former bytes come back, so their buffer can be reused.
    pub(crate) fn widen_into(&mut self, mut whole: IoBytes) -> Block {
        let span = self.span();
        whole.make_mut()[span].copy_from_slice(&self.bytes);
        std::mem::replace(self, Block { start: 0, bytes: whole })
    }
}
