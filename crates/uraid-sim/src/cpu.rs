//! A CPU model for the experiments: the work of the array and of the threads that submit
//! to it costs virtual time on modelled cores.
//!
//! The figures are data, like the disk profiles: `profiles/cpu-host.toml` holds what the
//! work costs on the machine the project is developed on (`uraid bench cpu` measures it),
//! and each era profile (`cpu-xeon-2015.toml`, ...) names a seed's CPU and how much slower
//! than the host it runs control-path work (the clock and instructions per clock) and
//! copies and parity (its memory and vector width). [`CpuCosts`] is a profile's figures
//! in the era's nanoseconds.
//!
//! The work is counted in md's units, because the seeds measured md: a stripe head is
//! 4 KiB high (md's STRIPE_SIZE) and md issues one bio per 4 KiB page, which the member's
//! queue merges into requests. [`Cores`] and [`Thread`] turn costs into time: a thread
//! runs one piece of work after another, each on the core that frees first.

use std::cell::RefCell;
use std::rc::Rc;

use crate::profile::{parse_flat_toml, Fields, ProfileError};

/// md's stripe_head height and bio size: one page.
pub const MD_PAGE_BYTES: u64 = 4096;

/// What uraid's and the kernel's work costs on the host (`uraid bench cpu`).
#[derive(Clone, Debug, PartialEq)]
pub struct HostCpu {
    pub name: String,
    pub cpu: String,
    pub cores: u32,
    /// Effective clock, measured (one dependent add per cycle).
    pub clock_mhz: u64,
    /// fio and its libaio system calls per I/O (reads of /dev/zero, one per io_submit).
    pub submit_request_ns: f64,
    /// A direct-I/O bio that merges into a request on its way down, and its completion.
    pub bio_ns: f64,
    /// A request dispatched to a block device and completed (driver and interrupt).
    pub member_request_ns: f64,
    /// What `uraid bench cpu` measures of uraid's own work.
    pub measured: HostCpuFigures,
}

/// What uraid's own work costs on the host, ns per unit (rates in bytes per second):
/// measured by `uraid bench cpu` ([`crate::cpu_bench::measure`]), kept in the host profile.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostCpuFigures {
    /// Engine work to map and complete one request, its member I/Os excluded.
    pub engine_request_ns: f64,
    /// Engine work per member I/O issued and completed (one 4 KiB page).
    pub engine_member_io_ns: f64,
    /// Engine work per stripe head handled (one pass; md's handle_stripe), with the piece
    /// of a request it places there.
    pub engine_stripe_ns: f64,
    /// One thread copying memory that is not in its caches (md's copies between bio and
    /// stripe pages).
    pub copy_bytes_per_s: f64,
    /// RAID6 P+Q generation (`gen_syndrome`) over 8 data blocks with the AVX2 kernel, in
    /// data bytes per second: the widest kernel an era profile scales from.
    pub parity_avx2_bytes_per_s: f64,
    /// Request queue work per request added, dispatched and completed (nomerges 2).
    pub queue_request_ns: f64,
    /// Per merge attempt (nomerges 1 minus 2, per attempt).
    pub queue_merge_attempt_ns: f64,
    /// Per hash insertion or lookup (nomerges 0 minus 1, per hash operation).
    pub queue_hash_ns: f64,
}

impl HostCpuFigures {
    /// The figures as `profiles/cpu-host.toml` holds them.
    pub fn toml_lines(&self) -> String {
        format!(
            "engine_request_ns = {:.0}\nengine_member_io_ns = {:.0}\nengine_stripe_ns = {:.0}\n\
             copy_bytes_per_s = {:.0}\nparity_avx2_bytes_per_s = {:.0}\nqueue_request_ns = {:.1}\n\
             queue_merge_attempt_ns = {:.1}\nqueue_hash_ns = {:.1}\n",
            self.engine_request_ns,
            self.engine_member_io_ns,
            self.engine_stripe_ns,
            self.copy_bytes_per_s,
            self.parity_avx2_bytes_per_s,
            self.queue_request_ns,
            self.queue_merge_attempt_ns,
            self.queue_hash_ns
        )
    }

