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
//! (a `Flush` request through the engine) and reports the flush's result. Requests that
//! arrive after the shutdown began are answered `ArrayFailed`.

use std::any::Any;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use uraid_core::stats::ArrayStats;
use uraid_core::{Request, RequestCompletion, RequestError, SubmitError};

use crate::engine::ArrayEngine;
use crate::real::{BackendKind, Executor, Waker};

pub type Callback = Box<dyn FnOnce(RequestCompletion) + Send>;

/// Work run on the runtime thread with the engine (as `dyn Any`: downcast it to the engine
/// type the runtime was started with), the executor and the runtime clock (ns). One generic
/// message serves every control-path need (add a member, read sync status, drain engine
/// events, change tunables) without the runtime knowing about each.
pub type ControlFn = Box<dyn FnOnce(&mut dyn Any, &mut Executor, u64) + Send>;

#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// Requests (and control messages) the channel holds before `submit` blocks.
    pub channel_capacity: usize,
    /// Run on the runtime thread after each round of its loop (after that round's
    /// completion callbacks) and once before the thread ends.
    pub round_end: Option<RoundHook>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions { channel_capacity: 1024, round_end: None }
    }
}

/// See [`RuntimeOptions::round_end`]: lets clients finish, once per round, what their
/// callbacks queued (the NBD server sends all of a round's replies to a connection in one
/// syscall). Keep it short, like callbacks.
#[derive(Clone)]
pub struct RoundHook(pub Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for RoundHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoundHook")
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

enum Msg {
    Request(Request, Callback),
    FailMember(usize),
    Control(ControlFn),
    Stats(mpsc::Sender<RuntimeStats>),
    Shutdown(mpsc::Sender<ShutdownReport>),
}

/// A cheap, cloneable way in for clients.
#[derive(Clone)]
pub struct RuntimeHandle {
    tx: SyncSender<Msg>,
    waker: Waker,
    sleeping: Arc<AtomicBool>,
}

impl RuntimeHandle {
    fn send(&self, msg: Msg) -> Result<(), RuntimeError> {
        self.tx.send(msg).map_err(|_| RuntimeError::Stopped)?;
        // Pairs with the fence in the runtime between "I am going to sleep" and its last
        // look at the channel: one of the two sides sees the other.
        fence(Ordering::SeqCst);
        // Only the first sender after the runtime fell asleep wakes it: one wake-up is
        // enough, since the runtime drains the channel before it sleeps again. (With a
        // plain load, every request sent before the woken runtime got to run wrote the
        // eventfd again: a syscall per 4 KiB request under load.)
        if self.sleeping.swap(false, Ordering::SeqCst) {
            self.waker.wake();
        }
        Ok(())
    }

    /// Queue a request; `done` runs on the runtime thread when it completes (keep it short).
    /// The request's `id` is the caller's and comes back in the completion; the runtime
    /// uses its own ids inside, so clients need not coordinate theirs. Blocks while the
    /// channel is full.
    pub fn submit(&self, req: Request, done: Callback) -> Result<(), RuntimeError> {
        self.send(Msg::Request(req, done))
    }

    /// Submit and wait for the completion (for control paths and tests).
    pub fn submit_wait(&self, req: Request) -> Result<RequestCompletion, RuntimeError> {
        let (tx, rx) = mpsc::channel();
        self.submit(
            req,
            Box::new(move |c| {
                let _ = tx.send(c);
            }),
        )?;
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

    /// Queue `f` to run on the runtime thread (in order with requests); returns at once.
    pub fn control_async(&self, f: ControlFn) -> Result<(), RuntimeError> {
        self.send(Msg::Control(f))
    }

    /// Run `f` on the runtime thread and wait for its result. Keep `f` short: the array
    /// serves nothing while it runs.
    pub fn control<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn Any, &mut Executor, u64) -> R + Send + 'static,
    ) -> Result<R, RuntimeError> {
        let (tx, rx) = mpsc::channel();
        self.send(Msg::Control(Box::new(move |engine, ex, now| {
            let _ = tx.send(f(engine, ex, now));
        })))?;
        rx.recv().map_err(|_| RuntimeError::Stopped)
    }
}

pub struct ArrayRuntime {
    handle: RuntimeHandle,
    thread: Option<JoinHandle<()>>,
}

