//! [`ArrayRuntime`]: one thread that owns an engine and the real executor.
//!
//! Clients (the NBD server's connections, the CLI) hand it requests with a completion
//! callback through a bounded channel; a full channel blocks the client, which is the
//! back-pressure a server wants. The thread loops: take requests into the engine (holding
//! one the engine refuses with Busy until completions drain, so order is kept), unplug the
//! engine when the channel is empty, pass member I/Os to the executor, feed member-I/O
//! completions back, deliver request completions to their callbacks and call `tick` when
//! the engine's deadline passes (monotonic clock, ns since the runtime started). When there
//! is nothing to do it sleeps in the executor until an I/O completes, a client wakes it or
//! the deadline comes.
//!
//! Shutdown stops taking requests, finishes everything in flight, then flushes the array
//! (a `Flush` request through the engine), lets the engine finish its own close
//! (`ArrayEngine::finish_close`: an array marks its superblocks clean, through the same
//! executor) and reports the result. Requests that arrive after the shutdown began are
//! answered `ArrayFailed`.
//!
//! A client may also run a round itself (`RuntimeOptions::run_on_submitter_max_bytes`), as md runs
//! a bio's mapping in the submitter's context: when the engine's state is free (the
//! runtime thread sleeps), `submit` takes it, feeds the request straight into the engine,
//! does the member I/O that completes inline (small I/O of memory-backed members), delivers
//! what completed and returns; I/O that must wait for a device goes to the submitter's own
//! io_uring ring when it drives one (`submit_driven`, `RuntimeOptions::submitter_rings`:
//! it reaps that ring itself and finishes the requests there), else it is left for the
//! runtime thread, which is woken for it. A 4 KiB request to a tmpfs array then crosses no thread
//! at all: the NBD connection thread reads it, runs it and sends the reply, saving the two
//! wake-ups of a hand-off (connection thread to runtime, runtime to client), which cost
//! much of the server's CPU in context switches (docs/performance.md, "Performance:
//! NBD"). When the state is busy, the request goes through the channel as before, after
//! a short wait when another submitter holds it (`RuntimeOptions::submitter_wait`). The
//! runtime thread holds the state except while it sleeps.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use uraid_core::stats::ArrayStats;
use uraid_core::{CompletionRound, Request, RequestCompletion, RequestError, SubmitError};

use crate::engine::ArrayEngine;

#[cfg(test)]
mod io_poll_tests;
mod submitter_rings;
use crate::real::{BackendKind, Executor, ExecutorMemberStats, Sleeper, Waker};
use submitter_rings::{forget_thread_ring, set_thread_ring, thread_ring, ThreadRing, THREAD_RING_WAIT};

/// A request's completion callback, with the completing thread's round (see
/// [`CompletionRound`]): the runtime thread ends its round at the end of each loop, a
/// client thread that ran a request itself ends its own when it chooses.
pub type Callback = Box<dyn FnOnce(RequestCompletion, &mut CompletionRound) + Send>;

/// Work run on the runtime thread with the engine, the executor and the runtime clock (ns).
/// One message serves every control-path need (add a member, read the array's state,
/// change tunables) without the runtime knowing about each.
pub type ControlFn<E> = Box<dyn FnOnce(&mut E, &mut Executor, u64) + Send>;

#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// Requests (and control messages) the channel holds before `submit` blocks.
    pub channel_capacity: usize,
    /// `submit` runs the round of a request of up to this many bytes on the calling thread
    /// when the runtime thread is not using the engine (see the module comment); its
    /// callback may then run on the submitting thread, before `submit` returns. 0: never.
    /// Larger requests go to the runtime thread, so their engine work (parity of a full
    /// stripe, say) overlaps with the client reading the next request off the network.
    pub run_on_submitter_max_bytes: u64,
    /// A submitter running rounds itself issues their member I/O on an io_uring ring of
    /// its own and finishes it there (see `real/guest.rs`), where the kernel has deferred
    /// completions; otherwise that I/O waits for the runtime thread. The submitter must
    /// then drive its ring while it owes I/O ([`RuntimeHandle::drive_thread_io`]) and
    /// close it when done ([`RuntimeHandle::thread_done`]).
    pub submitter_rings: bool,
    /// How long a submitter whose request finds another submitter's round running waits
    /// for it to end, to run its own round after it, before it hands the request to the
    /// runtime thread. Without the wait, two connections' requests collide at once, and
    /// the woken runtime thread then takes both connections' requests through the
    /// channel for as long as they keep coming: a hand-off and a wake-up each
    /// (docs/performance.md, "Two connections"). Zero: no wait.
    pub submitter_wait: Duration,
}