    fn parse(f: &mut Fields) -> Result<HostCpuFigures, ProfileError> {
        Ok(HostCpuFigures {
            engine_request_ns: f.f64("engine_request_ns")?,
            engine_member_io_ns: f.f64("engine_member_io_ns")?,
            engine_stripe_ns: f.f64("engine_stripe_ns")?,
            copy_bytes_per_s: f.f64("copy_bytes_per_s")?,
            parity_avx2_bytes_per_s: f.f64("parity_avx2_bytes_per_s")?,
            queue_request_ns: f.f64("queue_request_ns")?,
            queue_merge_attempt_ns: f.f64("queue_merge_attempt_ns")?,
            queue_hash_ns: f.f64("queue_hash_ns")?,
        })
    }
}

/// A seed's CPU relative to the host.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuProfile {
    pub name: String,
    /// The CPU, as the seed names it.
    pub cpu: String,
    pub cores: u32,
    /// The clock the era's CPU runs a few busy threads at (its turbo clock where it has one).
    pub clock_mhz: u64,
    /// Instructions per clock on kernel-like code, relative to the host's.
    pub relative_ipc: f64,
    /// One thread copying memory that is not in its caches.
    pub copy_bytes_per_s: f64,
    /// Width of the era kernel's parity vectors relative to AVX2 (SSE2: 0.5).
    pub parity_width: f64,
    /// md's copies and parity run on offload engines (md-accel's async_tx on the iop348's
    /// DMA and XOR units): no CPU time per byte for them.
    pub md_offload: bool,
}

pub const BUILTIN_CPU_PROFILES: &[(&str, &str)] = &[
    ("iop348-2007", include_str!("../profiles/cpu-iop348-2007.toml")),
    ("opteron-2008", include_str!("../profiles/cpu-opteron-2008.toml")),
    ("core2-2009", include_str!("../profiles/cpu-core2-2009.toml")),
    ("xeon-2010", include_str!("../profiles/cpu-xeon-2010.toml")),
    ("xeon-2015", include_str!("../profiles/cpu-xeon-2015.toml")),
];

pub const HOST_CPU: &str = include_str!("../profiles/cpu-host.toml");

/// Names `--cpu` takes: the era profiles, `host` (this machine's own figures) and `none`
/// (no CPU cost: the array's work takes no virtual time).
pub fn cpu_profile_names() -> Vec<&'static str> {
    let mut v: Vec<&str> = BUILTIN_CPU_PROFILES.iter().map(|(n, _)| *n).collect();
    v.extend(["host", "none"]);
    v
}

impl HostCpu {
    pub fn builtin() -> HostCpu {
        HostCpu::parse(HOST_CPU).expect("the shipped host profile parses")
    }

    pub fn parse(text: &str) -> Result<HostCpu, ProfileError> {
        let mut f = Fields { map: parse_flat_toml(text)? };
        let kind = f.string("kind")?;
        if kind != "cpu-host" {
            return Err(ProfileError(format!("kind must be \"cpu-host\", got {kind:?}")));
        }
        let h = HostCpu {
            name: f.string("name")?,
            cpu: f.string("cpu")?,
            cores: f.u32("cores")?.max(1),
            clock_mhz: f.u64("clock_mhz")?.max(1),
            submit_request_ns: f.f64("submit_request_ns")?,
            bio_ns: f.f64("bio_ns")?,
            member_request_ns: f.f64("member_request_ns")?,
            measured: HostCpuFigures::parse(&mut f)?,
        };
        f.finish()?;
        if h.measured.copy_bytes_per_s <= 0.0 || h.measured.parity_avx2_bytes_per_s <= 0.0 {
            return Err(ProfileError("copy and parity rates must be > 0".into()));
        }
        Ok(h)
    }
}

