//! Assembly over superblocks cut from arbitrary bytes: a plan or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uraid_core::meta::{
    calc_sb_1_csum, plan_assembly, AssembleOptions, OfferedMember, Superblock, SuperblockVersion,
};

fuzz_target!(|data: &[u8]| {
    let mut members = Vec::new();
    for (i, chunk) in data.chunks(512).take(8).enumerate() {
        let mut buf = chunk.to_vec();
        buf.resize(512, 0);
        // Fix the checksum half the time so the later checks and the planner are reached.
        if buf[0] & 1 == 0 {
            let max_dev = u32::from_le_bytes(buf[220..224].try_into().unwrap()).min(128);
            buf[220..224].copy_from_slice(&max_dev.to_le_bytes());
            let c = calc_sb_1_csum(&buf, max_dev);
            buf[216..220].copy_from_slice(&c.to_le_bytes());
        }
        let dev_sectors = 1 << 16;
        members.push(OfferedMember {
            name: format!("m{i}"),
            dev_sectors,
            superblock: Superblock::parse_member(&buf, SuperblockVersion::V1_2, dev_sectors),
            bitmap: None,
        });
    }
    let run = data.first().is_some_and(|b| b & 2 != 0);
    if let Ok(plan) = plan_assembly(&members, &AssembleOptions { run, uuid: None, force: false }) {
        assert_eq!(plan.slots.len(), plan.raid_disks as usize);
    }
});