/// Default of [`RuntimeOptions::submitter_wait`]: a few rounds of a small request.
pub const DEFAULT_SUBMITTER_WAIT: Duration = Duration::from_micros(30);

/// Default of [`RuntimeOptions::run_on_submitter_max_bytes`]: small requests, for which
/// the hand-off to the runtime thread costs more than the work.
pub const DEFAULT_RUN_ON_SUBMITTER_MAX_BYTES: u64 = 64 * 1024;

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            channel_capacity: 1024,
            run_on_submitter_max_bytes: DEFAULT_RUN_ON_SUBMITTER_MAX_BYTES,
            submitter_rings: true,
            submitter_wait: DEFAULT_SUBMITTER_WAIT,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeStats {
    pub array: ArrayStats,
    pub requests_completed: u64,
    pub member_ios_completed: u64,
    /// Requests accepted by the runtime and not yet completed.
    pub requests_in_flight: usize,
    pub member_ios_in_flight: usize,
    pub backend: BackendKind,
    /// Per executor member: its kind and the I/Os that went buffered, inline or timed out.
    pub members: Vec<ExecutorMemberStats>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Result of the final array flush.
    pub flush: Result<(), RequestError>,
    pub stats: RuntimeStats,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeError {
    /// The runtime thread has stopped (shut down, or it died).
    Stopped,
}

impl std::fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("array runtime has stopped")
    }
}
impl std::error::Error for RuntimeError {}

enum Msg<E> {
    Request(Request, Callback),
    FailMember(usize),
    Control(ControlFn<E>),
    Stats(mpsc::Sender<RuntimeStats>),
    /// Close to requests, flush, let the engine close, end the thread.
    Close(mpsc::Sender<ShutdownReport>),
}

/// A submitter's way into the engine's state, without knowing the engine's type.
trait SubmitterRound: Send + Sync {
    /// Largest request run on the submitter.
    fn max_bytes(&self) -> u64;
    /// Runs `req`'s round on this thread if the state is free; gives it back otherwise.
    fn try_run(
        &self,
        req: Request,
        done: Callback,
        round: &mut CompletionRound,
        driven: bool,
    ) -> Result<(), (Request, Callback)>;
    /// I/O this thread issued on its own ring and has not reaped.
    fn owed(&self) -> usize;
    /// See [`RuntimeHandle::drive_thread_io`].
    fn drive(&self, readable: Option<RawFd>, timeout: Duration, round: &mut CompletionRound) -> bool;
    /// See [`RuntimeHandle::thread_done`].
    fn done(&self, round: &mut CompletionRound);
}

/// A cheap, cloneable way in for clients.
pub struct RuntimeHandle<E> {
    tx: SyncSender<Msg<E>>,
    wake: Arc<Wake>,
    submitter_round: Option<Arc<dyn SubmitterRound>>,
}

impl<E> Clone for RuntimeHandle<E> {
    fn clone(&self) -> Self {
        RuntimeHandle {
            tx: self.tx.clone(),
            wake: self.wake.clone(),
            submitter_round: self.submitter_round.clone(),
        }
    }
}

/// Whether the runtime thread sleeps, how to wake it, and what waits in its channel.
struct Wake {
    waker: Waker,
    sleeping: AtomicBool,
    /// Messages sent and not yet taken by the runtime thread. A submitter runs its own
    /// round only when this is zero, so what a client sent before (a fail, a control
    /// message, a request) is never overtaken by its next request.
    queued: AtomicUsize,
    /// The runtime thread holds the engine's state (it is awake). When the state is busy
    /// and this is false, another submitter holds it for a round (see
    /// [`RuntimeOptions::submitter_wait`]).
    runtime_holds: AtomicBool,
}

impl Wake {
    /// Only the first caller after the runtime fell asleep wakes it: one wake-up is
    /// enough, since the runtime drains the channel before it sleeps again. (With a plain
    /// load, every request sent before the woken runtime got to run wrote the eventfd
    /// again: a syscall per 4 KiB request under load.)
    fn wake(&self) {
        if self.sleeping.swap(false, Ordering::SeqCst) {
            self.waker.wake();
        }
    }
}

impl<E> RuntimeHandle<E> {
    fn send(&self, msg: Msg<E>) -> Result<(), RuntimeError> {
        self.wake.queued.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(msg).is_err() {
            self.wake.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(RuntimeError::Stopped);
        }
        // Pairs with the fence in the runtime between "I am going to sleep" and its last
        // look at the channel: one of the two sides sees the other.
        fence(Ordering::SeqCst);
        self.wake.wake();
        Ok(())
    }