impl CpuProfile {
    pub fn builtin(name: &str) -> Result<CpuProfile, ProfileError> {
        let text =
            BUILTIN_CPU_PROFILES.iter().find(|(n, _)| *n == name).map(|(_, t)| *t).ok_or_else(|| {
                ProfileError(format!(
                    "no built-in CPU profile {name:?}; known: {}",
                    cpu_profile_names().join(", ")
                ))
            })?;
        CpuProfile::parse(text)
    }

    pub fn parse(text: &str) -> Result<CpuProfile, ProfileError> {
        let mut f = Fields { map: parse_flat_toml(text)? };
        let kind = f.string("kind")?;
        if kind != "cpu" {
            return Err(ProfileError(format!("kind must be \"cpu\", got {kind:?}")));
        }
        let p = CpuProfile {
            name: f.string("name")?,
            cpu: f.string("cpu")?,
            cores: f.u32("cores")?.max(1),
            clock_mhz: f.u64("clock_mhz")?.max(1),
            relative_ipc: f.f64("relative_ipc")?,
            copy_bytes_per_s: f.f64("copy_bytes_per_s")?,
            parity_width: f.f64("parity_width")?,
            md_offload: f.bool("md_offload")?,
        };
        f.finish()?;
        if p.relative_ipc <= 0.0 || p.copy_bytes_per_s <= 0.0 || (!p.md_offload && p.parity_width <= 0.0) {
            return Err(ProfileError("relative_ipc, copy_bytes_per_s and parity_width must be > 0".into()));
        }
        Ok(p)
    }
}

/// A profile's figures in the era's nanoseconds (per byte: picoseconds).
#[derive(Clone, Debug, PartialEq)]
pub struct CpuCosts {
    /// The profile's name (`none` for the zero model).
    pub name: String,
    pub cpu: String,
    pub cores: u32,
    /// Host time to era time for control-path work.
    pub control_scale: f64,
    pub submit_request_ns: f64,
    pub bio_ns: f64,
    pub member_request_ns: f64,
    /// md's make_request per request, and per page it puts into a stripe head.
    pub md_request_ns: f64,
    pub md_page_ns: f64,
    /// One handle_stripe pass over one stripe head.
    pub stripe_ns: f64,
    /// One page bio md issues and completes: the block layer's and the engine's share.
    pub page_bio_ns: f64,
    /// A copy by a thread on the CPU (the page cache's).
    pub copy_ps_per_byte: f64,
    /// md's copies between bios and stripe pages (0 when offloaded).
    pub md_copy_ps_per_byte: f64,
    pub parity_ps_per_byte: f64,
    pub queue_request_ns: f64,
    pub queue_merge_attempt_ns: f64,
    pub queue_hash_ns: f64,
}

impl CpuCosts {
    /// `profile` on `host`: control-path work scaled by the clocks and instructions per
    /// clock; copies at the era's memory rate; parity at the host's AVX2 rate, narrowed to
    /// the era kernel's vector width and slowed like control work (it is compute-bound in
    /// cache).
    pub fn era(host: &HostCpu, profile: &CpuProfile) -> CpuCosts {
        let s = host.clock_mhz as f64 / (profile.clock_mhz as f64 * profile.relative_ipc);
        let parity_rate = host.measured.parity_avx2_bytes_per_s * profile.parity_width / s;
        CpuCosts {
            name: profile.name.clone(),
            cpu: profile.cpu.clone(),
            cores: profile.cores,
            control_scale: s,
            submit_request_ns: host.submit_request_ns * s,
            bio_ns: host.bio_ns * s,
            member_request_ns: host.member_request_ns * s,
            md_request_ns: host.measured.engine_request_ns * s,
            md_page_ns: host.measured.engine_stripe_ns * s,
            stripe_ns: host.measured.engine_stripe_ns * s,
            page_bio_ns: (host.bio_ns + host.measured.engine_member_io_ns) * s,
            copy_ps_per_byte: 1e12 / profile.copy_bytes_per_s,
            md_copy_ps_per_byte: if profile.md_offload { 0.0 } else { 1e12 / profile.copy_bytes_per_s },
            parity_ps_per_byte: if profile.md_offload { 0.0 } else { 1e12 / parity_rate },
            queue_request_ns: host.measured.queue_request_ns * s,
            queue_merge_attempt_ns: host.measured.queue_merge_attempt_ns * s,
            queue_hash_ns: host.measured.queue_hash_ns * s,
        }
    }