impl ArrayRuntime {
    pub fn start<E: ArrayEngine + Send + 'static>(
        engine: E,
        executor: Executor,
        opts: &RuntimeOptions,
    ) -> std::io::Result<ArrayRuntime> {
        let (tx, rx) = mpsc::sync_channel(opts.channel_capacity.max(1));
        let sleeping = Arc::new(AtomicBool::new(false));
        let handle = RuntimeHandle { tx, waker: executor.waker(), sleeping: sleeping.clone() };
        let round_end = opts.round_end.clone();
        let thread = std::thread::Builder::new()
            .name("uraid-array".into())
            .spawn(move || Loop::new(engine, executor, rx, sleeping, round_end).run())?;
        Ok(ArrayRuntime { handle, thread: Some(thread) })
    }

    pub fn handle(&self) -> RuntimeHandle {
        self.handle.clone()
    }

    pub fn submit(&self, req: Request, done: Callback) -> Result<(), RuntimeError> {
        self.handle.submit(req, done)
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

    /// Finish in-flight work, flush the array, stop the thread.
    pub fn shutdown(mut self) -> Result<ShutdownReport, RuntimeError> {
        self.shutdown_inner()
    }

    fn shutdown_inner(&mut self) -> Result<ShutdownReport, RuntimeError> {
        let Some(thread) = self.thread.take() else { return Err(RuntimeError::Stopped) };
        let (tx, rx) = mpsc::channel();
        let sent = self.handle.send(Msg::Shutdown(tx));
        let report = rx.recv().map_err(|_| RuntimeError::Stopped);
        let _ = thread.join();
        sent?;
        report
    }
}

impl Drop for ArrayRuntime {
    fn drop(&mut self) {
        let _ = self.shutdown_inner();
    }
}

/// The runtime thread's state.
struct Loop<E: ArrayEngine> {
    engine: E,
    ex: Executor,
    rx: Receiver<Msg>,
    sleeping: Arc<AtomicBool>,
    clock: Instant,
    /// internal id -> (client's id, callback)
    callbacks: HashMap<u64, (u64, Callback)>,
    next_id: u64,
    held: Option<Request>,
    stash: Option<Msg>,
    shutdown: Option<Option<mpsc::Sender<ShutdownReport>>>,
    flush_id: Option<u64>,
    flush_result: Option<Result<(), RequestError>>,
    requests_completed: u64,
    member_ios_completed: u64,
    io_done: Vec<uraid_core::MemberIoCompletion>,
    round_end: Option<RoundHook>,
}

