//! Member-I/O deadlines. md relies on the block layer's command timeout (the SCSI layer's
//! 30 s) to turn a disk that stops answering into an error; a user-space engine on files,
//! loop devices or NBD members has no such layer, so the executor keeps its own. An I/O
//! past its member's deadline is answered `Gone` (the engine fails the member and serves
//! reads from the other copies), and so is everything else that member holds: a member
//! that left one I/O unanswered is treated as hung, so no request, flush, superblock round
//! or stop waits on it. The kernel may still hold the buffer of an I/O answered this way:
//! the slot stays until the kernel returns it (`Slot::abandoned`), and its late result is
//! dropped. See docs/reliability.md.

use std::io;
use std::time::Duration;

use uraid_core::{MemberIoCompletion, MemberIoError};

use super::{Backend, Executor, ExecutorMemberStats, Member};

/// The default deadline of a member I/O: the SCSI layer's default command timeout.
pub const DEFAULT_MEMBER_TIMEOUT: Duration = Duration::from_secs(30);
/// md's failfast members (raid1/raid10) are failed without the block layer's retries; here
/// they get a short deadline instead.
pub const DEFAULT_FAILFAST_TIMEOUT: Duration = Duration::from_secs(2);
/// How often `collect` looks for overdue I/O while any is in flight.
const SCAN_PERIOD: Duration = Duration::from_millis(100);

impl Executor {
    pub(super) fn now_ns(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }

    /// The deadline of member `index`'s I/Os from now on.
    pub fn set_member_timeout(&mut self, index: usize, timeout: Duration) {
        if let Some(q) = self.queues.get_mut(index) {
            q.timeout_ns = timeout.as_nanos().min(u64::MAX as u128) as u64;
        }
    }

    /// How long the owner may sleep before a deadline needs a look (`None`: no I/O out).
    pub fn timeout_check_in(&self) -> Option<Duration> {
        (self.in_flight > 0).then_some(SCAN_PERIOD)
    }

    /// Per member (the executor's index): I/Os that went buffered or inline, or timed out.
    pub fn member_stats(&self) -> Vec<ExecutorMemberStats> {
        let with_kind = |(q, m): (&super::MemberQueue, &Member)| ExecutorMemberStats {
            kind: Some(m.kind()),
            direct: m.is_direct(),
            ..q.counts
        };
        self.queues.iter().zip(self.members.iter()).map(with_kind).collect()
    }

    /// Whether member `index` left an I/O unanswered past its deadline.
    pub fn member_hung(&self, index: usize) -> bool {
        self.queues.get(index).is_some_and(|q| q.hung)
    }

    /// One line per member on stderr: what it is and how its I/O will run (`uraid serve`
    /// logs it once at start).
    pub fn log_choices(&self) {
        let backend = match self.backend {
            Backend::Uring(_) => "io_uring",
            Backend::Pool(_) => "thread pool",
        };
        for (m, q) in self.members.iter().zip(&self.queues) {
            let remote = m.kind() == super::MemberKind::Remote;
            let how = if remote {
                "requests".to_string()
            } else if m.is_direct() {
                format!("O_DIRECT ({}-byte units)", m.dio_offset_align())
            } else {
                "buffered".to_string()
            };
            let queue = match m.device_queue() {
                Some((nr, rot)) => {
                    format!(" (nr_requests {nr}, {})", if rot { "rotational" } else { "non-rotational" })
                }
                None => String::new(),
            };
            eprintln!(
                "uraid-io: {}: {}, {how} through {}, queue depth {}{queue}, I/O timeout {:.1} s",
                m.path().display(),
                m.kind().name(),
                if remote { "its connection" } else { backend },
                q.depth,
                q.timeout_ns as f64 / 1e9
            );
        }
        if let Backend::Uring(u) = &self.backend {
            eprintln!("uraid-io: io_uring: {}", u.completion_mode());
            let on = |b: bool| if b { "on" } else { "off" };
            eprintln!(
                "uraid-io: io_uring: registered files {}, registered buffers {}",
                on(self.registered.files),
                match &self.arena {
                    Some(_) => format!(
                        "on ({} x {} KiB for O_DIRECT bounce buffers)",
                        super::REGISTERED_BUFFERS,
                        super::REGISTERED_BUFFER_BYTES / 1024
                    ),
                    None => on(false).to_string(),
                }
            );
            if self.polled.is_some() {
                eprintln!(
                    "uraid-io: io_uring: polled completions (IORING_SETUP_IOPOLL) for the O_DIRECT \
                     reads and writes of members with poll queues, on a second ring the array \
                     thread spins on while they are out; flushes and buffered I/O take interrupts"
                );
            }
        }
    }