    /// Queue a request; `done` runs when it completes (keep it short), on the runtime
    /// thread or, for a small request (`RuntimeOptions::run_on_submitter_max_bytes`), possibly
    /// on this thread before `submit` returns, with `round`, this thread's round.
    /// The request's `id` is the caller's and comes back in the completion; the runtime
    /// uses its own ids inside, so clients need not coordinate theirs. Blocks while the
    /// channel is full.
    pub fn submit(
        &self,
        req: Request,
        done: Callback,
        round: &mut CompletionRound,
    ) -> Result<(), RuntimeError> {
        self.submit_inner(req, done, round, false)
    }

    /// [`RuntimeHandle::submit`] from a thread that drives its own ring: a round it runs
    /// may issue member I/O there (see [`RuntimeOptions::submitter_rings`]), and it keeps
    /// the promise of [`RuntimeHandle::thread_owes_io`].
    pub fn submit_driven(
        &self,
        req: Request,
        done: Callback,
        round: &mut CompletionRound,
    ) -> Result<(), RuntimeError> {
        self.submit_inner(req, done, round, true)
    }

    fn submit_inner(
        &self,
        req: Request,
        done: Callback,
        round: &mut CompletionRound,
        driven: bool,
    ) -> Result<(), RuntimeError> {
        let (req, done) = match &self.submitter_round {
            Some(sr) if req.len_bytes <= sr.max_bytes() => match sr.try_run(req, done, round, driven) {
                Ok(()) => return Ok(()),
                Err(back) => back,
            },
            _ => (req, done),
        };
        if !self.thread_owes_io() {
            return self.send(Msg::Request(req, done));
        }
        // A full channel must not block a thread that owes I/O: the runtime may be waiting
        // for exactly that I/O before it takes more.
        let mut msg = Msg::Request(req, done);
        loop {
            self.wake.queued.fetch_add(1, Ordering::SeqCst);
            match self.tx.try_send(msg) {
                Ok(()) => {
                    fence(Ordering::SeqCst);
                    self.wake.wake();
                    return Ok(());
                }
                Err(e) => {
                    self.wake.queued.fetch_sub(1, Ordering::SeqCst);
                    match e {
                        TrySendError::Full(m) => msg = m,
                        TrySendError::Disconnected(_) => return Err(RuntimeError::Stopped),
                    }
                }
            }
            self.drive_thread_io(None, Duration::from_millis(1), round);
        }
    }

    /// Whether this thread issued member I/O on a ring of its own that it has not reaped
    /// (see [`RuntimeOptions::submitter_rings`]): it must not block anywhere but in
    /// [`RuntimeHandle::drive_thread_io`] until this is false, since only it can finish
    /// those requests, its own and other clients' alike.
    pub fn thread_owes_io(&self) -> bool {
        self.submitter_round.as_ref().is_some_and(|sr| sr.owed() > 0)
    }

    /// Reaps this thread's ring and finishes what completed (callbacks run with `round`);
    /// when nothing was ready, first waits up to `timeout` for a completion or for
    /// `readable` (a socket) to become readable. Returns true when the caller should go on:
    /// `readable` is readable, or the thread owes nothing more.
    pub fn drive_thread_io(
        &self,
        readable: Option<RawFd>,
        timeout: Duration,
        round: &mut CompletionRound,
    ) -> bool {
        match &self.submitter_round {
            Some(sr) => sr.drive(readable, timeout, round),
            None => true,
        }
    }

    /// This thread is done with the array: finishes what it owes (waiting for it) and
    /// closes its ring.
    pub fn thread_done(&self, round: &mut CompletionRound) {
        if let Some(sr) = &self.submitter_round {
            sr.done(round);
        }
    }

    /// Submit and wait for the completion (for control paths and tests).
    pub fn submit_wait(&self, req: Request) -> Result<RequestCompletion, RuntimeError> {
        let (tx, rx) = mpsc::channel();
        let mut round = CompletionRound::default();
        self.submit(
            req,
            Box::new(move |c, _| {
                let _ = tx.send(c);
            }),
            &mut round,
        )?;
        round.end();
        rx.recv().map_err(|_| RuntimeError::Stopped)
    }

    /// mdadm --fail.
    pub fn fail_member(&self, member: usize) -> Result<(), RuntimeError> {
        self.send(Msg::FailMember(member))
    }

