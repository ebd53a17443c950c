//! Any bytes at any superblock position, for any device size: an error or a superblock
//! that serializes back to something that parses to itself. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uraid_core::meta::{Superblock, SuperblockVersion};

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let (head, buf) = data.split_at(9);
    let dev_sectors = u64::from_le_bytes(head[..8].try_into().unwrap());
    let version = match head[8] % 3 {
        0 => SuperblockVersion::V1_0,
        1 => SuperblockVersion::V1_1,
        _ => SuperblockVersion::V1_2,
    };
    let _ = Superblock::parse(buf, u64::from(head[8]));
    if let Ok(sb) = Superblock::parse_member(buf, version, dev_sectors) {
        let _ = sb.name();
        let _ = sb.bitmap_sector();
        let _ = sb.slot();
        let again = Superblock::parse_member(&sb.serialize(), version, dev_sectors);
        assert_eq!(again.as_ref(), Ok(&sb));
    }
});
