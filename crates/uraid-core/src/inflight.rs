//! Member I/Os in flight, found by id without hashing: the id's low 32 bits index a slab,
//! its high 32 bits carry the slot's generation, so a stale or duplicate completion (an id
//! whose slot has since been reused) finds nothing.

use crate::api::MemberIoId;

const GENERATION_LIMIT: u32 = (1 << 24) - 1;

pub(crate) struct InflightIos<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

impl<T> Default for InflightIos<T> {
    fn default() -> Self {
        InflightIos { slots: Vec::new(), free: Vec::new() }
    }
}

impl<T> InflightIos<T> {
    /// Keep `value`; returns the id that finds it.
    pub(crate) fn insert(&mut self, value: T) -> MemberIoId {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { generation: 0, value: None });
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 member I/Os in flight")
            }
        };
        let slot = &mut self.slots[index as usize];
        // Generation 0 is never handed out, so no id is 0 and ids start above 2^32; it
        // wraps below 2^24, so engine ids stay under 2^56, clear of the ranges callers
        // reserve for their own member I/O (see `api::ARRAY_META_IO_ID_BASE`).
        slot.generation = (slot.generation % GENERATION_LIMIT) + 1;
        slot.value = Some(value);
        (u64::from(slot.generation) << 32) | u64::from(index)
    }

    /// Take the value of `id`, if it is still in flight.
    pub(crate) fn remove(&mut self, id: MemberIoId) -> Option<T> {
        let (generation, index) = ((id >> 32) as u32, id as u32);
        let slot = self.slots.get_mut(index as usize)?;
        if slot.generation != generation {
            return None;
        }
        let value = slot.value.take()?;
        self.free.push(index);
        Some(value)
    }

    /// Every slot ever made is either free or holds a value.
    pub(crate) fn is_empty(&self) -> bool {
        self.free.len() == self.slots.len()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|s| s.value.as_ref())
    }

    /// The ids of the values `pick` chooses, in slot order.
    pub(crate) fn ids_where(&self, mut pick: impl FnMut(&T) -> bool) -> Vec<MemberIoId> {
        let held =
            self.slots.iter().enumerate().filter_map(|(i, s)| Some((i, s.generation, s.value.as_ref()?)));
        held.filter(|(_, _, v)| pick(v)).map(|(i, g, _)| (u64::from(g) << 32) | i as u64).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_and_duplicate_ids_find_nothing() {
        let mut ios = InflightIos::default();
        let a = ios.insert("a");
        assert_eq!(ios.remove(a), Some("a"));
        assert_eq!(ios.remove(a), None, "duplicate completion");
        let b = ios.insert("b");
        assert_ne!(a, b, "a reused slot gets a new id");
        assert_eq!(ios.remove(a), None, "stale id of the slot's previous user");
        assert!(!ios.is_empty());
        assert_eq!(ios.values().copied().collect::<Vec<_>>(), ["b"]);
        assert_eq!(ios.ids_where(|v| *v == "b"), [b]);
        assert!(ios.ids_where(|v| *v == "a").is_empty());
        assert_eq!(ios.remove(b), Some("b"));
        assert!(ios.is_empty());
        assert_eq!(ios.remove(12345), None, "an id never handed out");
    }
}