    pub fn stats(&self) -> Result<RuntimeStats, RuntimeError> {
        let (tx, rx) = mpsc::channel();
        self.send(Msg::Stats(tx))?;
        rx.recv().map_err(|_| RuntimeError::Stopped)
    }

    /// Run `f` on the runtime thread and wait for its result. Keep `f` short: the array
    /// serves nothing while it runs. Never call it on the runtime thread (from a request's
    /// callback, say): that thread would wait for itself.
    pub fn control<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut E, &mut Executor, u64) -> R + Send + 'static,
    ) -> Result<R, RuntimeError> {
        let (tx, rx) = mpsc::channel();
        self.send(Msg::Control(Box::new(move |engine, ex, now| {
            let _ = tx.send(f(engine, ex, now));
        })))?;
        rx.recv().map_err(|_| RuntimeError::Stopped)
    }
}

pub struct ArrayRuntime<E> {
    handle: RuntimeHandle<E>,
    thread: Option<JoinHandle<()>>,
}

impl<E: ArrayEngine + Send + 'static> ArrayRuntime<E> {
    pub fn start(engine: E, executor: Executor, opts: &RuntimeOptions) -> std::io::Result<ArrayRuntime<E>> {
        let (tx, rx) = mpsc::sync_channel(opts.channel_capacity.max(1));
        let executor_id = executor.id();
        // With polled completions the array thread spins while it has I/O out, holding the
        // state: a submitter owing I/O on a ring of its own would wait for the state to reap
        // it. Its rounds leave their I/O to the array thread's polled ring instead.
        let rings = opts.submitter_rings && !executor.io_poll();
        let wake = Arc::new(Wake {
            waker: executor.waker(),
            sleeping: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
            runtime_holds: AtomicBool::new(false),
        });
        let state: SharedLoop<E> = Arc::new(Mutex::new(Some(Loop::new(engine, executor, wake.clone()))));
        let max_bytes = opts.run_on_submitter_max_bytes;
        let submitter_round = (max_bytes > 0).then(|| {
            Arc::new(Submitters {
                state: state.clone(),
                wake: wake.clone(),
                max_bytes,
                executor_id,
                rings,
                wait: opts.submitter_wait,
            }) as Arc<dyn SubmitterRound>
        });
        let handle = RuntimeHandle { tx, wake, submitter_round };
        let thread =
            std::thread::Builder::new().name("uraid-array".into()).spawn(move || run_thread(state, rx))?;
        Ok(ArrayRuntime { handle, thread: Some(thread) })
    }

    pub fn handle(&self) -> RuntimeHandle<E> {
        self.handle.clone()
    }

    pub fn submit(
        &self,
        req: Request,
        done: Callback,
        round: &mut CompletionRound,
    ) -> Result<(), RuntimeError> {
        self.handle.submit(req, done, round)
    }

    pub fn submit_wait(&self, req: Request) -> Result<RequestCompletion, RuntimeError> {
        self.handle.submit_wait(req)
    }

    pub fn fail_member(&self, member: usize) -> Result<(), RuntimeError> {
        self.handle.fail_member(member)
    }

    pub fn stats(&self) -> Result<RuntimeStats, RuntimeError> {
        self.handle.stats()
    }

    /// Finish in-flight work, flush the array, let the engine close, stop the thread.
    pub fn shutdown(mut self) -> Result<ShutdownReport, RuntimeError> {
        self.shutdown_inner()
    }
}

impl<E> ArrayRuntime<E> {
    fn shutdown_inner(&mut self) -> Result<ShutdownReport, RuntimeError> {
        let Some(thread) = self.thread.take() else { return Err(RuntimeError::Stopped) };
        let (tx, rx) = mpsc::channel();
        let sent = self.handle.send(Msg::Close(tx));
        let report = rx.recv().map_err(|_| RuntimeError::Stopped);
        let _ = thread.join();
        sent?;
        report
    }
}

impl<E> Drop for ArrayRuntime<E> {
    fn drop(&mut self) {
        let _ = self.shutdown_inner();
    }
}

/// The engine's state, held by the runtime thread except while it sleeps, and by a
/// submitter running a round. `None` once the runtime has stopped.
type SharedLoop<E> = Arc<Mutex<Option<Loop<E>>>>;

fn lock_state<E: ArrayEngine>(state: &SharedLoop<E>) -> MutexGuard<'_, Option<Loop<E>>> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the runtime thread alone reads: the channel, and a message it took while deciding
/// to sleep (still counted in `Wake::queued`).
struct Inbox<E> {
    rx: Receiver<Msg<E>>,
    stash: Option<Msg<E>>,
    wake: Arc<Wake>,
}

