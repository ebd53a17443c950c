//! Polled completions (`ExecutorOptions::io_poll`, `serve --io-poll`). The owner's O_DIRECT
//! reads and writes of members with poll queues go on a second ring made with
//! `IORING_SETUP_IOPOLL`: the device posts no interrupt, and a completion exists only once
//! the owner polls the device's queue (`io_uring_enter` with `GETEVENTS`). So the owner
//! never sleeps while that ring holds I/O someone waits for: it polls it and looks at its
//! other ring (flushes, buffered I/O, wake-ups) without blocking, in turn, and sleeps only
//! once the polled ring is empty. Timed-out polled I/O no longer keeps it spinning: it is
//! reaped by the next pass whenever it comes back. Guest threads' rings stay
//! interrupt-driven (they sleep in their ring and their socket together).

use super::{Backend, Executor, RegisteredIo};

impl Executor {
    /// Whether polled completions are on.
    pub fn io_poll(&self) -> bool {
        self.polled.is_some()
    }

    /// Whether the polled ring holds I/O someone still waits for: the owner must poll it
    /// rather than sleep (see [`Executor::prepare_sleep`]).
    pub fn spins(&self) -> bool {
        let Some(p) = &self.polled else { return false };
        if p.outstanding() == 0 {
            return false;
        }
        // Only a hung member leaves answered I/O on a ring: the scan stays off the hot path.
        let any_abandoned = self.queues.iter().any(|q| q.abandoned > 0);
        !any_abandoned || p.live_outstanding() > 0
    }

    /// Sends the polled I/Os a device refused to poll to the owner's normal ring, and that
    /// member's later I/O with them: a device that cannot poll (one added without poll
    /// queues, a driver that refuses some I/O) still gets its data, only not polled.
    pub(super) fn redo_refused_polled(&mut self) {
        let Some(p) = &mut self.polled else { return };
        let refused = p.take_refused();
        let Backend::Uring(u) = &mut self.backend else { return };
        for slot in refused {
            self.polled_refused += 1;
            let q = &mut self.queues[slot.member];
            if !q.poll_refused && self.log {
                eprintln!(
                    "uraid-io: {}: the device refused a polled I/O (EOPNOTSUPP); its I/O takes interrupts from now on",
                    self.members.member(slot.member).path().display()
                );
            }
            q.poll_refused = true;
            if self.registered != RegisteredIo::default() {
                u.prepare_registered(slot.set_gen, &self.members);
            }
            u.push(slot);
        }
    }

