//! The accounts, with a compact copy of what the scheduler reads from each.
//!
//! An [`Entry`] is large and lives in a B-tree node; a plan reads a few fields from every one
//! of them, and at 1,000 accounts that walk through memory was most of a plan's cost. So each
//! entry has a [`Hot`] row in one contiguous array, in the map's order. The rows cannot go
//! stale: the only way to change an entry is through [`EntryMut`], which rewrites the entry's
//! row when it is dropped, and inserting or removing an account rebuilds the array. Debug
//! builds check every row against its entry on every plan.

use std::collections::{BTreeMap, VecDeque};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use super::Entry;
use super::health::Gate;
use super::scheduler::Waiter;
use crate::upstream::quota::QuotaSnapshot;

/// What a plan reads from an entry: one cache line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Hot {
    /// Yes-or-no facts, one bit each (see the methods), so that the row keeps to a line.
    flags: u8,
    pub gate: Gate,
    pub priority: i32,
    pub in_flight: u32,
    /// Its slots: the adaptive limit's floor, at least 1.
    pub slots: u32,
    pub created_at: u64,
    /// The higher of its two windows' used percentages (minus infinity when neither is known).
    pub most_used_percent: f64,
    /// The quota-aware strategy's key (below 2^92), worked out when the quota changes.
    pub headroom: u128,
}

// A plan walks every row: they stay within a cache line each.
const _: () = assert!(std::mem::size_of::<Hot>() <= 64);

const ENABLED: u8 = 1;
const HAS_TOKENS: u8 = 1 << 1;
const DRAINING: u8 = 1 << 2;
const ANY_UNSUPPORTED: u8 = 1 << 3;
const PLAIN: u8 = 1 << 4;

impl Hot {
    pub fn of(e: &Entry) -> Hot {
        let q = e.quota.as_ref();
        let gate = e.health.gate();
        let flag = |yes: bool, bit: u8| if yes { bit } else { 0 };
        let mut flags = flag(e.record.enabled, ENABLED)
            | flag(e.secrets.is_some(), HAS_TOKENS)
            | flag(e.draining, DRAINING)
            | flag(!e.unsupported.is_empty(), ANY_UNSUPPORTED);
        // Eligible for any model at any moment: the common case, decided once here.
        if flags == ENABLED | HAS_TOKENS && gate.ready() {
            flags |= PLAIN;
        }
        Hot {
            flags,
            gate,
            priority: e.record.priority,
            in_flight: e.in_flight,
            slots: e.limit.floor().max(1.0) as u32,
            created_at: e.record.created_at,
            most_used_percent: q
                .map(|q| [q.primary_used_percent, q.secondary_used_percent])
                .into_iter()
                .flatten()
                .flatten()
                .fold(f64::NEG_INFINITY, f64::max),
            headroom: headroom_key(q),
        }
    }

    pub fn enabled(&self) -> bool {
        self.flags & ENABLED != 0
    }

    pub fn has_tokens(&self) -> bool {
        self.flags & HAS_TOKENS != 0
    }

    pub fn draining(&self) -> bool {
        self.flags & DRAINING != 0
    }

    /// It has at least one unsupported-model mark (the marks themselves stay in the entry).
    pub fn any_unsupported(&self) -> bool {
        self.flags & ANY_UNSUPPORTED != 0
    }

    /// Eligible for any model at any moment (enabled, with tokens, not draining, no
    /// unsupported-model marks, ready and proven): the common case, which a plan takes without
    /// a closer look.
    pub fn plainly_eligible(&self) -> bool {
        self.flags & PLAIN != 0
    }
}