impl<E> Inbox<E> {
    fn next(&mut self) -> Result<Msg<E>, TryRecvError> {
        let msg = match self.stash.take() {
            Some(m) => m,
            None => self.rx.try_recv()?,
        };
        self.wake.queued.fetch_sub(1, Ordering::SeqCst);
        Ok(msg)
    }
}

/// What a round of the runtime thread leads to.
enum After {
    Again,
    Sleep,
    Stopped(Result<(), RequestError>),
}

fn run_thread<E: ArrayEngine + 'static>(state: SharedLoop<E>, rx: Receiver<Msg<E>>) {
    // However the thread ends (a panicking engine too), the engine and executor go with
    // it, so callbacks still held are dropped (their owners answer) and submitters fall
    // back to the channel, which is closed.
    struct DropLoop<'a, E: ArrayEngine>(&'a SharedLoop<E>);
    impl<E: ArrayEngine> Drop for DropLoop<'_, E> {
        fn drop(&mut self) {
            let taken = lock_state(self.0).take();
            drop(taken);
        }
    }
    let _drop_loop = DropLoop(&state);
    let mut guard = lock_state(&state);
    let Some(wake) = guard.as_ref().map(|lp| lp.wake.clone()) else { return };
    wake.runtime_holds.store(true, Ordering::SeqCst);
    let mut inbox = Inbox { rx, stash: None, wake };
    loop {
        let Some(lp) = guard.as_mut() else { return };
        match lp.round(&mut inbox) {
            After::Again => continue,
            After::Stopped(flush) => {
                lp.finish_shutdown(&mut inbox, flush);
                return;
            }
            After::Sleep => {}
        }
        let Some((sleeper, timeout)) = lp.prepare_sleep(&mut inbox) else { continue };
        inbox.wake.runtime_holds.store(false, Ordering::SeqCst);
        drop(guard);
        sleeper.sleep(timeout);
        inbox.wake.sleeping.store(false, Ordering::SeqCst);
        guard = lock_state(&state);
        inbox.wake.runtime_holds.store(true, Ordering::SeqCst);
        if let Some(lp) = guard.as_mut() {
            lp.sleep_until_ns = u64::MAX;
            lp.pump();
        }
    }
}

/// The submitters' side of [`SharedLoop`].
struct Submitters<E: ArrayEngine> {
    state: SharedLoop<E>,
    wake: Arc<Wake>,
    max_bytes: u64,
    /// The executor's [`Executor::id`]: the key of this thread's ring in [`THREAD_RINGS`].
    executor_id: u64,
    /// [`RuntimeOptions::submitter_rings`].
    rings: bool,
    /// [`RuntimeOptions::submitter_wait`].
    wait: Duration,
}

impl<E: ArrayEngine + Send + 'static> SubmitterRound for Submitters<E> {
    fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    fn try_run(
        &self,
        req: Request,
        done: Callback,
        round: &mut CompletionRound,
        driven: bool,
    ) -> Result<(), (Request, Callback)> {
        let mut guard = match self.state.try_lock() {
            Ok(g) => g,
            Err(TryLockError::WouldBlock) => match self.wait_for_submitter() {
                Some(g) => g,
                None => return Err((req, done)),
            },
            // Poisoned by a panic on the runtime thread, which is going away.
            Err(TryLockError::Poisoned(_)) => return Err((req, done)),
        };
        let Some(lp) = guard.as_mut() else { return Err((req, done)) };
        let ring = if driven { self.ring(lp) } else { None };
        let need_runtime = match catch_unwind(AssertUnwindSafe(|| lp.submitter_round(req, done, round, ring)))
        {
            Ok(Ok(need)) => need,
            Ok(Err(back)) => return Err(back),
            Err(_) => {
                // The engine panicked: stop the array as a panic on the runtime thread
                // would (callbacks dropped, the runtime thread ends at its next look).
                let dead = guard.take();
                drop(guard);
                drop(dead);
                self.wake.waker.wake();
                return Ok(());
            }
        };
        let owed = ring.and_then(|g| lp.ex.guest_ring_state(g)).map_or(0, |s| s.owed);
        drop(guard);
        if let Some(g) = ring {
            set_thread_ring(ThreadRing { executor_id: self.executor_id, ring: Some(g), owed });
        }
        if need_runtime {
            self.wake.wake();
        }
        Ok(())
    }

    fn owed(&self) -> usize {
        thread_ring(self.executor_id).map_or(0, |t| t.owed)
    }

    fn drive(&self, readable: Option<RawFd>, timeout: Duration, round: &mut CompletionRound) -> bool {
        self.drive_ring(readable, timeout, true, round)
    }

    fn done(&self, round: &mut CompletionRound) {
        let Some(t) = thread_ring(self.executor_id) else { return };
        if let Some(g) = t.ring {
            // Bounded by the member timeout: I/O past it is answered by the runtime thread
            // and no longer owed; a stopped runtime owes nothing.
            while self.owed() > 0 {
                self.drive_ring(None, THREAD_RING_WAIT, false, round);
                round.end();
            }
            self.with_state(|lp| lp.ex.close_guest_ring(g));
        }
        forget_thread_ring(self.executor_id);
    }
}