    /// Drops the retired member sets no started I/O uses any more (their descriptors close).
    pub(super) fn release_retired(&mut self) {
        if self.retired.is_empty() {
            return;
        }
        let mut oldest = u64::MAX;
        for_each_slot(&mut self.backend, &mut self.polled, &mut self.remote, &mut self.guests, |_, s| {
            oldest = oldest.min(s.set_gen)
        });
        self.retired.retain(|(g, _)| *g >= oldest);
    }

    /// Answers `Gone` for every I/O of a member that has one past its deadline.
    pub(super) fn expire_overdue(&mut self) {
        let now = self.now_ns();
        if now < self.next_timeout_scan_ns {
            return;
        }
        self.next_timeout_scan_ns = now + SCAN_PERIOD.as_nanos() as u64;
        let (queues, reaped) = (&mut self.queues, &self.guest_reaped_ns);
        let mut newly_hung: Vec<usize> = Vec::new();
        let mut unreaped_late = false;
        for_each_slot(&mut self.backend, &mut self.polled, &mut self.remote, &mut self.guests, |ring, s| {
            if s.abandoned || deadline_ns(queues, s) >= now {
                return;
            }
            if known_late(queues, reaped, ring, s) {
                newly_hung.push(s.member);
            } else {
                unreaped_late = true;
            }
        });
        let overdue =
            |member: usize, started_ns: u64| now.saturating_sub(started_ns) > queues[member].timeout_ns;
        newly_hung.extend(self.held.iter().filter(|(io, t)| overdue(io.member, *t)).map(|(io, _)| io.member));
        newly_hung.sort_unstable();
        newly_hung.dedup();
        newly_hung.retain(|&m| !self.queues[m].hung);
        if self.log && unreaped_late {
            self.log_stalled_guest_rings(now);
        }
        if newly_hung.is_empty() {
            return;
        }
        for &m in &newly_hung {
            self.queues[m].hung = true;
            if self.log {
                eprintln!(
                    "uraid-io: {}: an I/O did not complete within {:.1} s; failing the member's I/O",
                    self.members.member(m).path().display(),
                    self.queues[m].timeout_ns as f64 / 1e9
                );
            }
        }
        let (queues, ready) = (&mut self.queues, &mut self.ready);
        let mut gone = |q: &mut super::MemberQueue, id| {
            q.counts.timed_out_ios += 1;
            ready.push(MemberIoCompletion { id, result: Err(MemberIoError::Gone) });
        };
        for_each_slot(&mut self.backend, &mut self.polled, &mut self.remote, &mut self.guests, |_, s| {
            let q = &mut queues[s.member];
            if q.hung && !s.abandoned {
                s.abandoned = true;
                q.abandoned += 1;
                gone(q, s.id);
            }
        });
        for &m in &newly_hung {
            let q = &mut queues[m];
            for io in std::mem::take(&mut q.waiting) {
                gone(q, io.id);
            }
        }
        for (io, held_ns) in std::mem::take(&mut self.held) {
            if queues[io.member].hung {
                gone(&mut queues[io.member], io.id);
            } else {
                self.held.push((io, held_ns));
            }
        }
    }

