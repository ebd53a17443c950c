//! md's address math: where every array sector lives on which member, per level and layout.
//!
//! Follows the kernel's `raid0.c` (`create_strip_zones`, `map_sector`), `raid10.c`
//! (`setup_geo`, `calc_sectors`, `__raid10_find_phys`) and `raid5.c`
//! (`raid5_compute_sector`, `raid6_d0`, `raid6_idx_to_slot`). All positions here are in
//! sectors relative to the member's data_offset.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    Raid0,
    Raid1,
    Raid10,
    Raid4,
    Raid5,
    Raid6,
}

impl Level {
    /// md's level number as stored in the superblock.
    pub fn md_level(self) -> i32 {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid10 => 10,
            Level::Raid4 => 4,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
        }
    }
    pub fn from_md_level(level: i32) -> Option<Level> {
        Some(match level {
            0 => Level::Raid0,
            1 => Level::Raid1,
            10 => Level::Raid10,
            4 => Level::Raid4,
            5 => Level::Raid5,
            6 => Level::Raid6,
            _ => return None,
        })
    }
    /// Parity members per stripe (md's max_degraded for raid4/5/6).
    pub fn parity_disks(self) -> usize {
        match self {
            Level::Raid4 | Level::Raid5 => 1,
            Level::Raid6 => 2,
            _ => 0,
        }
    }
    pub fn has_parity(self) -> bool {
        self.parity_disks() > 0
    }
}

/// md's raid5/6 algorithm numbers (the `layout` word for levels 4, 5, 6).
pub mod algorithm {
    pub const LEFT_ASYMMETRIC: u32 = 0;
    pub const RIGHT_ASYMMETRIC: u32 = 1;
    pub const LEFT_SYMMETRIC: u32 = 2;
    pub const RIGHT_SYMMETRIC: u32 = 3;
    pub const PARITY_0: u32 = 4;
    pub const PARITY_N: u32 = 5;
    pub const ROTATING_ZERO_RESTART: u32 = 8;
    pub const ROTATING_N_RESTART: u32 = 9;
    pub const ROTATING_N_CONTINUE: u32 = 10;
    pub const LEFT_ASYMMETRIC_6: u32 = 16;
    pub const RIGHT_ASYMMETRIC_6: u32 = 17;
    pub const LEFT_SYMMETRIC_6: u32 = 18;
    pub const RIGHT_SYMMETRIC_6: u32 = 19;
    pub const PARITY_0_6: u32 = 20;

    /// The raid6 layout whose data and P are a raid5's of `raid5_layout`, Q on a last member
    /// more (md's raid6_takeover), if md has one.
    pub fn raid6_with_q_last(raid5_layout: u32) -> Option<u32> {
        match raid5_layout {
            LEFT_ASYMMETRIC..=RIGHT_SYMMETRIC => Some(raid5_layout + LEFT_ASYMMETRIC_6),
            PARITY_0 => Some(PARITY_0_6),
            PARITY_N => Some(PARITY_N),
            _ => None,
        }
    }

    /// (name as mdadm spells it, number)
    pub const NAMES: &[(&str, u32)] = &[
        ("left-asymmetric", LEFT_ASYMMETRIC),
        ("right-asymmetric", RIGHT_ASYMMETRIC),
        ("left-symmetric", LEFT_SYMMETRIC),
        ("right-symmetric", RIGHT_SYMMETRIC),
        ("parity-first", PARITY_0),
        ("parity-last", PARITY_N),
        ("ddf-zero-restart", ROTATING_ZERO_RESTART),
        ("ddf-N-restart", ROTATING_N_RESTART),
        ("ddf-N-continue", ROTATING_N_CONTINUE),
        ("left-asymmetric-6", LEFT_ASYMMETRIC_6),
        ("right-asymmetric-6", RIGHT_ASYMMETRIC_6),
        ("left-symmetric-6", LEFT_SYMMETRIC_6),
        ("right-symmetric-6", RIGHT_SYMMETRIC_6),
        ("parity-first-6", PARITY_0_6),
    ];
}

/// md's raid0 layouts (feature RAID0_LAYOUT); they differ only with several zones.
pub const RAID0_ORIG_LAYOUT: u32 = 1;
pub const RAID0_ALT_MULTIZONE_LAYOUT: u32 = 2;