impl<E: ArrayEngine + Send + 'static> Submitters<E> {
    /// The state once another submitter's round ends, if it ends within `wait`; `None`
    /// when the runtime thread holds it (or takes it meanwhile), or the wait is over. A
    /// spin, not a sleep: a round of small requests lasts microseconds, and a wake-up
    /// from a futex costs more than that here.
    fn wait_for_submitter(&self) -> Option<MutexGuard<'_, Option<Loop<E>>>> {
        let t0 = Instant::now();
        while !self.wake.runtime_holds.load(Ordering::SeqCst) && t0.elapsed() < self.wait {
            std::hint::spin_loop();
            match self.state.try_lock() {
                Ok(g) => return Some(g),
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Poisoned(_)) => return None,
            }
        }
        None
    }
}

/// The engine's state and everything rounds need.
struct Loop<E: ArrayEngine> {
    engine: E,
    ex: Executor,
    wake: Arc<Wake>,
    clock: Instant,
    /// internal id -> (client's id, callback)
    callbacks: HashMap<u64, (u64, Callback)>,
    next_id: u64,
    held: Option<Request>,
    closing: Option<Closing>,
    flush_id: Option<u64>,
    flush_result: Option<Result<(), RequestError>>,
    requests_completed: u64,
    member_ios_completed: u64,
    io_done: Vec<uraid_core::MemberIoCompletion>,
    /// The runtime thread's round of completions, ended at the end of each loop.
    round: CompletionRound,
    /// When the sleeping runtime thread wakes by itself (runtime clock); `u64::MAX` while
    /// it is awake. A submitter whose round needs the engine ticked earlier wakes it.
    sleep_until_ns: u64,
}