    /// Says once per stall which connection threads hold I/O past its deadline on their
    /// own rings without having looked since: only its thread reaps such a ring, so that
    /// I/O may well be done, and its members are not failed for it (docs/reliability.md).
    fn log_stalled_guest_rings(&mut self, now: u64) {
        for (g, n, reaped_ns) in self.guest_rings_unreaped(now) {
            if self.guest_stall_logged.len() <= g {
                self.guest_stall_logged.resize(g + 1, None);
            }
            if self.guest_stall_logged[g] == Some(reaped_ns) {
                continue;
            }
            self.guest_stall_logged[g] = Some(reaped_ns);
            let seen = match reaped_ns {
                0 => "never reaped it".to_string(),
                t => format!("last reaped it {:.1} s ago", now.saturating_sub(t) as f64 / 1e9),
            };
            eprintln!(
                "uraid-io: connection ring {g} holds {n} I/O(s) past the member timeout, and its thread \
                 {seen}: the server's thread stalled, not the members; they are not failed for it"
            );
        }
    }

    /// Per guest ring holding I/O past its deadline that its thread has not looked for
    /// since: the ring, how many such I/Os, and when its thread last reaped it (0: never).
    pub(super) fn guest_rings_unreaped(&mut self, now: u64) -> Vec<(usize, usize, u64)> {
        let (queues, reaped) = (&self.queues, &self.guest_reaped_ns);
        let mut out = Vec::new();
        for (g, ring) in self.guests.iter_mut().enumerate() {
            let Some(ring) = ring else { continue };
            let late = |s: &super::Slot| deadline_ns(queues, s) < now;
            let n = ring
                .slots_mut()
                .filter(|s| !s.abandoned && late(s) && !known_late(queues, reaped, Some(g), s))
                .count();
            let reaped_ns = reaped.get(g).copied().unwrap_or(0);
            if n > 0 {
                out.push((g, n, reaped_ns));
            }
        }
        out
    }

    /// A device whose timed-out I/O the kernel still holds must not take a slot again: that
    /// I/O could land after the new one's writes (md waits for `nr_pending` to drain before
    /// it lets an rdev go). Another device in the slot is fine.
    pub(super) fn check_no_late_io(&self, index: usize, new: &Member) -> io::Result<()> {
        let q = &self.queues[index];
        if q.abandoned > 0 && self.members.member(index).same_device(new) {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "{}: {} timed-out I/O(s) are still held by the {}; the device cannot be \
                     used again until they return (check the device, then retry)",
                    new.path().display(),
                    q.abandoned,
                    if new.kind() == super::MemberKind::Remote { "server" } else { "kernel" }
                ),
            ));
        }
        Ok(())
    }
}

/// When I/O `s` is due: its start plus its member's timeout.
fn deadline_ns(queues: &[super::MemberQueue], s: &super::Slot) -> u64 {
    s.started_ns.saturating_add(queues[s.member].timeout_ns)
}

/// Whether I/O `s` (on guest ring `ring`, if any), past its deadline, is known to be late.
/// A guest ring is reaped by its thread only: its I/O is known late only when the thread
/// looked after the deadline and did not find it done. Before that, the kernel may have
/// finished it long ago, and the lateness is the thread's (a thread that stalled must not
/// fail every member it had I/O on).
fn known_late(queues: &[super::MemberQueue], reaped: &[u64], ring: Option<usize>, s: &super::Slot) -> bool {
    let due = deadline_ns(queues, s);
    ring.is_none_or(|g| reaped.get(g).is_some_and(|&r| r > due))
}

