//! What each key holds in the gateway's memory: the bodies of its requests while they are read
//! and run, the `response.create` frames of its WebSocket turns, and the history its WebSocket
//! connections keep for continuations — together at most `[server] key_memory_mib`, so that no
//! key holder can take the box however many connections and turns the key allows.
//!
//! A holder takes a [`Charge`] and grows it before it holds more; a growth past the key's limit
//! is refused (the holder answers 429 or forgets old history) and the charge is released when
//! it is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Bytes each key may hold, and what each holds now.
#[derive(Debug)]
pub struct MemoryLedger {
    limit: usize,
    held: Mutex<HashMap<String, usize, super::Hasher>>,
}

impl MemoryLedger {
    pub fn new(limit_bytes: usize) -> Arc<MemoryLedger> {
        Arc::new(MemoryLedger {
            limit: limit_bytes,
            held: Mutex::new(HashMap::default()),
        })
    }

    /// The bytes a key may hold.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// What a key holds now.
    pub fn held(&self, key: &str) -> usize {
        self.lock().get(key).copied().unwrap_or(0)
    }

    /// An empty charge for `key`.
    pub fn charge(self: &Arc<Self>, key: &str) -> Charge {
        Charge {
            ledger: self.clone(),
            key: key.to_string(),
            bytes: 0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize, super::Hasher>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds `more` to what `key` holds unless that passes the limit.
    fn grow(&self, key: &str, more: usize) -> bool {
        let limit = self.limit();
        let mut held = self.lock();
        // A body pays chunk by chunk: the key's entry is made once, not per chunk.
        match held.get_mut(key) {
            Some(now) if now.saturating_add(more) > limit => false,
            Some(now) => {
                *now += more;
                true
            }
            None if more > limit => false,
            None => {
                held.insert(key.to_string(), more);
                true
            }
        }
    }

    fn release(&self, key: &str, less: usize) {
        let mut held = self.lock();
        if let Some(now) = held.get_mut(key) {
            *now = now.saturating_sub(less);
            if *now == 0 {
                held.remove(key);
            }
        }
    }
}

/// Bytes one holder holds for a key; released when dropped.
#[derive(Debug)]
pub struct Charge {
    ledger: Arc<MemoryLedger>,
    key: String,
    bytes: usize,
}

/// A growth the key's limit does not allow: what the key holds and may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget {
    pub held: usize,
    pub limit: usize,
}

impl OverBudget {
    /// The refusal's words, for a client.
    pub fn message(&self, what: &str) -> String {
        format!(
            "{what} would take this key past its memory budget: it holds {} of {} in request bodies and WebSocket history ([server] key_memory_mib); retry when its other requests are done",
            mib(self.held),
            mib(self.limit)
        )
    }
}

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl Charge {
    /// What this charge holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Grows by `more`; refused, and nothing changed, when the key would pass its limit.
    pub fn grow(&mut self, more: usize) -> Result<(), OverBudget> {
        if more == 0 || self.ledger.grow(&self.key, more) {
            self.bytes += more;
            Ok(())
        } else {
            Err(OverBudget {
                held: self.ledger.held(&self.key),
                limit: self.ledger.limit(),
            })
        }
    }

    /// Holds `bytes` from now on: less always, more as [`Charge::grow`] allows.
    pub fn set(&mut self, bytes: usize) -> Result<(), OverBudget> {
        if bytes >= self.bytes {
            self.grow(bytes - self.bytes)
        } else {
            self.ledger.release(&self.key, self.bytes - bytes);
            self.bytes = bytes;
            Ok(())
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.ledger.release(&self.key, self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_holds_at_most_its_limit_across_holders_and_gets_it_back_when_they_end() {
        let ledger = MemoryLedger::new(100);
        let mut a = ledger.charge("k1");
        let mut b = ledger.charge("k1");
        let mut other = ledger.charge("k2");
        a.grow(60).unwrap();
        // Another holder of the same key: refused past the limit, and unchanged.
        assert_eq!(
            b.grow(41),
            Err(OverBudget {
                held: 60,
                limit: 100
            })
        );
        assert_eq!((b.bytes(), ledger.held("k1")), (0, 60));
        b.grow(40).unwrap();
        // Another key has its own limit.
        other.grow(100).unwrap();
        assert!(a.grow(1).is_err());
        // Shrinking always works and makes room.
        a.set(10).unwrap();
        assert_eq!(ledger.held("k1"), 50);
        b.set(90).unwrap();
        assert!(b.set(91).is_err());
        assert_eq!((ledger.held("k1"), ledger.held("k2")), (100, 100));
        drop(a);
        drop(b);
        assert_eq!(ledger.held("k1"), 0);
        assert!(
            !ledger.lock().contains_key("k1"),
            "an empty key leaves no entry"
        );
        let mut c = ledger.charge("k2");
        assert!(c.grow(1).is_err());
        drop(other);
        c.grow(100).unwrap();
        assert!(
            OverBudget {
                held: 3 << 20,
                limit: 4 << 20
            }
            .message("this body")
            .contains("3.0 MiB of 4.0 MiB")
        );
    }

    #[test]
    fn concurrent_holders_of_one_key_never_pass_its_limit_together() {
        let ledger = MemoryLedger::new(1000);
        let taken: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let ledger = ledger.clone();
                    s.spawn(move || {
                        let mut c = ledger.charge("k");
                        let mut got = 0;
                        for _ in 0..200 {
                            if c.grow(7).is_ok() {
                                got += 7;
                            }
                        }
                        std::mem::forget(c);
                        got
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert!(taken <= 1000, "{taken}");
        assert_eq!(ledger.held("k"), taken);
        assert!(
            taken > 1000 - 7,
            "all but the last step was granted: {taken}"
        );
    }
}