    /// The host's own figures (scale 1, its own copy rate and AVX2 parity).
    pub fn host(host: &HostCpu) -> CpuCosts {
        let p = CpuProfile {
            name: "host".into(),
            cpu: host.cpu.clone(),
            cores: host.cores,
            clock_mhz: host.clock_mhz,
            relative_ipc: 1.0,
            copy_bytes_per_s: host.measured.copy_bytes_per_s,
            parity_width: 1.0,
            md_offload: false,
        };
        CpuCosts::era(host, &p)
    }

    /// No CPU cost at all: the array's work takes no virtual time (cores unlimited).
    pub fn none() -> CpuCosts {
        CpuCosts {
            name: "none".into(),
            cpu: "no CPU model".into(),
            cores: u32::MAX,
            control_scale: 0.0,
            submit_request_ns: 0.0,
            bio_ns: 0.0,
            member_request_ns: 0.0,
            md_request_ns: 0.0,
            md_page_ns: 0.0,
            stripe_ns: 0.0,
            page_bio_ns: 0.0,
            copy_ps_per_byte: 0.0,
            md_copy_ps_per_byte: 0.0,
            parity_ps_per_byte: 0.0,
            queue_request_ns: 0.0,
            queue_merge_attempt_ns: 0.0,
            queue_hash_ns: 0.0,
        }
    }

    /// `none`, `host`, or an era profile by name.
    pub fn named(name: &str) -> Result<CpuCosts, ProfileError> {
        match name {
            "none" => Ok(CpuCosts::none()),
            "host" => Ok(CpuCosts::host(&HostCpu::builtin())),
            _ => Ok(CpuCosts::era(&HostCpu::builtin(), &CpuProfile::builtin(name)?)),
        }
    }

    pub fn is_none(&self) -> bool {
        self.name == "none"
    }

    pub fn copy_ns(&self, bytes: u64) -> f64 {
        bytes as f64 * self.copy_ps_per_byte / 1000.0
    }

    pub fn md_copy_ns(&self, bytes: u64) -> f64 {
        bytes as f64 * self.md_copy_ps_per_byte / 1000.0
    }

    pub fn parity_ns(&self, bytes: u64) -> f64 {
        bytes as f64 * self.parity_ps_per_byte / 1000.0
    }
}

/// The modelled cores: each runs one piece of work at a time.
#[derive(Clone, Debug)]
pub struct Cores {
    free_at_ns: Vec<u64>,
    /// Work run so far, ns.
    pub busy_ns: u64,
}

pub type SharedCores = Rc<RefCell<Cores>>;

impl Cores {
    /// `count` cores (`u32::MAX`: as many as there are threads, i.e. no contention).
    pub fn new(count: u32) -> Cores {
        Cores { free_at_ns: if count == u32::MAX { Vec::new() } else { vec![0; count as usize] }, busy_ns: 0 }
    }

    pub fn shared(count: u32) -> SharedCores {
        Rc::new(RefCell::new(Cores::new(count)))
    }

    /// Run `cost_ns` of work that is ready at `ready_ns` (no preemption: work is placed
    /// in the order it is asked for); returns when it ends. Of the cores free by then it
    /// takes the one freed last, so a thread's run of work stays on one core and leaves
    /// the others to other threads; if none is free, the one free first.
    pub fn run(&mut self, ready_ns: u64, cost_ns: u64) -> u64 {
        self.busy_ns += cost_ns;
        if cost_ns == 0 {
            return ready_ns;
        }
        let free_by_then =
            self.free_at_ns.iter().enumerate().filter(|(_, &f)| f <= ready_ns).max_by_key(|(_, &f)| f);
        let Some((i, &free)) =
            free_by_then.or_else(|| self.free_at_ns.iter().enumerate().min_by_key(|(_, &f)| f))
        else {
            return ready_ns + cost_ns;
        };
        let end = ready_ns.max(free) + cost_ns;
        self.free_at_ns[i] = end;
        end
    }
}