/// Every slot the executor has handed out: its own backend's and its guests' rings'
/// (with the guest ring's index).
fn for_each_slot(
    backend: &mut Backend,
    polled: &mut Option<Box<super::uring::UringBackend>>,
    remote: &mut super::remote::RemoteBackend,
    guests: &mut [Option<Box<super::uring::UringBackend>>],
    mut f: impl FnMut(Option<usize>, &mut super::Slot),
) {
    match backend {
        Backend::Uring(u) => u.slots_mut().for_each(|s| f(None, s)),
        Backend::Pool(p) => p.slots_mut().for_each(|s| f(None, s)),
    }
    polled.iter_mut().for_each(|p| p.slots_mut().for_each(|s| f(None, s)));
    remote.slots_mut().for_each(|s| f(None, s));
    for (g, ring) in guests.iter_mut().enumerate() {
        if let Some(ring) = ring {
            ring.slots_mut().for_each(|s| f(Some(g), s));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use uraid_core::{MemberIo, MemberIoOp};

    use crate::real::{Executor, ExecutorOptions, Member, MemberSet, OpenOptions};

    #[test]
    fn io_on_a_connection_ring_its_thread_stopped_reaping_does_not_fail_the_member() {
        let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/tmp"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("uraid-guest-stall-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let m = Member::open(&path, &OpenOptions { log: false, ..OpenOptions::default() }).unwrap();
        let opts =
            ExecutorOptions { log: false, inline_memory_io_max_bytes: 0, ..ExecutorOptions::default() };
        let mut ex = Executor::new(MemberSet::from_members(vec![m]), &opts).unwrap();
        let g = ex.open_guest_ring().unwrap().expect("this kernel gives deferred rings (6.1+)");
        let write = |id| MemberIo {
            id,
            member: 0,
            op: MemberIoOp::Write,
            offset_bytes: 0,
            len_bytes: 4096,
            data: vec![7u8; 4096].into(),
        };
        let as_guest = |ex: &mut Executor, f: &mut dyn FnMut(&mut Executor)| {
            ex.set_guest(true);
            ex.set_guest_ring(Some(g), true);
            f(ex);
            ex.set_guest_ring(None, false);
            ex.set_guest(false);
        };
        // A connection thread's round issues a write on its ring, reaps it once, and issues
        // another that it does not reap for longer than the member timeout.
        let mut done = Vec::new();
        as_guest(&mut ex, &mut |ex| {
            ex.submit(write(1));
            while done.is_empty() {
                ex.poll(&mut done);
            }
            ex.submit(write(2));
        });
        ex.set_member_timeout(0, Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(20));
        let now = ex.now_ns();
        let stalled = ex.guest_rings_unreaped(now);
        assert_eq!(stalled.len(), 1, "{stalled:?}");
        let (ring, n, reaped) = stalled[0];
        assert_eq!((ring, n), (g, 1));
        assert!(reaped > 0, "the thread reaped it once");
        let ago = now - reaped;
        assert!(ago >= 20_000_000, "last reaped {ago} ns ago, before the 20 ms sleep");
        // The runtime thread's deadline scan must not take the thread's stall for the
        // member's: the write may be done, only nobody looked.
        ex.expire_overdue();
        assert!(!ex.member_hung(0), "a member failed for I/O its connection thread had not reaped");
        done.clear();
        as_guest(&mut ex, &mut |ex| {
            while done.is_empty() {
                ex.poll(&mut done);
            }
        });
        assert_eq!(done.len(), 1);
        assert!(done[0].id == 2 && done[0].result.is_ok(), "{done:?}");
        // A thread that looked after the deadline and did not find its I/O done (a file's
        // write cannot be held, so the look is set by hand): that member is late.
        as_guest(&mut ex, &mut |ex| ex.submit(write(3)));
        std::thread::sleep(Duration::from_millis(20));
        ex.guest_reaped_ns[g] = ex.now_ns();
        std::thread::sleep(Duration::from_millis(1));
        ex.next_timeout_scan_ns = 0;
        ex.expire_overdue();
        assert!(ex.member_hung(0));
        done.clear();
        ex.poll(&mut done);
        assert!(done.iter().any(|c| c.id == 3 && c.result.is_err()), "{done:?}");
        drop(ex);
        let _ = std::fs::remove_file(&path);
    }
}