/// The quota-aware order among accounts of equal priority (lower goes first), as one number
/// below 2^92 (a plan puts the priority above it): the primary window's used percentage and
/// the secondary's in the top 28 bits, then the primary's reset while that window is in use.
fn headroom_key(q: Option<&QuotaSnapshot>) -> u128 {
    let pct = |v: Option<f64>| (v.unwrap_or(0.0).clamp(0.0, 100.0) * 100.0) as u64;
    let primary = pct(q.and_then(|q| q.primary_used_percent));
    // The soonest reset breaks ties only between windows in use: the reset of an unused
    // window says nothing, and accounts with equal headroom take turns.
    let reset = if primary > 0 {
        q.and_then(|q| q.primary_reset_at).unwrap_or(u64::MAX)
    } else {
        0
    };
    // Each percentage is at most 10,000: 14 bits.
    let used = primary << 14 | pct(q.and_then(|q| q.secondary_used_percent));
    u128::from(used) << 64 | u128::from(reset)
}

/// The accounts by id, and their [`Hot`] rows.
#[derive(Default)]
pub(crate) struct Accounts {
    map: BTreeMap<String, Entry>,
    /// `hot[i]` is the row of the map's `i`-th entry, whose `slot` is `i`.
    hot: Vec<Hot>,
    /// `ids[i]` is the id of that entry (an entry's id never changes).
    ids: Vec<Arc<str>>,
}

/// A borrowed entry that may be changed; its row is rewritten when it is dropped.
pub(crate) struct EntryMut<'a> {
    entry: &'a mut Entry,
    hot: &'a mut Hot,
}

impl Deref for EntryMut<'_> {
    type Target = Entry;
    fn deref(&self) -> &Entry {
        self.entry
    }
}

impl DerefMut for EntryMut<'_> {
    fn deref_mut(&mut self) -> &mut Entry {
        self.entry
    }
}

impl EntryMut<'_> {
    /// The entry's row, as it stands until the entry is changed through this borrow.
    pub fn row(&self) -> &Hot {
        debug_assert_eq!(
            *self.hot,
            Hot::of(self.entry),
            "a row is rewritten with its entry"
        );
        self.hot
    }
}

impl EntryMut<'_> {
    /// Ends the borrow after a change of the slots in use alone (`in_flight`, and `probing`,
    /// which no row holds): the row's count is set instead of the whole row built again (a
    /// request takes a slot and gives it back through this).
    pub fn slots_changed(self) {
        self.hot.in_flight = self.entry.in_flight;
        debug_assert_eq!(
            *self.hot,
            Hot::of(self.entry),
            "only the slots in use changed"
        );
        std::mem::forget(self);
    }
}

impl Drop for EntryMut<'_> {
    fn drop(&mut self) {
        *self.hot = Hot::of(self.entry);
    }
}

impl From<BTreeMap<String, Entry>> for Accounts {
    fn from(map: BTreeMap<String, Entry>) -> Accounts {
        let mut a = Accounts {
            map,
            hot: Vec::new(),
            ids: Vec::new(),
        };
        a.rebuild();
        a
    }
}

impl Accounts {
    fn rebuild(&mut self) {
        self.hot.clear();
        self.ids.clear();
        for (slot, (id, e)) in self.map.iter_mut().enumerate() {
            e.slot = slot;
            self.hot.push(Hot::of(e));
            self.ids.push(Arc::from(id.as_str()));
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.map.contains_key(id)
    }

    pub fn get(&self, id: &str) -> Option<&Entry> {
        self.map.get(id)
    }

    pub fn values(&self) -> impl Iterator<Item = &Entry> {
        self.map.values()
    }

    /// Every account's row, in id order.
    pub fn rows(&self) -> &[Hot] {
        &self.hot
    }

    /// The id of the `i`-th account in id order (`i` indexes [`Accounts::rows`]).
    pub fn id(&self, i: usize) -> &str {
        &self.ids[i]
    }

    /// The same id, to share.
    pub fn shared_id(&self, i: usize) -> &Arc<str> {
        &self.ids[i]
    }

    pub fn get_mut(&mut self, id: &str) -> Option<EntryMut<'_>> {
        let entry = self.map.get_mut(id)?;
        let hot = &mut self.hot[entry.slot];
        Some(EntryMut { entry, hot })
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = EntryMut<'_>> {
        self.map
            .values_mut()
            .zip(self.hot.iter_mut())
            .map(|(entry, hot)| EntryMut { entry, hot })
    }

