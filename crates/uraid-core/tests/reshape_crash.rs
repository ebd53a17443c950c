//! Power loss at every member I/O of a grow uraid runs: writes not yet flushed are lost
//! (every other one lands, the odd or the even ones by the cut's place), the members are
//! assembled again from what is on them, the reshape continues from the checkpoint
//! found, and the array reads back every byte it held before the grow. Under test: the
//! order `continue_reshape` keeps (window writes flushed before the checkpoint round, that
//! round flushed before the next window), md's `reshape_safe` rule for the window size,
//! and assembly after a cut inside a superblock round (the rounds starting and ending the
//! reshape too), for grows by a member, raid5 to raid6 and chunk changes.

use uraid_core::geometry::Geometry;
use uraid_core::meta::*;
use uraid_core::reshape::run::{continue_reshape, ReshapeMembers, ReshapeProgress, ReshapeRun};
use uraid_core::reshape::start::{start_grow, start_restripe, GrowMember, Restripe};

const DEV_SECTORS: u64 = 4096;

/// Devices with a volatile write cache: writes wait in `pending` until a flush.
struct Devs {
    durable: Vec<Vec<u8>>,
    pending: Vec<Vec<(usize, Vec<u8>)>>,
    ios: usize,
    crash_at: Option<usize>,
}

impl Devs {
    fn tick(&mut self) -> std::io::Result<()> {
        self.ios += 1;
        if self.crash_at.is_some_and(|c| self.ios > c) {
            return Err(std::io::Error::other("power cut"));
        }
        Ok(())
    }

    /// The power goes: every other unflushed write lands, the odd ones or the even ones
    /// by `salt`.
    fn cut(&mut self, salt: usize) {
        for (m, list) in self.pending.iter_mut().enumerate() {
            for (i, (at, data)) in list.drain(..).enumerate() {
                if (i + salt).is_multiple_of(2) {
                    self.durable[m][at..at + data.len()].copy_from_slice(&data);
                }
            }
        }
    }
}

