//! Statuses the operator has written but its watch cache may not show yet. A reconcile
//! started a moment after a status write (by a ConfigMap it wrote, a tool, a Deployment)
//! reads the object from the cache, which may still hold the status from before the write:
//! compared with that, the same status would be written, and the same Event published, a
//! second time. The status written is taken as current while the cache shows the object at
//! the resourceVersion the write was made over.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a written status stands in for the cache's: well past any watch delay, short
/// enough that a write the cache never reflects (the object deleted and created again)
/// cannot hide a change for long.
const TRUST: Duration = Duration::from_secs(60);
/// Entries older than [`TRUST`] are dropped every so many writes.
const PRUNE_EVERY: usize = 1024;

/// Written statuses of one kind, by `namespace/name`.
pub struct Written<S> {
    inner: Mutex<Entries<S>>,
}

struct Entries<S> {
    by_object: HashMap<String, Entry<S>>,
    writes: usize,
}

struct Entry<S> {
    /// The resourceVersion of the object the status was written over.
    over: String,
    status: S,
    at: Instant,
}

impl<S> Default for Written<S> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Entries {
                by_object: HashMap::new(),
                writes: 0,
            }),
        }
    }
}

impl<S: Clone> Written<S> {
    /// The status of `key` to compare with: the one written over `resource_version` when
    /// the cache still shows that version, else `cached`.
    pub fn current(&self, key: &str, resource_version: Option<&str>, cached: Option<S>) -> Option<S> {
        let mut e = self.inner.lock().expect("lock");
        match e.by_object.get(key) {
            Some(w) if Some(w.over.as_str()) == resource_version && w.at.elapsed() < TRUST => Some(w.status.clone()),
            Some(_) => {
                // The cache has moved past the write (or it is too old to trust).
                e.by_object.remove(key);
                cached
            }
            None => cached,
        }
    }

    /// `status` was written to `key` over `resource_version`.
    pub fn record(&self, key: String, resource_version: Option<&str>, status: S) {
        let Some(over) = resource_version else { return };
        let mut e = self.inner.lock().expect("lock");
        e.writes += 1;
        if e.writes % PRUNE_EVERY == 0 {
            e.by_object.retain(|_, w| w.at.elapsed() < TRUST);
        }
        e.by_object.insert(
            key,
            Entry {
                over: over.to_string(),
                status,
                at: Instant::now(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_status_stands_in_until_the_cache_moves_on() {
        let w = Written::<&str>::default();
        assert_eq!(w.current("ns/a", Some("1"), Some("old")), Some("old"));
        w.record("ns/a".into(), Some("1"), "new");
        // The cache still shows version 1: what was written is current.
        assert_eq!(w.current("ns/a", Some("1"), Some("old")), Some("new"));
        assert_eq!(w.current("ns/b", Some("1"), Some("other")), Some("other"));
        // The cache shows the write (or anything after it): the cache is current again,
        // and stays so.
        assert_eq!(w.current("ns/a", Some("2"), Some("cached")), Some("cached"));
        assert_eq!(w.current("ns/a", Some("1"), Some("old")), Some("old"));
    }
}