impl<E: ArrayEngine + 'static> Loop<E> {
    fn new(
        engine: E,
        ex: Executor,
        rx: Receiver<Msg>,
        sleeping: Arc<AtomicBool>,
        round_end: Option<RoundHook>,
    ) -> Self {
        Loop {
            engine,
            ex,
            rx,
            sleeping,
            clock: Instant::now(),
            callbacks: HashMap::new(),
            next_id: 1,
            held: None,
            stash: None,
            shutdown: None,
            flush_id: None,
            flush_result: None,
            requests_completed: 0,
            member_ios_completed: 0,
            io_done: Vec::new(),
            round_end,
        }
    }

    fn round_end(&self) {
        if let Some(h) = &self.round_end {
            let _ = catch_unwind(AssertUnwindSafe(|| (h.0)()));
        }
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
        }
    }

    fn next_msg(&mut self) -> Result<Msg, TryRecvError> {
        match self.stash.take() {
            Some(m) => Ok(m),
            None => self.rx.try_recv(),
        }
    }

    fn handle_msg(&mut self, msg: Msg, now: u64) -> bool {
        let mut submitted = false;
        match msg {
            Msg::Request(mut req, cb) => {
                if self.shutdown.is_some() {
                    call(cb, RequestCompletion { id: req.id, result: Err(RequestError::ArrayFailed) });
                    return false;
                }
                let id = self.next_id;
                self.next_id += 1;
                self.callbacks.insert(id, (req.id, cb));
                req.id = id;
                match self.engine.submit(req, now) {
                    Ok(()) => submitted = true,
                    Err(SubmitError::Busy(r)) => self.held = Some(r),
                }
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
            Msg::Shutdown(tx) => self.shutdown = Some(Some(tx)),
        }
        submitted
    }

    fn run(mut self) {
        loop {
            let mut progress = false;
            let now = self.now_ns();
            if let Some(req) = self.held.take() {
                match self.engine.submit(req, now) {
                    Ok(()) => progress = true,
                    Err(SubmitError::Busy(r)) => self.held = Some(r),
                }
            }
            let mut submitted = false;
            while self.held.is_none() {
                match self.next_msg() {
                    Ok(msg) => {
                        submitted |= self.handle_msg(msg, now);
                        progress = true;
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if self.shutdown.is_none() {
                            self.shutdown = Some(None);
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
            if self.shutdown.is_some() && self.held.is_none() && self.callbacks.is_empty() {
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
                    continue;
                }
                if let Some(result) = self.flush_result.take() {
                    self.finish_shutdown(result);
                    return;
                }
            }
            if progress {
                continue;
            }
            self.sleep();
        }
    }

    /// Move member I/Os and completions between engine and executor; deliver completions.
    fn pump(&mut self) -> bool {
        let mut progress = false;
        while let Some(io) = self.engine.pop_member_io() {
            self.ex.submit(io);
            progress = true;
        }
        self.io_done.clear();
        if self.ex.poll(&mut self.io_done) > 0 {
            progress = true;
            self.feed_completions();
        }
        progress |= self.deliver();
        let now = self.now_ns();
        if self.engine.next_deadline_ns().is_some_and(|d| d <= now) {
            self.engine.tick(now);
            progress = true;
        }
        progress
    }

    fn feed_completions(&mut self) {
        let now = self.now_ns();
        self.member_ios_completed += self.io_done.len() as u64;
        for c in self.io_done.drain(..) {
            self.engine.complete_member_io(c, now);
        }
    }

    fn deliver(&mut self) -> bool {
        let mut any = false;
        while let Some(c) = self.engine.pop_completion() {
            any = true;
            if Some(c.id) == self.flush_id {
                self.flush_id = None;
                self.flush_result = Some(c.result.map(|_| ()));
                continue;
            }
            if let Some((client_id, cb)) = self.callbacks.remove(&c.id) {
                self.requests_completed += 1;
                call(cb, RequestCompletion { id: client_id, result: c.result });
            }
        }
        any
    }

    fn sleep(&mut self) {
        let now = self.now_ns();
        let timeout = self.engine.next_deadline_ns().map(|d| Duration::from_nanos(d.saturating_sub(now)));
        // With a request held back (Busy) or one already taken, new messages cannot be
        // taken before a completion arrives, so no client needs to wake us.
        let listen = self.held.is_none() && self.stash.is_none();
        if listen {
            self.sleeping.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
        }
        // A last look at the channel after announcing the sleep (see RuntimeHandle::send).
        match if listen { self.rx.try_recv() } else { Err(TryRecvError::Empty) } {
            Ok(m) => {
                self.stash = Some(m);
                self.sleeping.store(false, Ordering::SeqCst);
                return;
            }
            Err(TryRecvError::Disconnected) if self.shutdown.is_none() => {
                self.shutdown = Some(None);
                self.sleeping.store(false, Ordering::SeqCst);
                return;
            }
            Err(_) => {}
        }
        self.io_done.clear();
        // Disconnected with nothing in flight and no deadline would sleep forever: the
        // shutdown path above makes progress instead, so a bounded wait is only a safety net.
        let timeout = Some(timeout.unwrap_or(Duration::from_secs(1)));
        self.ex.wait(&mut self.io_done, timeout);
        self.sleeping.store(false, Ordering::SeqCst);
        if !self.io_done.is_empty() {
            self.feed_completions();
        }
    }

    fn finish_shutdown(mut self, flush: Result<(), RequestError>) {
        // Refuse whatever raced in behind the shutdown.
        while let Ok(msg) = self.next_msg() {
            match msg {
                Msg::Request(req, cb) => {
                    call(cb, RequestCompletion { id: req.id, result: Err(RequestError::ArrayFailed) })
                }
                Msg::Stats(tx) => {
                    let _ = tx.send(self.stats());
                }
                Msg::Control(f) => {
                    let now = self.now_ns();
                    let _ = catch_unwind(AssertUnwindSafe(|| f(&mut self.engine, &mut self.ex, now)));
                }
                Msg::FailMember(_) | Msg::Shutdown(_) => {}
            }
        }
        self.round_end();
        let report = ShutdownReport { flush, stats: self.stats() };
        if let Some(Some(tx)) = self.shutdown.take() {
            let _ = tx.send(report);
        }
    }
}

/// A client's callback that panics must not take the array down with it.
fn call(cb: Callback, c: RequestCompletion) {
    let _ = catch_unwind(AssertUnwindSafe(move || cb(c)));
}