/// A modelled thread (fio's job thread, md's raid5d): one piece of work after another.
#[derive(Clone, Debug, Default)]
pub struct Thread {
    pub free_at_ns: u64,
    pub busy_ns: u64,
}

impl Thread {
    /// Run `cost_ns` ready at `ready_ns`, after the thread's earlier work; returns the end.
    pub fn run(&mut self, cores: &SharedCores, ready_ns: u64, cost_ns: f64) -> u64 {
        let cost = cost_ns.round() as u64;
        self.busy_ns += cost;
        let end = cores.borrow_mut().run(ready_ns.max(self.free_at_ns), cost);
        self.free_at_ns = end;
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_profiles_parse() {
        let host = HostCpu::builtin();
        assert!(host.measured.engine_request_ns > 0.0);
        for (name, _) in BUILTIN_CPU_PROFILES {
            let p = CpuProfile::builtin(name).unwrap();
            assert_eq!(p.name, *name);
            let c = CpuCosts::era(&host, &p);
            // An era CPU is slower than the host at control-path work.
            assert!(c.control_scale > 1.0, "{name}: {}", c.control_scale);
        }
        assert!(CpuCosts::named("none").unwrap().is_none());
        assert!(CpuCosts::named("xeon-1999").is_err());
    }

    /// Era costs are the host's figures times one factor: none is tuned on its own.
    #[test]
    fn era_costs_are_host_costs_scaled() {
        let host = HostCpu::builtin();
        let p = CpuProfile::builtin("xeon-2015").unwrap();
        let c = CpuCosts::era(&host, &p);
        let s = host.clock_mhz as f64 / (p.clock_mhz as f64 * p.relative_ipc);
        assert!((c.control_scale - s).abs() < 1e-9);
        assert!((c.submit_request_ns - host.submit_request_ns * s).abs() < 1e-6);
        assert!((c.stripe_ns - host.measured.engine_stripe_ns * s).abs() < 1e-6);
        assert!((c.member_request_ns - host.member_request_ns * s).abs() < 1e-6);
        assert!((c.copy_ns(1 << 20) - (1u64 << 20) as f64 / p.copy_bytes_per_s * 1e9).abs() < 1e-3);
    }

    #[test]
    fn typos_are_errors() {
        let good = BUILTIN_CPU_PROFILES[0].1;
        assert!(CpuProfile::parse(&format!("{good}\nrelative_ipcc = 1\n")).is_err());
        assert!(HostCpu::parse(good).is_err(), "an era profile is not a host profile");
    }

    /// Two threads on one core take turns; on two cores they overlap.
    #[test]
    fn threads_share_cores() {
        let one = Cores::shared(1);
        let (mut a, mut b) = (Thread::default(), Thread::default());
        assert_eq!(a.run(&one, 0, 100.0), 100);
        assert_eq!(b.run(&one, 0, 100.0), 200);
        assert_eq!(a.run(&one, 50, 10.0), 210);
        let two = Cores::shared(2);
        let (mut a, mut b) = (Thread::default(), Thread::default());
        assert_eq!(a.run(&two, 0, 100.0), 100);
        assert_eq!(b.run(&two, 0, 100.0), 100);
        // A thread's own work never overlaps itself.
        assert_eq!(a.run(&two, 0, 100.0), 200);
        // A thread's run of work stays on its core: another thread ready meanwhile gets
        // the other one at once.
        let two = Cores::shared(2);
        let (mut a, mut b) = (Thread::default(), Thread::default());
        for k in 1..=4 {
            assert_eq!(a.run(&two, 0, 50.0), 50 * k);
        }
        assert_eq!(b.run(&two, 0, 50.0), 50);
        let none = Cores::shared(u32::MAX);
        assert_eq!(Thread::default().run(&none, 7, 0.0), 7);
    }
}
