//! Bitmap size rules (mdadm's) and the write-intent bookkeeping.

use uraid_core::meta::*;

#[test]
fn size_rules() {
    // Fixture: 15 MiB per member with a 64 MiB chunk is one bit in one 4 KiB block.
    assert_eq!(bitmap_bits(30720, 64 << 20), 1);
    assert_eq!(bitmap_bytes_on_disk(30720, 64 << 20, 4096), 4096);
    assert_eq!(bitmap_bits(0, 4096), 0);
    assert_eq!(bitmap_bits(8, 4096), 1);
    assert_eq!(bitmap_bits(9, 4096), 2);
    // choose_bm_space thresholds (mdadm super1.c).
    assert_eq!(choose_bm_space(127), 0);
    assert_eq!(choose_bm_space(32768), 8);
    assert_eq!(choose_bm_space(8 * 1024 * 1024 * 2 + 8), 8);
    assert_eq!(choose_bm_space(8 * 1024 * 1024 * 2 + 9), 128);
    assert_eq!(choose_bm_space(200 * 1024 * 1024 * 2 + 128), 256);
    // Default chunk: at least 64 MiB; larger when 128 KiB of bits cannot cover it.
    assert_eq!(default_bitmap_chunk(30720, 8), Some(64 << 20));
    let ten_tib = 10u64 << 31;
    let chunk = default_bitmap_chunk(ten_tib, 256).unwrap();
    assert_eq!(chunk, 64 << 20);
    let huge = 1u64 << 40; // 512 TiB
    let chunk = default_bitmap_chunk(huge, 256).unwrap();
    assert!(bitmap_bits(huge, chunk) <= (256 * 512 - 256) * 8);
    assert!(chunk.is_power_of_two() && chunk > 64 << 20);
    assert_eq!(default_bitmap_chunk(30720, 1), None);
    // A chunk beyond u32 (what mdadm stores) is refused, not truncated.
    assert_eq!(default_bitmap_chunk(1u64 << 50, 256), None);
}

fn bitmap(sync_size: u64, chunk: u32) -> WriteIntentBitmap {
    WriteIntentBitmap::new(BitmapSuper::new([3; 16], sync_size, chunk))
}

#[test]
fn bits_are_set_and_persisted_before_the_write() {
    // 1 GiB sync size, 1 MiB chunks: 1024 bits.
    let mut bm = bitmap(1 << 21, 1 << 20);
    assert_eq!(bm.chunks(), 1024);
    assert_eq!(bm.chunk_sectors(), 2048);
    let gate = bm.start_write(0, 8);
    assert_eq!(gate.pages_to_write.len(), 1);
    let w = gate.pages_to_write[0];
    assert_eq!((w.page, w.offset_bytes), (0, 0));
    // header 256 + 128 bytes of bits, rounded to a sector
    assert_eq!(w.len_bytes, 512);
    let bytes = bm.page_bytes(&w);
    assert_eq!(bytes[BITMAP_SUPER_BYTES], 0x01, "chunk 0 is bit 0 (LSB) of the first byte");
    // A second write to the same chunk before the page is written must wait too.
    let gate2 = bm.start_write(100, 8);
    assert_eq!(gate2.pages_to_write, vec![w]);
    bm.pages_written(&gate.pages_to_write);
    // Now the bit is on disk: further writes go at once.
    assert!(bm.start_write(200, 8).pages_to_write.is_empty());
    // A write spanning chunks 2..=3.
    let g = bm.start_write(2 * 2048 + 5, 2048);
    assert_eq!(g.pages_to_write.len(), 1);
    assert!(bm.is_set(2) && bm.is_set(3) && !bm.is_set(4));
    assert_eq!(bm.page_bytes(&g.pages_to_write[0])[BITMAP_SUPER_BYTES], 0b1101);
}

#[test]
fn page_of_chunk_accounts_for_the_header() {
    assert_eq!(WriteIntentBitmap::page_of_chunk(0), 0);
    assert_eq!(WriteIntentBitmap::page_of_chunk(4096 * 8 - 2049), 0);
    assert_eq!(WriteIntentBitmap::page_of_chunk(4096 * 8 - 2048), 1);
    let mut bm = bitmap(1 << 30, 4096); // 2^27 bits
    let g = bm.start_write((4096 * 8 - 2048) * 8, 8);
    assert_eq!(g.pages_to_write[0].page, 1);
    assert_eq!(g.pages_to_write[0].offset_bytes, 4096);
    assert_eq!(g.pages_to_write[0].len_bytes, 4096);
}

/// One daemon pass then the clear its flush allows (what the array does between them).
fn daemon(bm: &mut WriteIntentBitmap, events: u64) -> Vec<BitmapPageWrite> {
    let candidates = bm.daemon_pass();
    bm.clear_flushed(&candidates, Some(events))
}

