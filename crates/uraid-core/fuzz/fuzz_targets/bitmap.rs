//! Bitmap superblock and bit array parsing, then the bookkeeping loaded from it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uraid_core::meta::{BitmapImage, BitmapSuper, WriteIntentBitmap};

fuzz_target!(|data: &[u8]| {
    if let Ok(sb) = BitmapSuper::parse(data) {
        assert_eq!(BitmapSuper::parse(&sb.serialize()).as_ref(), Ok(&sb));
        let _ = sb.check_against_array(&[0; 16], u64::from(data[24]));
    }
    if let Ok(img) = BitmapImage::parse(data) {
        // Keep the in-memory bookkeeping small enough for the fuzzer.
        if img.sb.bits() > 1 << 20 {
            return;
        }
        let _ = img.dirty_regions();
        let _ = img.dirty_count();
        let mut bm = WriteIntentBitmap::from_image(img, data[30] & 1 == 1, u64::from(data[31]));
        let span = bm.chunks().saturating_mul(bm.chunk_sectors());
        let start = u64::from(data[40]).saturating_mul(bm.chunk_sectors()) % span.max(1);
        let gate = bm.start_write(start, 8);
        for w in &gate.pages_to_write {
            let _ = bm.page_bytes(w);
        }
        bm.pages_written(&gate.pages_to_write);
        bm.end_write(start, 8, data[41] & 1 == 1);
        let c = bm.daemon_pass();
        let _ = bm.clear_flushed(&c, Some(1));
        let c = bm.daemon_pass();
        let _ = bm.clear_flushed(&c, Some(2));
        let _ = bm.dirty_regions();
    }
});
