//! What the members hold, read member by member beside the engine: md's consistency of a
//! whole array (every stripe's P and Q match its data, every mirror copy matches md's first
//! copy) and each array sector as its primary location holds it. A check through the
//! engine alone could be answered from its stripe cache; these read what the disks hold.
//! A sector a member's bad-block log lists holds nothing by md's account (its write
//! failed): rows with one are left out.

use uraid_core::{Geometry, Level};

use crate::disks::SimDisks;
use crate::meta::member_metadata;

const SECTOR: u64 = 512;

/// Per slot, the data sectors its member's bad-block log lists, as data-relative [start, end).
struct BadRows(Vec<Vec<(u64, u64)>>);

impl BadRows {
    fn read(disks: &SimDisks, slots: &[usize], data_offset_bytes: u64) -> BadRows {
        let first = data_offset_bytes / SECTOR;
        BadRows(
            slots
                .iter()
                .map(|&m| {
                    let bb = member_metadata(disks, m).bad_blocks.ok().flatten();
                    bb.map(|bb| {
                        bb.entries()
                            .map(|(s, l)| (s.saturating_sub(first), (s + l).saturating_sub(first)))
                            .collect()
                    })
                    .unwrap_or_default()
                })
                .collect(),
        )
    }

    fn listed(&self, member: usize, member_sector: u64) -> bool {
        self.0.get(member).is_some_and(|r| r.iter().any(|&(a, b)| a <= member_sector && member_sector < b))
    }
}

/// Compares every mirror copy, or every stripe's parity with its data, on the members
/// themselves. Call on an array with every member in sync and no resync owed. `slots` names
/// the disk in each slot (a hot spare or a replacement may hold one).
pub fn members_agree(
    disks: &SimDisks,
    slots: &[usize],
    geo: &Geometry,
    data_offset_bytes: u64,
) -> Result<(), String> {
    let bad = BadRows::read(disks, slots, data_offset_bytes);
    let disks = Slots { disks, slots };
    match geo.level {
        Level::Raid0 => Ok(()),
        Level::Raid1 | Level::Raid10 => mirrors_agree(disks, geo, data_offset_bytes, &bad),
        Level::Raid4 | Level::Raid5 | Level::Raid6 => parity_agrees(disks, geo, data_offset_bytes, &bad),
    }
}

/// The first sector where `a` and `b` differ, skipping those `skip` says.
fn first_difference_but(a: &[u8], b: &[u8], skip: impl Fn(u64) -> bool) -> Option<u64> {
    a.chunks(SECTOR as usize)
        .zip(b.chunks(SECTOR as usize))
        .enumerate()
        .find(|(k, (x, y))| x != y && !skip(*k as u64))
        .map(|(k, _)| k as u64)
}

/// The disks as the array's slots reach them.
#[derive(Clone, Copy)]
struct Slots<'a> {
    disks: &'a SimDisks,
    slots: &'a [usize],
}

fn read(disks: Slots, slot: usize, member_sector: u64, sectors: u64, data_offset_bytes: u64) -> Vec<u8> {
    let mut buf = vec![0u8; (sectors * SECTOR) as usize];
    disks.disks.store(disks.slots[slot]).peek(data_offset_bytes + member_sector * SECTOR, &mut buf);
    buf
}

fn mirrors_agree(disks: Slots, geo: &Geometry, data_offset_bytes: u64, bad: &BadRows) -> Result<(), String> {
    let sectors = geo.array_sectors();
    let mut copies = Vec::new();
    let mut s = 0;
    while s < sectors {
        // A run stays contiguous on every copy up to the chunk's end (raid1: at most 1 MiB
        // at a time).
        let room = geo.map_sector(s).1.min(2048);
        let len = room.min(sectors - s);
        geo.copies(s, &mut copies);
        let first = read(disks, copies[0].member, copies[0].member_sector, len, data_offset_bytes);
        for c in &copies[1..] {
            let other = read(disks, c.member, c.member_sector, len, data_offset_bytes);
            let skip = |k: u64| {
                bad.listed(copies[0].member, copies[0].member_sector + k)
                    || bad.listed(c.member, c.member_sector + k)
            };
            if let Some(k) = first_difference_but(&first, &other, skip) {
                return Err(format!(
                    "array sector {} differs between member {} (sector {}) and member {} (sector {})",
                    s + k,
                    copies[0].member,
                    copies[0].member_sector,
                    c.member,
                    c.member_sector
                ));
            }
        }
        s += len;
    }
    Ok(())
}