    /// I/Os done on the polled ring so far (not those it refused).
    pub fn polled_ios(&self) -> u64 {
        self.polled.as_ref().map_or(0, |p| p.pushed()) - self.polled_refused
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    use uraid_core::{MemberIo, MemberIoCompletion, MemberIoError, MemberIoOp};

    use crate::real::{Executor, ExecutorOptions, Member, MemberKind, MemberSet, OpenOptions};

    /// A file on the disk the build runs on (not tmpfs, whose files cannot be polled): its
    /// O_DIRECT I/O completes by interrupt, and a polled ring's poll sees it done, so the
    /// polled path runs here without a device that has poll queues.
    fn disk_file(name: &str, len: u64) -> PathBuf {
        let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/tmp"));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("uraid-polled-{name}-{}", std::process::id()));
        // Written out, not sparse: an O_DIRECT write into a hole may go another way.
        std::fs::write(&p, vec![0u8; len as usize]).unwrap();
        p
    }

    fn polled_executor(path: &Path, pollable: bool) -> Executor {
        let mut m = Member::open(path, &OpenOptions { log: false, ..OpenOptions::default() }).unwrap();
        assert_eq!(m.kind(), MemberKind::DiskFile, "{} must be on a disk file system", path.display());
        assert!(m.is_direct(), "{} must take O_DIRECT", path.display());
        if pollable {
            m.assume_pollable();
        }
        let opts = ExecutorOptions { io_poll: true, log: false, ..ExecutorOptions::default() };
        Executor::new(MemberSet::from_members(vec![m]), &opts).unwrap()
    }

    fn io(id: u64, op: MemberIoOp, offset_bytes: u64, data: Vec<u8>, len_bytes: u64) -> MemberIo {
        MemberIo { id, member: 0, op, offset_bytes, len_bytes, data: data.into() }
    }

    /// I/Os handed to the polled ring, whether its device took them or not.
    fn pushed(ex: &Executor) -> u64 {
        ex.polled.as_ref().map_or(0, |p| p.pushed())
    }

    /// Submits `io` and waits (bounded) for its completion.
    fn run(ex: &mut Executor, io: MemberIo) -> MemberIoCompletion {
        let id = io.id;
        ex.submit(io);
        let start = Instant::now();
        let mut done = Vec::new();
        while done.is_empty() {
            assert!(start.elapsed() < Duration::from_secs(10), "I/O {id} did not complete");
            ex.wait(&mut done, Some(Duration::from_millis(10)));
        }
        assert_eq!(done.len(), 1);
        done.pop().unwrap()
    }

    #[test]
    fn direct_reads_and_writes_go_on_the_polled_ring_and_flushes_and_buffered_io_do_not() {
        let path = disk_file("route", 1 << 20);
        let mut ex = polled_executor(&path, true);
        assert!(ex.io_poll());
        let block: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let write = run(&mut ex, io(1, MemberIoOp::Write, 8192, block.clone(), 4096));
        assert_eq!(write.result.map(|v| v.len()), Ok(0));
        assert_eq!(pushed(&ex), 1, "the O_DIRECT write goes on the polled ring");
        // An IOPOLL ring refuses a flush and buffered I/O: they must go on the other ring.
        assert_eq!(run(&mut ex, io(2, MemberIoOp::Flush, 0, Vec::new(), 0)).result.map(|v| v.len()), Ok(0));
        let unaligned = run(&mut ex, io(3, MemberIoOp::Write, 8192 + 512, vec![9; 512], 512));
        assert_eq!(unaligned.result.map(|v| v.len()), Ok(0));
        assert_eq!(pushed(&ex), 1, "the flush and the unaligned write are not polled");
        let back = run(&mut ex, io(4, MemberIoOp::Read, 8192, Vec::new(), 4096)).result.unwrap();
        assert!(back[..512] == block[..512] && back[512..1024] == [9; 512] && back[1024..] == block[1024..]);
        assert!(!ex.spins());
        drop(ex);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_member_without_poll_queues_keeps_the_normal_ring() {
        let path = disk_file("unpollable", 1 << 20);
        let mut ex = polled_executor(&path, false);
        assert_eq!(
            run(&mut ex, io(1, MemberIoOp::Read, 0, Vec::new(), 4096)).result.map(|v| v.len()),
            Ok(4096)
        );
        assert_eq!(pushed(&ex), 0);
        drop(ex);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn polled_io_the_device_refuses_is_done_on_the_normal_ring_and_the_member_leaves_the_polled_ring() {
        // tmpfs takes O_DIRECT (Linux 6.6+) but cannot poll: io_uring answers EOPNOTSUPP.
        let path = PathBuf::from(format!("/dev/shm/uraid-polled-refused-{}", std::process::id()));
        std::fs::write(&path, vec![5u8; 1 << 20]).unwrap();
        let mut m = Member::open(&path, &OpenOptions { log: false, ..OpenOptions::default() }).unwrap();
        assert!(m.is_direct(), "this test needs a kernel whose tmpfs takes O_DIRECT (6.6+)");
        m.assume_pollable();
        let opts = ExecutorOptions {
            io_poll: true,
            log: false,
            inline_memory_io_max_bytes: 0,
            ..ExecutorOptions::default()
        };
        let mut ex = Executor::new(MemberSet::from_members(vec![m]), &opts).unwrap();
        let read = run(&mut ex, io(1, MemberIoOp::Read, 4096, Vec::new(), 4096));
        assert!(read.result.as_deref() == Ok(&[5u8; 4096][..]), "the refused read was not done again");
        assert_eq!((pushed(&ex), ex.polled_ios()), (1, 0), "the refused read is not counted as polled");
        assert_eq!(
            run(&mut ex, io(2, MemberIoOp::Read, 0, Vec::new(), 4096)).result.map(|v| v.len()),
            Ok(4096)
        );
        assert_eq!(pushed(&ex), 1, "the member's next I/O went on the polled ring again");
        drop(ex);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn polled_io_past_its_deadline_is_answered_gone_and_its_late_completion_dropped() {
        let path = disk_file("deadline", 1 << 20);
        let mut ex = polled_executor(&path, true);
        ex.set_member_timeout(0, Duration::ZERO);
        ex.submit(io(1, MemberIoOp::Write, 0, vec![3; 4096], 4096));
        assert_eq!(pushed(&ex), 1);
        std::thread::sleep(Duration::from_millis(1));
        // The deadline scan before any reap: the I/O is still the polled ring's.
        ex.expire_overdue();
        assert!(ex.member_hung(0), "the polled I/O past its deadline was not seen");
        let mut done = Vec::new();
        ex.poll(&mut done);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].id, 1);
        assert_eq!(done[0].result, Err(MemberIoError::Gone));
        // The kernel's late completion frees the slot and is not answered again.
        let start = Instant::now();
        while ex.polled.as_ref().unwrap().outstanding() > 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "the late completion was never reaped");
            assert_eq!(ex.poll(&mut done), 0);
            assert!(!ex.spins(), "nobody waits for an answered I/O: no spinning for it");
        }
        assert_eq!(done.len(), 1);
        drop(ex);
        let _ = std::fs::remove_file(&path);
    }
}
