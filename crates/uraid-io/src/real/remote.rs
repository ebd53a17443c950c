//! Members reached through a connection rather than a descriptor (an NBD export: see
//! `uraid_nbd::client`). The executor does not know the protocol: it hands each I/O to the
//! member's [`RemoteDevice`], whose answer comes back on another thread into a list the
//! executor drains in `collect`, waking the owner as a kernel completion would. The slots
//! stay here until answered, so member deadlines (`timeout.rs`) see them like any other.

use std::sync::{Arc, Mutex};

use uraid_core::{IoBytes, MemberIoError, MemberIoOp};

use super::{IoBuf, Slot, Waker};

/// One I/O's answer: a read's bytes, or nothing.
pub type RemoteResult = Result<Vec<u8>, MemberIoError>;
/// Called once with the answer, from any thread.
pub type RemoteDone = Box<dyn FnOnce(RemoteResult) + Send>;

/// A member device behind a connection. `start` must never block on the device (the
/// caller is the array's I/O thread) and must call `done` exactly once, possibly at once.
pub trait RemoteDevice: Send + Sync + std::fmt::Debug {
    fn size_bytes(&self) -> u64;
    /// What it names (server and export), to catch one device offered twice.
    fn identity(&self) -> u64;
    fn start(&self, op: MemberIoOp, offset_bytes: u64, len_bytes: usize, data: IoBytes, done: RemoteDone);
}

type DoneList = Arc<Mutex<Vec<(usize, RemoteResult)>>>;

#[derive(Default)]
pub(super) struct RemoteBackend {
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    done: DoneList,
}

impl RemoteBackend {
    pub fn slots_mut(&mut self) -> impl Iterator<Item = &mut Slot> {
        self.slots.iter_mut().flatten()
    }

    pub fn has_done(&self) -> bool {
        !self.done.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Hands `slot`'s I/O to `device`; `data` is a write's bytes.
    pub fn push(&mut self, device: &dyn RemoteDevice, slot: Slot, data: IoBytes, waker: Waker) {
        let (op, offset, len) = (slot.op, slot.offset_bytes, slot.len_bytes);
        let idx = super::put_slot(&mut self.slots, &mut self.free, slot);
        let list = self.done.clone();
        device.start(
            op,
            offset,
            len,
            data,
            Box::new(move |r| {
                list.lock().unwrap_or_else(|e| e.into_inner()).push((idx, r));
                waker.wake();
            }),
        );
    }

    /// Moves the answered I/Os to `finished`.
    pub fn reap(&mut self, finished: &mut Vec<(Slot, Result<(), MemberIoError>)>) {
        let list = std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()));
        for (idx, result) in list {
            let Some(mut slot) = self.slots.get_mut(idx).and_then(Option::take) else { continue };
            self.free.push(idx);
            let result = match result {
                Ok(v) if slot.op == MemberIoOp::Read && v.len() != slot.len_bytes => Err(MemberIoError::Io),
                Ok(v) => {
                    slot.done_bytes = slot.len_bytes;
                    if slot.op == MemberIoOp::Read {
                        slot.buf = IoBuf::Plain(v);
                    }
                    Ok(())
                }
                Err(e) => Err(e),
            };
            finished.push((slot, result));
        }
    }
}