/// Parse a layout as mdadm's `--layout` takes it, for `level`, into md's layout word.
pub fn parse_layout(level: Level, text: &str) -> Result<u32, String> {
    let t = text.trim().to_ascii_lowercase();
    match level {
        Level::Raid4 | Level::Raid5 | Level::Raid6 => {
            let alias = match t.as_str() {
                "ls" => "left-symmetric",
                "la" => "left-asymmetric",
                "rs" => "right-symmetric",
                "ra" => "right-asymmetric",
                other => other,
            };
            let found = algorithm::NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(alias)).map(|&(_, v)| v);
            match found {
                Some(v) if level != Level::Raid6 && v >= algorithm::ROTATING_ZERO_RESTART => {
                    Err(format!("layout {text:?} exists only for raid6"))
                }
                Some(v) => Ok(v),
                None => Err(format!(
                    "unknown raid{} layout {text:?}; use one of left-symmetric, right-symmetric, \
                     left-asymmetric, right-asymmetric, parity-first, parity-last{}",
                    level.md_level(),
                    if level == Level::Raid6 { ", or a -6 / ddf- variant" } else { "" }
                )),
            }
        }
        Level::Raid10 => {
            let (kind, copies) = t.split_at(1);
            let n: u32 =
                copies.parse().map_err(|_| format!("raid10 layout {text:?}: expected n2, f2, o2 ..."))?;
            if !(1..=255).contains(&n) {
                return Err(format!("raid10 layout {text:?}: copies must be 1..=255"));
            }
            match kind {
                "n" => Ok(256 + n),
                "f" => Ok(1 + (n << 8)),
                "o" => Ok(0x10000 + (n << 8) + 1),
                _ => Err(format!("raid10 layout {text:?}: expected n<copies>, f<copies> or o<copies>")),
            }
        }
        Level::Raid0 => match t.as_str() {
            "original" | "orig" => Ok(RAID0_ORIG_LAYOUT),
            "alternate" | "alt" => Ok(RAID0_ALT_MULTIZONE_LAYOUT),
            _ => Err(format!("raid0 layout {text:?}: expected original or alternate")),
        },
        Level::Raid1 => Err("raid1 has no layout".into()),
    }
}

