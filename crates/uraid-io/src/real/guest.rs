//! Rings of guest threads. A client thread that runs engine rounds itself (the runtime's
//! submitter rounds: an NBD connection thread) issues the member I/O of those rounds on an
//! io_uring ring of its own, reaps it and finishes the requests itself, as md issues a
//! bio's member I/O in the submitter's context (`chunk_aligned_read`). Without it, that I/O
//! went to the array thread's ring: one wake-up of the array thread to submit, one for
//! each batch of completions, and the reply made there, where a kernel RAID wakes nobody
//! (docs/performance.md, "Performance: block devices").
//!
//! A guest ring is single-issuer with deferred completions, so only its thread ever enters
//! it; the executor holds its slots (member queues, deadlines and the member set's
//! retirement see them as any other I/O) but never reaps it. Its thread must therefore keep
//! reaping while it owes I/O (the runtime's `drive_thread_io`) and drain it before it goes
//! away (`close_guest_ring`).

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use super::uring::{CompletionMode, UringBackend};
use super::{Backend, Executor};

/// Executors are told apart by this, not by address (a thread may outlive one).
static NEXT_EXECUTOR_ID: AtomicU64 = AtomicU64::new(1);

pub(super) fn next_executor_id() -> u64 {
    NEXT_EXECUTOR_ID.fetch_add(1, Ordering::Relaxed)
}

/// What a guest thread's look at its ring found.
#[derive(Clone, Copy, Debug)]
pub struct GuestRingState {
    /// I/Os on the ring that someone still waits for.
    pub owed: usize,
    /// The socket poll armed with [`Executor::arm_guest_poll`] fired.
    pub poll_fired: bool,
    /// Completions are posted already: no need to wait.
    pub ready: bool,
    /// The ring to wait in (`uring::wait_for_completion`, from the guest thread only).
    pub ring_fd: RawFd,
}

impl Executor {
    /// Unique among the process's executors.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Opens a ring for the calling guest thread, or `None` where guest rings do not apply:
    /// a thread-pool executor, or a kernel without deferred completions (a ring's
    /// completion work would then interrupt whichever thread submitted).
    pub fn open_guest_ring(&mut self) -> io::Result<Option<usize>> {
        let Backend::Uring(own) = &self.backend else { return Ok(None) };
        if own.completion_mode() != CompletionMode::Deferred {
            return Ok(None);
        }
        let depth = self.queues.iter().map(|q| q.depth).sum::<usize>().max(self.queue_depth);
        let entries = (depth + 2).next_power_of_two().clamp(8, 4096) as u32;
        let region = self.arena.as_ref().map(|a| a.region.clone());
        let ring = UringBackend::new(entries, depth, self.registered, region)?;
        if ring.completion_mode() != CompletionMode::Deferred {
            return Ok(None);
        }
        let ring = Some(Box::new(ring));
        match self.guests.iter().position(Option::is_none) {
            Some(i) => {
                self.guests[i] = ring;
                Ok(Some(i))
            }
            None => {
                self.guests.push(ring);
                Ok(Some(self.guests.len() - 1))
            }
        }
    }

    /// The guest ring this thread reaps while it is a guest (`set_guest`), and where its
    /// new I/O goes unless `issue` is false; `None`, or `issue` false: new I/O waits for
    /// the owner (`start_deferred`). A thread about to close its ring reaps it without
    /// issuing more (a resync's I/O would otherwise follow it forever).
    pub fn set_guest_ring(&mut self, ring: Option<usize>, issue: bool) {
        self.active_guest = ring.filter(|&g| self.guests.get(g).is_some_and(Option::is_some));
        self.guest_issues = issue && self.active_guest.is_some();
    }

    /// Arms a poll of `fd` (readable or hung up) on guest ring `g`, handed to the kernel with
    /// what is queued: the guest then waits for its socket and its I/O in one place.
    pub fn arm_guest_poll(&mut self, g: usize, fd: RawFd) {
        if let Some(Some(ring)) = self.guests.get_mut(g) {
            ring.arm_poll(fd);
            ring.submit_pending();
        }
    }

    /// Hands queued entries of guest ring `g` to the kernel and says what it holds.
    pub fn guest_ring_state(&mut self, g: usize) -> Option<GuestRingState> {
        // Only a hung member leaves answered I/O on a ring: the scan for it stays off the
        // hot path otherwise.
        let any_abandoned = self.queues.iter().any(|q| q.abandoned > 0);
        let ring = self.guests.get_mut(g)?.as_mut()?;
        ring.submit_pending();
        Some(GuestRingState {
            owed: if any_abandoned { ring.live_outstanding() } else { ring.outstanding() },
            poll_fired: ring.poll_fired(),
            ready: ring.completions_ready(),
            ring_fd: ring.ring_fd(),
        })
    }

    /// Removes guest ring `g` once its thread owes nothing on it (see
    /// [`GuestRingState::owed`]); I/Os that timed out and that the kernel still holds keep
    /// their buffers, leaked with the ring.
    pub fn close_guest_ring(&mut self, g: usize) {
        if self.active_guest == Some(g) {
            self.active_guest = None;
        }
        if let Some(ring) = self.guests.get_mut(g).and_then(Option::take) {
            if ring.outstanding() > 0 {
                (*ring).leak();
            }
        }
    }

    /// Drops the guest rings at the executor's end: only their threads may reap them, so
    /// one still holding I/O is leaked (its buffers with it) rather than freed under the
    /// kernel.
    pub(super) fn drop_guest_rings(&mut self) {
        for ring in self.guests.drain(..).flatten() {
            if ring.outstanding() > 0 {
                (*ring).leak();
            }
        }
    }
}
