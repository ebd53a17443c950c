//! The simulator's own speed as a plain function, so `cargo bench -p uraid-sim` and
//! `uraid bench sim` share it.

use std::time::Instant;

use uraid_core::rng::Rng;
use uraid_core::{MemberIo, MemberIoOp};

use crate::{SimDisks, SimMemberConfig};

#[derive(Clone, Debug)]
pub struct SimSpeed {
    pub profile: String,
    pub member_ios: u64,
    pub real_seconds: f64,
    pub virtual_seconds: f64,
}

impl SimSpeed {
    pub fn ios_per_real_second(&self) -> f64 {
        self.member_ios as f64 / self.real_seconds
    }
}

/// One untimed run of `total_ios` before timed `sim_speed` rows: a process running
/// experiments makes many simulated members and recycles their memory from one to the
/// next (see `sim::store`), so without it the first rows would time the kernel handing
/// over fresh pages, not the simulator.
pub fn warm_up_sim(total_ios: u64) {
    sim_speed("nvme", 8, 32, total_ios);
}

/// Simulated member I/Os per second of real time on this thread: `members` members of
/// `profile`, each kept at queue depth `qd` with 4 KiB random I/O (70% reads, 30% writes,
/// a flush every 256 I/Os per member), for `total_ios` I/Os.
pub fn sim_speed(profile: &str, members: usize, qd: usize, total_ios: u64) -> SimSpeed {
    let member_bytes = 1u64 << 30;
    let configs =
        (0..members).map(|_| SimMemberConfig::builtin(profile, member_bytes).expect("profile")).collect();
    let mut disks = SimDisks::new(configs, 1).expect("sim disks");
    let mut rng = Rng::new(2);
    let blocks = member_bytes / 4096;
    let payload = vec![0xA5u8; 4096];
    let mut next_id = 0u64;
    let mut make = |member: usize, rng: &mut Rng| {
        next_id += 1;
        let (op, data, len) = if next_id.is_multiple_of(256) {
            (MemberIoOp::Flush, Vec::new(), 0)
        } else if rng.below(10) < 3 {
            (MemberIoOp::Write, payload.clone(), 4096)
        } else {
            (MemberIoOp::Read, Vec::new(), 4096)
        };
        MemberIo {
            id: next_id,
            member,
            op,
            offset_bytes: rng.below(blocks) * 4096,
            len_bytes: len,
            data: data.into(),
        }
    };
    let start = Instant::now();
    let mut issued = 0u64;
    let mut done = 0u64;
    // Member of each in-flight id (ids are dense, so a Vec beats a map).
    let mut owner: Vec<u32> = Vec::new();
    for m in 0..members {
        for _ in 0..qd {
            let io = make(m, &mut rng);
            set_owner(&mut owner, io.id, m);
            disks.submit(io);
            issued += 1;
        }
    }
    let mut out = Vec::new();
    while done < total_ios {
        out.clear();
        if disks.run_next(&mut out).is_none() {
            break;
        }
        for c in out.drain(..) {
            done += 1;
            let m = owner.get(c.id as usize).copied().unwrap_or(0) as usize;
            if issued < total_ios {
                let io = make(m, &mut rng);
                set_owner(&mut owner, io.id, m);
                disks.submit(io);
                issued += 1;
            }
        }
    }
    SimSpeed {
        profile: profile.to_string(),
        member_ios: done,
        real_seconds: start.elapsed().as_secs_f64(),
        virtual_seconds: disks.now_ns() as f64 / 1e9,
    }
}

fn set_owner(owner: &mut Vec<u32>, id: u64, member: usize) {
    let i = id as usize;
    if owner.len() <= i {
        owner.resize(i + 1024, 0);
    }
    owner[i] = member as u32;
}