#[test]
fn bits_clear_lazily_after_two_idle_passes() {
    let mut bm = bitmap(1 << 21, 1 << 20);
    let g = bm.start_write(0, 8);
    bm.pages_written(&g.pages_to_write);
    // In flight: never cleared.
    assert!(daemon(&mut bm, 10).is_empty());
    assert!(daemon(&mut bm, 10).is_empty());
    assert!(bm.is_set(0));
    bm.end_write(0, 8, true);
    assert!(daemon(&mut bm, 10).is_empty(), "first idle pass keeps the bit");
    assert!(bm.is_set(0));
    let pages = daemon(&mut bm, 11);
    assert!(!bm.is_set(0));
    assert!(!bm.any_set());
    assert_eq!(pages.len(), 1);
    assert_eq!(bm.superblock().events_cleared, 11);
    assert_eq!(bm.page_bytes(&pages[0])[BITMAP_SUPER_BYTES], 0);
    bm.pages_written(&pages);
    assert!(daemon(&mut bm, 12).is_empty());
    // A new write during the idle period restarts the count.
    let g = bm.start_write(0, 8);
    bm.pages_written(&g.pages_to_write);
    bm.end_write(0, 8, true);
    daemon(&mut bm, 13);
    let g = bm.start_write(0, 8);
    bm.pages_written(&g.pages_to_write);
    bm.end_write(0, 8, true);
    daemon(&mut bm, 14);
    assert!(bm.is_set(0));
}

/// The daemon's candidates are cleared only after the caller's flush; a write that came
/// in between may not have been covered by that flush, so its bit stays.
#[test]
fn a_write_between_the_daemon_pass_and_its_flush_keeps_its_bit() {
    let mut bm = bitmap(1 << 21, 1 << 20);
    let g = bm.start_write(0, 8);
    bm.pages_written(&g.pages_to_write);
    bm.end_write(0, 8, true);
    assert!(bm.daemon_pass().is_empty());
    let candidates = bm.daemon_pass();
    assert_eq!(candidates, vec![0]);
    assert!(bm.is_set(0), "nothing is cleared before the flush");
    // A write starts and finishes while the flush is in flight.
    let g = bm.start_write(0, 8);
    assert!(g.pages_to_write.is_empty(), "the bit is still set on disk");
    bm.end_write(0, 8, true);
    assert!(bm.clear_flushed(&candidates, Some(5)).is_empty());
    assert!(bm.is_set(0));
}

#[test]
fn degraded_or_failed_writes_stay_dirty_until_resync() {
    let mut bm = bitmap(1 << 21, 1 << 20);
    let g = bm.start_write(5 * 2048, 16);
    bm.pages_written(&g.pages_to_write);
    bm.end_write(5 * 2048, 16, false);
    for e in 0..5 {
        daemon(&mut bm, e);
    }
    assert!(bm.is_set(5));
    assert_eq!(bm.dirty_regions(), vec![(5 * 2048, 2048)]);
    assert!(bm.needs_sync(5 * 2048, 1));
    assert!(!bm.needs_sync(0, 2048));
    bm.sync_done(5 * 2048, 2048);
    assert!(bm.dirty_regions().is_empty());
    daemon(&mut bm, 6);
    daemon(&mut bm, 7);
    assert!(!bm.is_set(5));
}

#[test]
fn load_after_crash_resyncs_only_dirty_regions() {
    let mut bm = bitmap(10 * 2048 + 100, 1 << 20); // 11 chunks, the last partial
    for c in [1u64, 2, 3, 7, 10] {
        bm.start_write(c * 2048, 1);
    }
    let area = bm.area_bytes();
    let img = BitmapImage::parse(&area).unwrap();
    assert_eq!(img.dirty_count(), 5);
    assert_eq!(img.dirty_regions(), vec![(2048, 3 * 2048), (7 * 2048, 2048), (10 * 2048, 100)]);
    // resync_offset 0 (unclean): every set bit is needed.
    let loaded = WriteIntentBitmap::from_image(img.clone(), false, 0);
    assert_eq!(loaded.dirty_regions(), img.dirty_regions());
    // Clean array: set bits are not needed, just cleared lazily.
    let clean = WriteIntentBitmap::from_image(img.clone(), false, MAX_SECTOR);
    assert!(clean.dirty_regions().is_empty());
    // Stale bitmap: everything.
    let stale = WriteIntentBitmap::from_image(img, true, 0);
    assert_eq!(stale.dirty_regions(), vec![(0, 10 * 2048 + 100)]);
}

#[test]
fn array_ranges_map_to_sync_space() {
    // raid1/raid10: identity.
    assert_eq!(array_range_to_sync_range(1, 2, 0, 100, 8), (100, 8));
    assert_eq!(array_range_to_sync_range(10, 4, 128, 100, 8), (100, 8));
    // raid5, 4 disks, 64 KiB chunks: a stripe row is 384 array sectors, 128 per member.
    assert_eq!(array_range_to_sync_range(5, 4, 128, 0, 8), (0, 128));
    assert_eq!(array_range_to_sync_range(5, 4, 128, 383, 2), (0, 256));
    assert_eq!(array_range_to_sync_range(6, 6, 128, 512, 512), (128, 128));
}

#[test]
fn a_grown_bitmap_covers_the_new_space_set_and_needed() {
    // 1 GiB with 1 MiB chunks grows to 1.5 GiB: chunks 1024..1536 are new.
    let mut bm = bitmap(1 << 21, 1 << 20);
    let pages = bm.grow(1 << 21, 3 << 20);
    assert_eq!(bm.chunks(), 1536);
    assert_eq!(bm.superblock().sync_size, 3 << 20);
    assert!(!bm.is_set(1023) && bm.is_set(1024) && bm.is_set(1535));
    assert!(bm.needs_sync(1 << 21, 2048) && !bm.needs_sync(0, 1 << 21));
    // Bits 1024..1536 are bytes 128..192 of the bits, all in page 0.
    assert_eq!(pages.iter().map(|p| p.page).collect::<Vec<_>>(), vec![0]);
    // A resync of the whole array makes them clearable again.
    bm.sync_done(0, 3 << 20);
    assert!(!bm.needs_sync(1 << 21, 2048));
}