/// Human name of a layout word, as mdadm prints it.
pub fn layout_name(level: Level, layout: u32) -> String {
    match level {
        Level::Raid4 | Level::Raid5 | Level::Raid6 => algorithm::NAMES
            .iter()
            .find(|&&(_, v)| v == layout)
            .map(|(n, _)| n.to_string())
            .unwrap_or_else(|| format!("unknown({layout})")),
        Level::Raid10 => {
            let r = Raid10Geo::from_layout(layout, 255);
            match r {
                Ok(g) if g.far_offset => format!("offset={}", g.far_copies),
                Ok(g) if g.far_copies > 1 && g.near_copies == 1 => format!("far={}", g.far_copies),
                Ok(g) if g.far_copies == 1 => format!("near={}", g.near_copies),
                Ok(g) => format!("near={} far={}", g.near_copies, g.far_copies),
                Err(_) => format!("unknown({layout})"),
            }
        }
        Level::Raid0 => match layout {
            RAID0_ORIG_LAYOUT => "original".into(),
            RAID0_ALT_MULTIZONE_LAYOUT => "alternate".into(),
            _ => "-unknown-".into(),
        },
        Level::Raid1 => "-".into(),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Raid10Geo {
    near_copies: u64,
    far_copies: u64,
    far_offset: bool,
    far_set_size: u64,
}

impl Raid10Geo {
    fn from_layout(layout: u32, raid_disks: u64) -> Result<Self, String> {
        let near_copies = (layout & 0xff) as u64;
        let far_copies = ((layout >> 8) & 0xff) as u64;
        let far_offset = layout & (1 << 16) != 0;
        let far_set_size = match layout >> 17 {
            0 => raid_disks,
            1 => raid_disks / far_copies.max(1),
            2 => far_copies * near_copies,
            _ => return Err(format!("raid10 layout word {layout:#x} has unknown far-set bits")),
        };
        if near_copies == 0 || far_copies == 0 {
            return Err(format!("raid10 layout word {layout:#x} has zero copies"));
        }
        if near_copies * far_copies > raid_disks {
            return Err(format!(
                "raid10 layout needs {} copies but the array has {raid_disks} members",
                near_copies * far_copies
            ));
        }
        if far_set_size == 0 {
            return Err("raid10 far set size is zero".into());
        }
        Ok(Raid10Geo { near_copies, far_copies, far_offset, far_set_size })
    }
    fn copies(&self) -> u64 {
        self.near_copies * self.far_copies
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Raid0Zone {
    /// Array sector where the zone ends (exclusive).
    zone_end: u64,
    /// Member sector where the zone starts on each of its members.
    dev_start: u64,
    /// Members (slots) in the zone, in slot order.
    devices: Vec<usize>,
}

/// One stripe (row of chunks) of a parity level: which member plays which role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeMap {
    pub pd_idx: usize,
    pub qd_idx: Option<usize>,
    /// Member holding each data block, in logical (array address) order.
    pub data_members: Vec<usize>,
    /// Q coefficient exponent of each logical data block (md's syndrome slot).
    pub syndrome_slot: Vec<usize>,
    /// Number of syndrome slots (data blocks plus zero gaps for DDF layouts).
    pub syndrome_disks: usize,
}

impl StripeMap {
    /// P (and Q on raid6) of the data in byte range `rg` of `bufs` (one buffer per
    /// member); `zero` (at least `rg.len()` bytes) stands in for the syndrome slots no
    /// data member fills. Used by scrub's repair and by a reshape's new stripes.
    pub fn gen_parity(
        &self,
        bufs: &[Vec<u8>],
        rg: std::ops::Range<usize>,
        zero: &[u8],
        p: &mut [u8],
        q: &mut [u8],
    ) {
        let mut slots: Vec<&[u8]> = vec![&zero[..rg.len()]; self.syndrome_disks];
        for (dd, &m) in self.data_members.iter().enumerate() {
            slots[self.syndrome_slot[dd]] = &bufs[m][rg.clone()];
        }
        match self.qd_idx {
            Some(_) => uraid_parity::gen_syndrome(&slots, p, q),
            None => uraid_parity::xor_gen(&slots, p),
        }
    }
}

/// A located piece of an array range: `len_sectors` at `member_sector` on `member`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub member: usize,
    pub member_sector: u64,
    pub len_sectors: u64,
}

/// The shape of an md array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub level: Level,
    pub raid_disks: usize,
    /// md's layout word (see `algorithm`, raid10 n/f/o word, raid0 layout).
    pub layout: u32,
    /// md's chunksize in sectors; 0 for raid1.
    pub chunk_sectors: u64,
    /// Usable data sectors of each member (md's `size`, per slot; equal for all but raid0).
    pub member_sectors: Vec<u64>,
    raid0_zones: Vec<Raid0Zone>,
    raid10: Option<Raid10Geo>,
    /// raid10: sectors between far copies (md's geo.stride).
    raid10_stride: u64,
}

impl Geometry {
    /// Build and check a geometry. `member_sectors` per slot: for raid0 each member's own
    /// size; for other levels md uses the smallest.
    pub fn new(
        level: Level,
        raid_disks: usize,
        layout: u32,
        chunk_sectors: u64,
        member_sectors: &[u64],
    ) -> Result<Geometry, String> {
        if member_sectors.len() != raid_disks {
            return Err(format!("{} member sizes given for {raid_disks} raid devices", member_sectors.len()));
        }
        let min_disks = match level {
            Level::Raid0 | Level::Raid1 => 1,
            Level::Raid10 | Level::Raid4 | Level::Raid5 => 2,
            Level::Raid6 => 4,
        };
        if raid_disks < min_disks {
            return Err(format!(
                "raid{} needs at least {min_disks} members, got {raid_disks}",
                level.md_level()
            ));
        }
        if raid_disks > 1920 {
            return Err(format!("{raid_disks} members is more than md's 1920"));
        }
        if level == Level::Raid6 && raid_disks - 2 > 255 {
            return Err("raid6 supports at most 255 data members".into());
        }
        if level != Level::Raid1
            && (chunk_sectors == 0 || !chunk_sectors.is_power_of_two() || chunk_sectors < 8)
        {
            return Err(format!(
                "chunk of {chunk_sectors} sectors: md needs a power of two of at least 4 KiB"
            ));
        }
        let mut g = Geometry {
            level,
            raid_disks,
            layout,
            chunk_sectors: if level == Level::Raid1 { 0 } else { chunk_sectors },
            member_sectors: member_sectors.to_vec(),
            raid0_zones: Vec::new(),
            raid10: None,
            raid10_stride: 0,
        };
        match level {
            Level::Raid0 => {
                if layout != RAID0_ORIG_LAYOUT && layout != RAID0_ALT_MULTIZONE_LAYOUT && layout != 0 {
                    // md stores -1 (or 0) when no layout is set; both mean "only one zone is safe".
                    if layout != u32::MAX {
                        return Err(format!("raid0 layout {layout} is not original (1) or alternate (2)"));
                    }
                }
                for s in g.member_sectors.iter_mut() {
                    *s -= *s % chunk_sectors;
                }
                g.raid0_zones = raid0_zones(&g.member_sectors);
                if g.raid0_zones.len() > 1
                    && layout != RAID0_ORIG_LAYOUT
                    && layout != RAID0_ALT_MULTIZONE_LAYOUT
                {
                    return Err("raid0 members differ in size but no layout (original/alternate) is set; \
                                md refuses to guess: assemble with an explicit --layout"
                        .into());
                }
            }
            Level::Raid10 => {
                let geo = Raid10Geo::from_layout(layout, raid_disks as u64)?;
                let min = *g.member_sectors.iter().min().unwrap_or(&0);
                // md's calc_sectors: chunks per device used, then the far stride.
                let mut size = min / chunk_sectors;
                size /= geo.far_copies;
                size *= raid_disks as u64;
                size /= geo.near_copies;
                size *= geo.copies();
                size = size.div_ceil(raid_disks as u64);
                g.raid10_stride =
                    if geo.far_offset { chunk_sectors } else { (size / geo.far_copies) * chunk_sectors };
                g.raid10 = Some(geo);
                let used = min - min % chunk_sectors;
                g.member_sectors.iter_mut().for_each(|s| *s = used);
            }
            Level::Raid1 => {
                let min = *g.member_sectors.iter().min().unwrap_or(&0);
                g.member_sectors.iter_mut().for_each(|s| *s = min);
            }
            Level::Raid4 | Level::Raid5 | Level::Raid6 => {
                if level == Level::Raid4 && layout != algorithm::PARITY_N && layout != algorithm::PARITY_0 {
                    // md treats raid4 as parity-last whatever the word says; keep the word.
                }
                if level == Level::Raid5 && !matches!(layout, 0..=5) {
                    return Err(format!("raid5 layout {layout} is not one of md's six"));
                }
                if level == Level::Raid6 && !matches!(layout, 0..=5 | 8..=10 | 16..=20) {
                    return Err(format!("raid6 layout {layout} is not one of md's"));
                }
                let min = *g.member_sectors.iter().min().unwrap_or(&0);
                let used = min - min % chunk_sectors;
                g.member_sectors.iter_mut().for_each(|s| *s = used);
            }
        }
        if g.array_sectors() == 0 {
            return Err("members are too small to hold one chunk".into());
        }
        Ok(g)
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_sectors * 512
    }

    /// Data members per stripe (raid4/5/6), or members striped over (raid0).
    pub fn data_disks(&self) -> usize {
        self.raid_disks - self.level.parity_disks()
    }

    /// How many members may be lost without losing data (best case for raid10).
    pub fn redundancy(&self) -> usize {
        match self.level {
            Level::Raid0 => 0,
            Level::Raid1 => self.raid_disks - 1,
            Level::Raid10 => self.raid10.map(|g| g.copies() as usize - 1).unwrap_or(0),
            l => l.parity_disks(),
        }
    }

    /// Array size in sectors, as md computes it.
    pub fn array_sectors(&self) -> u64 {
        match self.level {
            Level::Raid0 => self.raid0_zones.last().map(|z| z.zone_end).unwrap_or(0),
            Level::Raid1 => self.member_sectors[0],
            Level::Raid10 => {
                let geo = self.raid10.expect("raid10 geometry");
                let mut size = self.member_sectors[0] / self.chunk_sectors;
                size /= geo.far_copies;
                size *= self.raid_disks as u64;
                size /= geo.near_copies;
                size * self.chunk_sectors
            }
            _ => self.member_sectors[0] * self.data_disks() as u64,
        }
    }

    pub fn array_bytes(&self) -> u64 {
        self.array_sectors() * 512
    }

    /// Sectors of one full stripe's data (raid4/5/6): data_disks chunks.
    pub fn stripe_data_sectors(&self) -> u64 {
        self.chunk_sectors * self.data_disks() as u64
    }

    /// Member roles of parity stripe `stripe` (raid4/5/6 only).
    pub fn stripe_map(&self, stripe: u64) -> StripeMap {
        use algorithm::*;
        let n = self.raid_disks;
        let nn = n as u64;
        let data_disks = self.data_disks();
        let mut ddf = false;
        let (pd, qd, members): (usize, Option<usize>, Vec<usize>) = match self.level {
            Level::Raid4 => (data_disks, None, (0..data_disks).collect()),
            Level::Raid5 => {
                let (pd, f): (usize, Box<dyn Fn(usize) -> usize>) = match self.layout {
                    LEFT_ASYMMETRIC => {
                        let pd = data_disks - (stripe % nn) as usize;
                        (pd, Box::new(move |d| if d >= pd { d + 1 } else { d }))
                    }
                    RIGHT_ASYMMETRIC => {
                        let pd = (stripe % nn) as usize;
                        (pd, Box::new(move |d| if d >= pd { d + 1 } else { d }))
                    }
                    LEFT_SYMMETRIC => {
                        let pd = data_disks - (stripe % nn) as usize;
                        (pd, Box::new(move |d| (pd + 1 + d) % n))
                    }
                    RIGHT_SYMMETRIC => {
                        let pd = (stripe % nn) as usize;
                        (pd, Box::new(move |d| (pd + 1 + d) % n))
                    }
                    PARITY_0 => (0, Box::new(|d| d + 1)),
                    _ => (data_disks, Box::new(|d| d)),
                };
                (pd, None, (0..data_disks).map(f).collect())
            }
            Level::Raid6 => {
                let asym = |pd: usize| -> (usize, Vec<usize>) {
                    if pd == n - 1 {
                        (0, (0..data_disks).map(|d| d + 1).collect())
                    } else {
                        (pd + 1, (0..data_disks).map(|d| if d >= pd { d + 2 } else { d }).collect())
                    }
                };
                let m1 = nn - 1;
                match self.layout {
                    LEFT_ASYMMETRIC => {
                        let pd = n - 1 - (stripe % nn) as usize;
                        let (qd, m) = asym(pd);
                        (pd, Some(qd), m)
                    }
                    RIGHT_ASYMMETRIC => {
                        let pd = (stripe % nn) as usize;
                        let (qd, m) = asym(pd);
                        (pd, Some(qd), m)
                    }
                    LEFT_SYMMETRIC => {
                        let pd = n - 1 - (stripe % nn) as usize;
                        (pd, Some((pd + 1) % n), (0..data_disks).map(|d| (pd + 2 + d) % n).collect())
                    }
                    RIGHT_SYMMETRIC => {
                        let pd = (stripe % nn) as usize;
                        (pd, Some((pd + 1) % n), (0..data_disks).map(|d| (pd + 2 + d) % n).collect())
                    }
                    PARITY_0 => (0, Some(1), (0..data_disks).map(|d| d + 2).collect()),
                    PARITY_N => (data_disks, Some(data_disks + 1), (0..data_disks).collect()),
                    ROTATING_ZERO_RESTART => {
                        ddf = true;
                        let pd = (stripe % nn) as usize;
                        let (qd, m) = asym(pd);
                        (pd, Some(qd), m)
                    }
                    ROTATING_N_RESTART => {
                        ddf = true;
                        let pd = n - 1 - ((stripe + 1) % nn) as usize;
                        let (qd, m) = asym(pd);
                        (pd, Some(qd), m)
                    }
                    ROTATING_N_CONTINUE => {
                        ddf = true;
                        let pd = n - 1 - (stripe % nn) as usize;
                        (pd, Some((pd + n - 1) % n), (0..data_disks).map(|d| (pd + 1 + d) % n).collect())
                    }
                    LEFT_ASYMMETRIC_6 => {
                        let pd = data_disks - (stripe % m1) as usize;
                        (pd, Some(n - 1), (0..data_disks).map(|d| if d >= pd { d + 1 } else { d }).collect())
                    }
                    RIGHT_ASYMMETRIC_6 => {
                        let pd = (stripe % m1) as usize;
                        (pd, Some(n - 1), (0..data_disks).map(|d| if d >= pd { d + 1 } else { d }).collect())
                    }
                    LEFT_SYMMETRIC_6 => {
                        let pd = data_disks - (stripe % m1) as usize;
                        (pd, Some(n - 1), (0..data_disks).map(|d| (pd + 1 + d) % (n - 1)).collect())
                    }
                    RIGHT_SYMMETRIC_6 => {
                        let pd = (stripe % m1) as usize;
                        (pd, Some(n - 1), (0..data_disks).map(|d| (pd + 1 + d) % (n - 1)).collect())
                    }
                    _ /* PARITY_0_6 */ => (0, Some(n - 1), (0..data_disks).map(|d| d + 1).collect()),
                }
            }
            _ => panic!("stripe_map is for raid4/5/6"),
        };
        let (syndrome_slot, syndrome_disks) = match qd {
            None => ((0..data_disks).collect(), data_disks),
            // DDF counts every position from disk 0, P and Q positions being zero blocks.
            Some(_) if ddf => (members.clone(), n),
            Some(q) => {
                // md walks the disks cyclically from the one after Q; data get slots in that order.
                let d0 = if q == n - 1 { 0 } else { q + 1 };
                let slots = members.iter().map(|&m| (m + n - d0) % n).collect::<Vec<_>>();
                // Distances from d0 skip P and Q; compress them to consecutive slots.
                let mut order: Vec<usize> = (0..data_disks).collect();
                order.sort_by_key(|&i| slots[i]);
                let mut slot_of = vec![0; data_disks];
                for (rank, &i) in order.iter().enumerate() {
                    slot_of[i] = rank;
                }
                (slot_of, data_disks)
            }
        };
        StripeMap { pd_idx: pd, qd_idx: qd, data_members: members, syndrome_slot, syndrome_disks }
    }

    /// Split the array range [sector, sector+len) into per-member extents of the *primary*
    /// copy (raid0/4/5/6: the only data copy; raid1: member 0; raid10: the first copy).
    /// Each extent stays within one chunk.
    pub fn map_range(&self, sector: u64, len_sectors: u64, out: &mut Vec<(u64, Extent)>) {
        let mut pos = sector;
        let end = sector + len_sectors;
        while pos < end {
            let (ext, room) = self.map_sector(pos);
            let len = room.min(end - pos);
            out.push((pos, Extent { len_sectors: len, ..ext }));
            pos += len;
        }
    }

    /// Primary location of array `sector`, and how many sectors from it stay contiguous.
    pub fn map_sector(&self, sector: u64) -> (Extent, u64) {
        match self.level {
            Level::Raid1 => {
                (Extent { member: 0, member_sector: sector, len_sectors: 1 }, self.member_sectors[0] - sector)
            }
            Level::Raid0 => self.raid0_map(sector),
            Level::Raid10 => {
                let mut copies = Vec::with_capacity(4);
                self.raid10_copies(sector, &mut copies);
                let room = self.chunk_sectors - sector % self.chunk_sectors;
                (Extent { len_sectors: 1, ..copies[0] }, room)
            }
            _ => {
                let (stripe, dd, off) = self.parity_locate(sector);
                let map = self.stripe_map(stripe);
                let room = self.chunk_sectors - off;
                (
                    Extent {
                        member: map.data_members[dd],
                        member_sector: stripe * self.chunk_sectors + off,
                        len_sectors: 1,
                    },
                    room,
                )
            }
        }
    }

    /// raid4/5/6: (stripe number, logical data index, sector offset in chunk) of an array sector.
    pub fn parity_locate(&self, sector: u64) -> (u64, usize, u64) {
        let chunk_number = sector / self.chunk_sectors;
        let off = sector % self.chunk_sectors;
        let dd = self.data_disks() as u64;
        (chunk_number / dd, (chunk_number % dd) as usize, off)
    }

    fn raid0_map(&self, sector: u64) -> (Extent, u64) {
        let zi = self.raid0_zones.partition_point(|z| z.zone_end <= sector);
        let zone = &self.raid0_zones[zi];
        let zone_start = if zi == 0 { 0 } else { self.raid0_zones[zi - 1].zone_end };
        let in_zone = sector - zone_start;
        let nb = zone.devices.len() as u64;
        let c = self.chunk_sectors;
        let chunk_in_dev = in_zone / (nb * c);
        let which = if self.layout == RAID0_ALT_MULTIZONE_LAYOUT { in_zone / c } else { sector / c } % nb;
        let sect_in_chunk = in_zone % c;
        (
            Extent {
                member: zone.devices[which as usize],
                member_sector: zone.dev_start + chunk_in_dev * c + sect_in_chunk,
                len_sectors: 1,
            },
            c - sect_in_chunk,
        )
    }

    /// Every copy of array `sector` (raid1: all members; raid10: md's copies in md's order;
    /// other levels: the one data location).
    pub fn copies(&self, sector: u64, out: &mut Vec<Extent>) {
        out.clear();
        match self.level {
            Level::Raid1 => out.extend((0..self.raid_disks).map(|m| Extent {
                member: m,
                member_sector: sector,
                len_sectors: 1,
            })),
            Level::Raid10 => self.raid10_copies(sector, out),
            _ => out.push(self.map_sector(sector).0),
        }
    }

    fn raid10_copies(&self, sector: u64, out: &mut Vec<Extent>) {
        let geo = self.raid10.expect("raid10 geometry");
        let c = self.chunk_sectors;
        let n = self.raid_disks as u64;
        let chunk = (sector / c) * geo.near_copies;
        let mut in_dev = sector % c;
        let mut stripe = chunk / n;
        let mut dev = chunk % n;
        if geo.far_offset {
            stripe *= geo.far_copies;
        }
        in_dev += stripe * c;
        let last_far_set_start = (n / geo.far_set_size - 1) * geo.far_set_size;
        let last_far_set_size = geo.far_set_size + n % geo.far_set_size;
        for _ in 0..geo.near_copies {
            let mut d = dev;
            let mut s = in_dev;
            out.push(Extent { member: d as usize, member_sector: s, len_sectors: 1 });
            for _ in 1..geo.far_copies {
                let set = d / geo.far_set_size;
                d += geo.near_copies;
                if !n.is_multiple_of(geo.far_set_size) && d > last_far_set_start {
                    d -= last_far_set_start;
                    d %= last_far_set_size;
                    d += last_far_set_start;
                } else {
                    d %= geo.far_set_size;
                    d += geo.far_set_size * set;
                }
                s += self.raid10_stride;
                out.push(Extent { member: d as usize, member_sector: s, len_sectors: 1 });
            }
            dev += 1;
            if dev >= n {
                dev = 0;
                in_dev += c;
            }
        }
    }
}

fn raid0_zones(member_sectors: &[u64]) -> Vec<Raid0Zone> {
    let mut zones = Vec::new();
    let mut dev_start = 0u64;
    let mut zone_end = 0u64;
    loop {
        let devices: Vec<usize> =
            (0..member_sectors.len()).filter(|&m| member_sectors[m] > dev_start).collect();
        if devices.is_empty() {
            break;
        }
        let smallest = devices.iter().map(|&m| member_sectors[m]).min().unwrap_or(0);
        zone_end += (smallest - dev_start) * devices.len() as u64;
        zones.push(Raid0Zone { zone_end, dev_start, devices });
        dev_start = smallest;
    }
    zones
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(level: Level, n: usize, layout: u32, chunk: u64, size: u64) -> Geometry {
        Geometry::new(level, n, layout, chunk, &vec![size; n]).unwrap()
    }

    #[test]
    fn raid5_left_symmetric_rotates_parity_leftwards() {
        let geo = g(Level::Raid5, 4, algorithm::LEFT_SYMMETRIC, 128, 1 << 20);
        let m = geo.stripe_map(0);
        assert_eq!((m.pd_idx, m.data_members.clone()), (3, vec![0, 1, 2]));
        let m = geo.stripe_map(1);
        assert_eq!((m.pd_idx, m.data_members.clone()), (2, vec![3, 0, 1]));
    }

    #[test]
    fn raid6_syndrome_slots_follow_physical_walk_after_q() {
        let geo = g(Level::Raid6, 6, algorithm::LEFT_ASYMMETRIC, 128, 1 << 20);
        for stripe in 0..12 {
            let m = geo.stripe_map(stripe);
            let q = m.qd_idx.unwrap();
            let d0 = if q == 5 { 0 } else { q + 1 };
            let mut walk = Vec::new();
            for i in 0..6 {
                let d = (d0 + i) % 6;
                if let Some(dd) = m.data_members.iter().position(|&x| x == d) {
                    walk.push(dd);
                }
            }
            for (slot, dd) in walk.iter().enumerate() {
                assert_eq!(m.syndrome_slot[*dd], slot);
            }
        }
    }

    #[test]
    fn every_layout_maps_each_member_once_per_stripe() {
        for (level, layouts) in [
            (Level::Raid5, vec![0u32, 1, 2, 3, 4, 5]),
            (Level::Raid6, vec![0, 1, 2, 3, 4, 5, 8, 9, 10, 16, 17, 18, 19, 20]),
        ] {
            for layout in layouts {
                for n in [4usize, 5, 7] {
                    let geo = g(level, n, layout, 16, 4096);
                    for stripe in 0..3 * n as u64 {
                        let m = geo.stripe_map(stripe);
                        let mut seen = vec![false; n];
                        for &d in m.data_members.iter().chain([m.pd_idx].iter()).chain(m.qd_idx.iter()) {
                            assert!(!seen[d], "{level:?} layout {layout} n {n} stripe {stripe}: {m:?}");
                            seen[d] = true;
                        }
                        assert!(seen.iter().all(|&s| s));
                        let mut slots = m.syndrome_slot.clone();
                        slots.sort();
                        slots.dedup();
                        assert_eq!(slots.len(), m.data_members.len());
                    }
                }
            }
        }
    }

    #[test]
    fn raid0_multizone_is_a_bijection() {
        for layout in [RAID0_ORIG_LAYOUT, RAID0_ALT_MULTIZONE_LAYOUT] {
            let sizes = [64u64, 160, 96];
            let geo = Geometry::new(Level::Raid0, 3, layout, 16, &sizes).unwrap();
            assert_eq!(geo.array_sectors(), 64 * 3 + 32 * 2 + 64);
            let mut seen = std::collections::HashSet::new();
            for s in 0..geo.array_sectors() {
                let (e, _) = geo.map_sector(s);
                assert!(e.member_sector < sizes[e.member]);
                assert!(seen.insert((e.member, e.member_sector)));
            }
        }
    }

    #[test]
    fn raid10_layouts_place_copies_on_distinct_members() {
        for (layout, n) in
            [("n2", 4), ("n2", 5), ("n3", 6), ("f2", 4), ("f2", 5), ("o2", 4), ("o3", 5), ("f3", 7)]
        {
            let word = parse_layout(Level::Raid10, layout).unwrap();
            let geo = g(Level::Raid10, n, word, 16, 1024);
            let mut seen = std::collections::HashSet::new();
            let mut out = Vec::new();
            for s in 0..geo.array_sectors() {
                geo.copies(s, &mut out);
                let mut members: Vec<_> = out.iter().map(|e| e.member).collect();
                members.sort();
                members.dedup();
                assert_eq!(members.len(), out.len(), "{layout} n={n} sector {s}: {out:?}");
                for e in &out {
                    assert!(e.member_sector < 1024, "{layout} {e:?}");
                    assert!(seen.insert((e.member, e.member_sector)), "{layout} n={n} reuse {e:?}");
                }
            }
        }
    }

    #[test]
    fn layouts_parse_as_mdadm_words() {
        assert_eq!(parse_layout(Level::Raid10, "n2"), Ok(0x102));
        assert_eq!(parse_layout(Level::Raid10, "f2"), Ok(0x201));
        assert_eq!(parse_layout(Level::Raid10, "o2"), Ok(0x10201));
        assert_eq!(parse_layout(Level::Raid5, "ls"), Ok(2));
        assert_eq!(parse_layout(Level::Raid6, "parity-first-6"), Ok(20));
        assert!(parse_layout(Level::Raid5, "ddf-N-continue").is_err());
        assert!(parse_layout(Level::Raid5, "bogus").is_err());
    }
}