impl<E: ArrayEngine + 'static> Loop<E> {
    fn new(engine: E, ex: Executor, wake: Arc<Wake>) -> Self {
        Loop {
            engine,
            ex,
            wake,
            clock: Instant::now(),
            callbacks: HashMap::new(),
            next_id: 1,
            held: None,
            closing: None,
            flush_id: None,
            flush_result: None,
            requests_completed: 0,
            member_ios_completed: 0,
            io_done: Vec::new(),
            round: CompletionRound::default(),
            sleep_until_ns: u64::MAX,
        }
    }

    /// Ends the runtime thread's round: what its completions deferred (replies) goes out.
    fn round_end(&mut self) {
        let round = &mut self.round;
        let _ = catch_unwind(AssertUnwindSafe(|| round.end()));
    }

    fn now_ns(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }

    fn stats(&self) -> RuntimeStats {
        RuntimeStats {
            array: self.engine.stats_snapshot(),
            requests_completed: self.requests_completed,
            member_ios_completed: self.member_ios_completed,
            requests_in_flight: self.callbacks.len() + self.flush_id.is_some() as usize,
            member_ios_in_flight: self.ex.in_flight(),
            backend: self.ex.backend(),
            members: self.ex.member_stats(),
        }
    }

    /// Registers `req` under a fresh internal id and gives it to the engine (or holds it
    /// back while the engine is busy). Returns whether the engine took it.
    fn take_request(&mut self, mut req: Request, cb: Callback, now: u64) -> bool {
        let id = self.next_id;
        self.next_id += 1;
        self.callbacks.insert(id, (req.id, cb));
        req.id = id;
        self.engine_submit(req, now)
    }

    /// Gives `req` to the engine, or holds it back while the engine is busy. Returns
    /// whether the engine took it.
    fn engine_submit(&mut self, req: Request, now: u64) -> bool {
        match self.engine.submit(req, now) {
            Ok(()) => true,
            Err(SubmitError::Busy(r)) => {
                self.held = Some(r);
                false
            }
        }
    }

    fn handle_msg(&mut self, msg: Msg<E>, now: u64) -> bool {
        let mut submitted = false;
        match msg {
            Msg::Request(req, cb) => {
                if self.closing.is_some() {
                    call(
                        cb,
                        RequestCompletion { id: req.id, result: Err(RequestError::ArrayFailed) },
                        &mut self.round,
                    );
                    return false;
                }
                submitted = self.take_request(req, cb, now);
            }
            Msg::FailMember(m) => self.engine.fail_member(m, now),
            Msg::Control(f) => {
                // Whatever the closure started (a recovery, say) is unplugged like a request.
                let _ = catch_unwind(AssertUnwindSafe(|| f(&mut self.engine, &mut self.ex, now)));
                submitted = true;
            }
            Msg::Stats(tx) => {
                let _ = tx.send(self.stats());
            }
            Msg::Close(report_to) => self.close(Some(report_to)),
        }
        submitted
    }

    /// A round run by a client thread for its own request (see the module comment).
    /// Returns whether the runtime thread must look soon (I/O left for it, a request held
    /// back, or an engine deadline before it would wake), or the request back when the
    /// runtime must take it through the channel (shutting down, a request already held, or
    /// messages waiting in the channel, which it must not overtake).
    fn submitter_round(
        &mut self,
        req: Request,
        cb: Callback,
        round: &mut CompletionRound,
        ring: Option<usize>,
    ) -> Result<bool, (Request, Callback)> {
        if self.closing.is_some() || self.held.is_some() || self.wake.queued.load(Ordering::SeqCst) > 0 {
            return Err((req, cb));
        }
        let now = self.now_ns();
        self.ex.set_guest(true);
        self.ex.set_guest_ring(ring, true);
        // The completions of this round are the submitter's: its round holds them (the
        // runtime thread's is empty while it sleeps, when a submitter may run).
        std::mem::swap(&mut self.round, round);
        self.take_request(req, cb, now);
        self.engine.unplug(now);
        while self.pump() {}
        std::mem::swap(&mut self.round, round);
        self.ex.set_guest_ring(None, false);
        self.ex.set_guest(false);
        Ok(self.runtime_needed())
    }

    /// Whether the runtime thread must look soon after a submitter's round: I/O left for
    /// it, a request held back, or an engine deadline before it would wake.
    fn runtime_needed(&self) -> bool {
        let deadline_early = self.engine.next_deadline_ns().is_some_and(|d| d < self.sleep_until_ns);
        self.ex.has_deferred() || self.held.is_some() || deadline_early
    }

    /// One round of the runtime thread: take messages, pump, and the shutdown steps.
    fn round(&mut self, inbox: &mut Inbox<E>) -> After {
        let mut progress = false;
        let now = self.now_ns();
        if let Some(req) = self.held.take() {
            progress = self.engine_submit(req, now);
        }
        let mut submitted = false;
        while self.held.is_none() {
            match inbox.next() {
                Ok(msg) => {
                    submitted |= self.handle_msg(msg, now);
                    progress = true;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    if self.closing.is_none() {
                        self.close(None);
                    }
                    break;
                }
            }
        }
        if submitted {
            self.engine.unplug(now);
        }
        progress |= self.pump();
        self.round_end();
        if self.closing.is_some() && self.held.is_none() && self.callbacks.is_empty() {
            if self.flush_id.is_none() && self.flush_result.is_none() {
                let id = self.next_id;
                self.next_id += 1;
                self.flush_id = Some(id);
                let now = self.now_ns();
                if let Err(SubmitError::Busy(_)) = self.engine.submit(Request::flush(id), now) {
                    // Nothing is in flight, so Busy cannot last; try again next round.
                    self.flush_id = None;
                } else {
                    self.engine.unplug(now);
                }
                return After::Again;
            }
            if let Some(flush) = self.flush_result {
                // The engine's own close (an array's superblocks marked clean) runs on
                // through the rounds that follow until it answers.
                let now = self.now_ns();
                if let Some(result) = self.engine.finish_close(flush, now) {
                    return After::Stopped(result);
                }
                progress |= self.pump();
            }
        }
        if progress {
            After::Again
        } else {
            After::Sleep
        }
    }

    /// Move member I/Os and completions between engine and executor; deliver completions.
    fn pump(&mut self) -> bool {
        self.ex.start_deferred();
        let clock = self.clock;
        let (flush_id, flush_result) = (&mut self.flush_id, &mut self.flush_result);
        let (callbacks, round, requests_completed) =
            (&mut self.callbacks, &mut self.round, &mut self.requests_completed);
        let pumped = uraid_core::drive::pump(
            &mut self.engine,
            &mut self.ex,
            &mut || clock.elapsed().as_nanos() as u64,
            &mut self.io_done,
            |c| {
                if Some(c.id) == *flush_id {
                    *flush_id = None;
                    *flush_result = Some(c.result.map(|_| ()));
                } else if let Some((client_id, cb)) = callbacks.remove(&c.id) {
                    *requests_completed += 1;
                    call(cb, RequestCompletion { id: client_id, result: c.result }, round);
                }
            },
        );
        self.member_ios_completed += pumped.completed;
        pumped.any()
    }

    /// Starts closing (see [`Closing`]); a second call only adds who hears the result.
    fn close(&mut self, report_to: Option<mpsc::Sender<ShutdownReport>>) {
        let c = self.closing.get_or_insert(Closing { report_to: Vec::new() });
        c.report_to.extend(report_to);
    }

    /// Decides to sleep (the caller then releases the state and sleeps in the returned
    /// sleeper until a completion, a client's wake-up or the timeout); `None` when there
    /// is more to do first.
    fn prepare_sleep(&mut self, inbox: &mut Inbox<E>) -> Option<(Sleeper, Duration)> {
        let now = self.now_ns();
        let timeout = self.engine.next_deadline_ns().map(|d| Duration::from_nanos(d.saturating_sub(now)));
        // With a request held back (Busy) or one already taken, new messages cannot be
        // taken before a completion arrives, so no client needs to wake us; submitters
        // leave their requests to the channel then.
        // Nor while the executor spins on polled I/O: it does not sleep, and looks again.
        let listen = self.held.is_none() && inbox.stash.is_none() && !self.ex.spins();
        if listen {
            self.wake.sleeping.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            // A last look at the channel after announcing the sleep (see RuntimeHandle::send).
            match inbox.rx.try_recv() {
                Ok(m) => {
                    inbox.stash = Some(m);
                    self.wake.sleeping.store(false, Ordering::SeqCst);
                    return None;
                }
                Err(TryRecvError::Disconnected) if self.closing.is_none() => {
                    self.close(None);
                    self.wake.sleeping.store(false, Ordering::SeqCst);
                    return None;
                }
                Err(_) => {}
            }
        }
        let Some(sleeper) = self.ex.prepare_sleep() else {
            self.wake.sleeping.store(false, Ordering::SeqCst);
            return None;
        };
        // Disconnected with nothing in flight and no deadline would sleep forever: the
        // shutdown path makes progress instead, so a bounded wait is only a safety net.
        // Member I/O out needs a look at its deadlines now and then (a member that never
        // answers wakes nothing).
        let timeout = [timeout, self.ex.timeout_check_in()].into_iter().flatten().min();
        let timeout = timeout.unwrap_or(Duration::from_secs(1));
        self.sleep_until_ns = now.saturating_add(timeout.as_nanos().min(u64::MAX as u128) as u64);
        Some((sleeper, timeout))
    }

    fn finish_shutdown(&mut self, inbox: &mut Inbox<E>, flush: Result<(), RequestError>) {
        // Refuse whatever raced in behind the shutdown.
        while let Ok(msg) = inbox.next() {
            match msg {
                Msg::Request(req, cb) => call(
                    cb,
                    RequestCompletion { id: req.id, result: Err(RequestError::ArrayFailed) },
                    &mut self.round,
                ),
                Msg::Stats(tx) => {
                    let _ = tx.send(self.stats());
                }
                Msg::Control(f) => {
                    let now = self.now_ns();
                    let _ = catch_unwind(AssertUnwindSafe(|| f(&mut self.engine, &mut self.ex, now)));
                }
                Msg::Close(report_to) => {
                    if let Some(c) = self.closing.as_mut() {
                        c.report_to.push(report_to);
                    }
                }
                Msg::FailMember(_) => {}
            }
        }
        self.round_end();
        let report = ShutdownReport { flush, stats: self.stats() };
        if let Some(c) = self.closing.take() {
            for tx in c.report_to {
                let _ = tx.send(report.clone());
            }
        }
    }
}

/// The runtime refuses requests from the moment it starts closing.
struct Closing {
    report_to: Vec<mpsc::Sender<ShutdownReport>>,
}

/// A client's callback that panics must not take the array down with it.
fn call(cb: Callback, c: RequestCompletion, round: &mut CompletionRound) {
    let _ = catch_unwind(AssertUnwindSafe(move || cb(c, round)));
}
