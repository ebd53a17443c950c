//! md on-disk metadata: superblock 1.x, the internal write-intent bitmap, the bad-block log
//! and the RAID5 partial parity log (PPL).
//!
//! Pure and sans-IO: every function takes and returns byte buffers or plain values, so
//! the same code serves `uraid create/examine/assemble`, the engine and the fuzzers.
//! The reference is the Linux kernel (md.c `super_1_load`/`super_1_validate`/
//! `super_1_sync`, md-bitmap.c) and mdadm 4.2 (super1.c, Create.c, Assemble.c, util.c);
//! the arrays in `shared/fixtures/md` are the truth where the two are in doubt.

pub mod assemble;
pub mod badblocks;
pub mod bitmap;
pub mod create;
pub mod ppl;
pub mod ppl_recover;
pub mod read;
pub mod superblock;

pub use assemble::{
    enough, plan_assembly, raid10_sizes, AssembleOptions, AssemblyError, AssemblyPlan, BitmapPlan,
    OfferedMember, RefuseReason, RefusedMember, ResyncNeed, SlotMember, StaleMember,
};
pub use badblocks::{BadBlocks, BadBlocksError, BB_MAX_LEN, MAX_BADBLOCKS};
pub use bitmap::{
    array_range_to_sync_range, bitmap_bits, bitmap_bytes_on_disk, choose_bm_space, count_dirty_bits,
    default_bitmap_chunk, min_bitmap_chunk, test_bit_le, BitmapError, BitmapImage, BitmapPageWrite,
    BitmapSuper, WriteGate, WriteIntentBitmap, BITMAP_MAGIC, BITMAP_MAJOR_HI, BITMAP_SUPER_BYTES,
};
pub use create::{
    create_array, data_offset_with_room, default_data_offset, default_layout, default_max_dev, make_set_name,
    CreateError, CreateParams, CreatedArray, CreatedBitmap, DEFAULT_CHUNK_KIB,
};
pub use ppl::{
    crc32c, crc32c_update, latest_ppl_header, ppl_area, ppl_entry_space_bytes, ppl_signature,
    ppl_usable_sectors, ppl_uses_multiple, PplEntry, PplError, PplHeader, PPL_AREA_SECTORS_SUPER1,
    PPL_HDR_MAX_ENTRIES, PPL_HEADER_SIZE, PPL_SPACE_SIZE,
};
pub use ppl_recover::{has_ppl, ppl_recover, PplParityWrite, PplRead, PplRecovery};
pub use read::{read_member, MemberMetadata};
pub use superblock::{
    calc_sb_1_csum, devflags, feature, format_uuid, level, parse_uuid, role, Superblock, SuperblockError,
    SuperblockVersion, MAX_DEV_LIMIT, MAX_SECTOR, MD_SB_MAGIC, SB_BYTES,
};