    /// The queue of sessions waiting for `id`'s slots: not part of its row, so it may be
    /// changed without one being rewritten.
    pub fn waiters_mut(&mut self, id: &str) -> Option<&mut VecDeque<Waiter>> {
        self.map.get_mut(id).map(|e| &mut e.waiters)
    }

    /// Applies `update` to the entry for `id`, made by `make` when there is none.
    pub fn upsert<T>(
        &mut self,
        id: String,
        make: impl FnOnce() -> Entry,
        update: impl FnOnce(&mut Entry) -> T,
    ) -> T {
        if let Some(mut e) = self.get_mut(&id) {
            return update(&mut e);
        }
        let mut e = make();
        let out = update(&mut e);
        self.map.insert(id, e);
        self.rebuild();
        out
    }

    pub fn remove(&mut self, id: &str) -> Option<Entry> {
        let e = self.map.remove(id)?;
        self.rebuild();
        Some(e)
    }

    /// Debug builds: every row matches its entry.
    pub fn check_rows(&self) {
        if cfg!(debug_assertions) {
            debug_assert_eq!(self.hot.len(), self.map.len(), "scheduler rows missing");
            for ((id, e), (row_id, hot)) in self.map.iter().zip(self.ids.iter().zip(&self.hot)) {
                debug_assert_eq!(id.as_str(), &**row_id, "scheduler row out of order");
                debug_assert_eq!(*hot, Hot::of(e), "stale scheduler row for {id}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::health::Health;
    use crate::store::records::AccountRecord;

    fn entry(id: &str) -> Entry {
        Entry::new(AccountRecord::for_test(id), Health::default(), None, 3.0)
    }

    fn ids(a: &Accounts) -> Vec<&str> {
        (0..a.rows().len()).map(|i| a.id(i)).collect()
    }

    #[test]
    fn every_way_to_change_an_entry_rewrites_its_row() {
        let mut a = Accounts::from(
            ["b", "d"]
                .into_iter()
                .map(|id| (id.to_string(), entry(id)))
                .collect::<BTreeMap<_, _>>(),
        );
        assert_eq!(ids(&a), ["b", "d"]);
        // Through the guard.
        a.get_mut("d").unwrap().draining = true;
        assert!(a.rows()[1].draining());
        a.get_mut("b").unwrap().in_flight = 2;
        assert_eq!(a.rows()[0].in_flight, 2);
        for mut e in a.values_mut() {
            e.record.enabled = false;
        }
        assert!(a.rows().iter().all(|h| !h.enabled()));
        // Inserting keeps the rows in id order, the new one in its place.
        a.upsert("c".into(), || entry("c"), |e| e.record.priority = -5);
        assert_eq!(ids(&a), ["b", "c", "d"]);
        assert_eq!(a.rows()[1].priority, -5);
        assert!(a.rows()[2].draining(), "d's row moved with it");
        // An existing entry is updated, not replaced.
        a.upsert("b".into(), || entry("b"), |e| e.draining = true);
        assert_eq!((a.rows()[0].draining(), a.rows()[0].in_flight), (true, 2));
        // Removing one leaves the others' rows matching their entries.
        a.remove("c");
        assert_eq!(ids(&a), ["b", "d"]);
        a.get_mut("d")
            .unwrap()
            .unsupported
            .insert("m".into(), u64::MAX);
        assert!(a.rows()[1].any_unsupported());
        for (i, e) in a.values().enumerate() {
            assert_eq!(a.rows()[i], Hot::of(e));
        }
        a.check_rows();
    }
}