impl ReshapeMembers for Devs {
    fn read(&mut self, member: usize, device_sector: u64, len_sectors: u64) -> std::io::Result<Vec<u8>> {
        self.tick()?;
        let at = (device_sector * 512) as usize;
        let mut b = self.durable[member][at..at + (len_sectors * 512) as usize].to_vec();
        for (w_at, data) in &self.pending[member] {
            let (lo, hi) = ((*w_at).max(at), (w_at + data.len()).min(at + b.len()));
            if lo < hi {
                b[lo - at..hi - at].copy_from_slice(&data[lo - w_at..hi - w_at]);
            }
        }
        Ok(b)
    }
    fn write(&mut self, member: usize, device_sector: u64, data: &[u8]) -> std::io::Result<()> {
        self.tick()?;
        self.pending[member].push(((device_sector * 512) as usize, data.to_vec()));
        Ok(())
    }
    fn flush(&mut self, member: usize) -> std::io::Result<()> {
        self.tick()?;
        for (at, data) in std::mem::take(&mut self.pending[member]) {
            self.durable[member][at..at + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }
}

/// The members with a superblock, in slot order: a new member the cut left without one
/// (before anything else was written) is left out, as its user would.
fn superblocks(devs: &Devs) -> Vec<OfferedMember> {
    devs.durable
        .iter()
        .enumerate()
        .map(|(i, d)| OfferedMember {
            name: format!("m{i}"),
            dev_sectors: DEV_SECTORS,
            superblock: Superblock::parse(&d[4096..8192], 8),
            bitmap: None,
        })
        .filter(|o| o.superblock.is_ok())
        .collect()
}

/// What uraid starts on the array: a grow by one member, or a restripe.
#[derive(Clone, Copy)]
enum Start {
    Grow,
    Restripe(Restripe),
}

/// A raid`level` of `n` members holding a pattern, with uraid's grow to n + 1 (or the
/// restripe) started (superblocks durable), and the array's bytes.
fn grown(level: i32, n: usize, start: Start) -> (Starting, Vec<u8>) {
    let mut p = CreateParams::new(level, vec![Some(DEV_SECTORS); n]);
    p.name = "t".into();
    p.set_uuid = [7; 16];
    p.device_uuids = (0..n).map(|i| [i as u8; 16]).collect();
    p.chunk_kib = Some(4);
    p.assume_clean = true;
    let old: Vec<Superblock> =
        create_array(&p).unwrap().superblocks.into_iter().map(Option::unwrap).collect();
    let new = GrowMember { dev_sectors: DEV_SECTORS, device_uuid: [9; 16], dev_number: None };
    let (sbs, geo) = match start {
        Start::Grow => start_grow(&old, &[new], 1).unwrap(),
        Start::Restripe(change) => {
            let (sbs, _, geo) = start_restripe(&old, &[], change, 1, None).unwrap();
            (sbs, geo)
        }
    };
    let slots = sbs.len();
    // A new member starts as garbage: nothing of the previous layout may be read from it.
    let mut durable = vec![vec![0xEEu8; (DEV_SECTORS * 512) as usize]; slots];
    let prev: &Geometry = &geo.previous;
    let data: Vec<u8> = (0..prev.array_sectors() * 512).map(|i| (i * 31 % 253) as u8).collect();
    for s in 0..prev.array_sectors() {
        let (e, _) = prev.map_sector(s);
        let at = ((geo.data_offset_sectors[e.member] + e.member_sector) * 512) as usize;
        durable[e.member][at..at + 512].copy_from_slice(&data[(s * 512) as usize..][..512]);
    }
    for (m, sb) in old.iter().enumerate() {
        durable[m][4096..8192].copy_from_slice(&sb.clone().update_csum());
    }
    let devs = Devs { durable, pending: vec![Vec::new(); slots], ios: 0, crash_at: None };
    (Starting { devs, sbs }, data)
}

/// The array before the grow, and the superblocks that start it.
struct Starting {
    devs: Devs,
    sbs: Vec<Superblock>,
}

impl Starting {
    /// The round that starts the reshape, as the CLI writes it: the new member's
    /// superblock first and flushed, then the others', each flushed.
    fn start(&mut self) -> std::io::Result<()> {
        for m in (0..self.sbs.len()).rev() {
            let sb = self.sbs[m].clone().update_csum();
            self.devs.write(m, 8, &sb)?;
            self.devs.flush(m)?;
        }
        Ok(())
    }
}

/// Assemble from what the devices hold and continue the reshape there is, if any.
fn resume(devs: &mut Devs) -> std::io::Result<ReshapeProgress> {
    let offered = superblocks(devs);
    let plan = plan_assembly(&offered, &AssembleOptions::default()).expect("assembles after the cut");
    let Some(r) = plan.reshape.clone() else { return Ok(ReshapeProgress::Finished) };
    let mut sbs: Vec<Superblock> = offered.into_iter().map(|o| o.superblock.unwrap()).collect();
    let mut run = ReshapeRun::new(r).unwrap();
    continue_reshape(&mut run, &mut sbs, devs, 128, None, 2)
}

/// Every array sector through the finished array's geometry and data offsets.
fn read_back(devs: &Devs, len: usize) -> Vec<u8> {
    let plan = plan_assembly(&superblocks(devs), &AssembleOptions::default()).unwrap();
    assert!(plan.reshape.is_none(), "the reshape finished");
    // A slot the reshape rebuilt (raid5 to raid6's Q) is whole once it ended.
    assert!(plan.degraded_slots.is_empty(), "degraded after the reshape: {:?}", plan.degraded_slots);
    let g = plan.geometry().unwrap();
    (0..len as u64 / 512)
        .flat_map(|s| {
            let (e, _) = g.map_sector(s);
            let m = plan.slots[e.member].as_ref().unwrap();
            let at = ((m.data_offset_sectors + e.member_sector) * 512) as usize;
            devs.durable[e.member][at..at + 512].to_vec()
        })
        .collect()
}

fn cut_everywhere(level: i32, n: usize, start: Start) {
    let (mut starting, data) = grown(level, n, start);
    starting.start().unwrap();
    let mut clean = starting.devs;
    assert_eq!(resume(&mut clean).unwrap(), ReshapeProgress::Finished);
    let total = clean.ios;
    assert_eq!(read_back(&clean, data.len()), data);
    // Every I/O of the first windows, where the checkpoint rule is tightest, and of the
    // last ones (the round that ends the reshape); a sample (every 7th) of the rest: each
    // cut reruns the whole reshape.
    for crash_at in (0..total).filter(|c| *c < 400 || c % 7 == 0 || c + 64 > total) {
        let (mut starting, _) = grown(level, n, start);
        starting.devs.crash_at = Some(crash_at);
        let started = starting.start();
        let mut devs = starting.devs;
        if started.is_ok() {
            assert!(resume(&mut devs).is_err(), "cut at I/O {crash_at}");
        }
        devs.cut(crash_at);
        devs.crash_at = None;
        assert_eq!(resume(&mut devs).unwrap(), ReshapeProgress::Finished, "cut at I/O {crash_at}");
        assert!(
            read_back(&devs, data.len()) == data,
            "raid{level}: data lost by a cut at I/O {crash_at} of {total}"
        );
    }
}

#[test]
fn a_power_cut_at_any_io_of_a_raid5_grow_loses_nothing() {
    cut_everywhere(5, 4, Start::Grow);
}

#[test]
fn a_power_cut_at_any_io_of_a_raid6_grow_loses_nothing() {
    cut_everywhere(6, 5, Start::Grow);
}

#[test]
fn a_power_cut_at_any_io_of_a_raid5_to_raid6_loses_nothing() {
    let member = GrowMember { dev_sectors: DEV_SECTORS, device_uuid: [9; 16], dev_number: None };
    cut_everywhere(5, 4, Start::Restripe(Restripe::Raid6 { member }));
}

#[test]
fn a_power_cut_at_any_io_of_a_chunk_change_loses_nothing() {
    cut_everywhere(5, 4, Start::Restripe(Restripe::Chunk { chunk_sectors: 32 }));
    cut_everywhere(6, 5, Start::Restripe(Restripe::Chunk { chunk_sectors: 4 * 8 }));
}