fn parity_agrees(disks: Slots, geo: &Geometry, data_offset_bytes: u64, bad: &BadRows) -> Result<(), String> {
    let kernel = uraid_parity::selected_kernel();
    let chunk = geo.chunk_sectors;
    let stripes = geo.array_sectors() / geo.stripe_data_sectors();
    let bytes = (chunk * SECTOR) as usize;
    for stripe in 0..stripes {
        let map = geo.stripe_map(stripe);
        let at = stripe * chunk;
        let mut members: Vec<usize> = map.data_members.clone();
        members.push(map.pd_idx);
        members.extend(map.qd_idx);
        let skip = |k: u64| members.iter().any(|&m| bad.listed(m, at + k));
        let data: Vec<Vec<u8>> =
            map.data_members.iter().map(|&m| read(disks, m, at, chunk, data_offset_bytes)).collect();
        let p_held = read(disks, map.pd_idx, at, chunk, data_offset_bytes);
        let mut p = vec![0u8; bytes];
        match map.qd_idx {
            None => {
                let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
                kernel.xor_gen(&refs, &mut p);
            }
            Some(qd) => {
                // Syndrome slots in md's order; DDF layouts leave zero blocks in the gaps.
                let zero = vec![0u8; bytes];
                let mut slots: Vec<&[u8]> = vec![&zero; map.syndrome_disks];
                for (dd, block) in data.iter().enumerate() {
                    slots[map.syndrome_slot[dd]] = block;
                }
                let mut q = vec![0u8; bytes];
                kernel.gen_syndrome(&slots, &mut p, &mut q);
                let q_held = read(disks, qd, at, chunk, data_offset_bytes);
                if let Some(k) = first_difference_but(&q, &q_held, skip) {
                    return Err(format!(
                        "stripe {stripe}: Q on member {qd} disagrees with the data at member sector {}",
                        at + k
                    ));
                }
            }
        }
        if let Some(k) = first_difference_but(&p, &p_held, skip) {
            return Err(format!(
                "stripe {stripe}: P on member {} disagrees with the data at member sector {}",
                map.pd_idx,
                at + k
            ));
        }
    }
    Ok(())
}

/// A 64-bit digest of one 512-byte sector (to compare array images without keeping them).
pub fn sector_digest(sector: &[u8]) -> u64 {
    // Four independent lanes (no chain through every word), folded at the end.
    let mut lanes =
        [0x9e37_79b9_7f4a_7c15u64, 0xc2b2_ae3d_27d4_eb4f, 0x1656_67b1_9e37_79f9, 0x27d4_eb2f_1656_67c5];
    for (k, w) in sector.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        let l = &mut lanes[k & 3];
        *l = (*l ^ v).wrapping_mul(0x0100_0000_01b3);
    }
    lanes.iter().fold(0u64, |h, &l| (h ^ l).wrapping_mul(0xff51_afd7_ed55_8ccd).rotate_left(31))
}

/// Every array sector's digest as its primary location (md's first copy, or its data
/// block) holds it; None where that location is listed bad. `slots` as for [`members_agree`].
pub fn direct_digests(
    disks: &SimDisks,
    slots: &[usize],
    geo: &Geometry,
    data_offset_bytes: u64,
) -> Vec<Option<u64>> {
    let bad = BadRows::read(disks, slots, data_offset_bytes);
    let disks = Slots { disks, slots };
    let sectors = geo.array_sectors();
    let mut out = Vec::with_capacity(sectors as usize);
    let mut s = 0;
    while s < sectors {
        let (at, room) = geo.map_sector(s);
        let len = room.min(2048).min(sectors - s);
        let buf = read(disks, at.member, at.member_sector, len, data_offset_bytes);
        out.extend(
            buf.chunks(SECTOR as usize).enumerate().map(|(k, b)| {
                (!bad.listed(at.member, at.member_sector + k as u64)).then(|| sector_digest(b))
            }),
        );
        s += len;
    }
    out
}
