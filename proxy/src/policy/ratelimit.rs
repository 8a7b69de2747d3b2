//! GCRA rate limiting with a bounded key map. Each key costs one `u64` (its theoretical
//! arrival time); a key whose TAT is in the past holds no information and is the first to go
//! when the map is full, then the least recently used: eviction is amortized over a tenth of
//! the capacity, so a flood of distinct keys can never grow memory past the cap.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const SHARDS: usize = 16;

/// `requests` per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Requests allowed per window (also the burst).
    pub requests: u64,
    /// Window length.
    pub window: Duration,
}

impl From<toolgate_config::Limit> for Rate {
    fn from(l: toolgate_config::Limit) -> Self {
        Self {
            requests: l.requests.max(1),
            window: Duration::from_secs(l.window_seconds.max(1)),
        }
    }
}

struct Entry {
    tat: u64,
    last_seen: u64,
}

impl Entry {
    /// Counts one request at `now` (GCRA): refused with the wait when it is over the limit.
    fn advance(&mut self, now: u64, interval: u64, tolerance: u64) -> Result<(), Duration> {
        self.last_seen = now;
        let tat = self.tat.max(now);
        if tat - now > tolerance {
            return Err(Duration::from_nanos(tat - now - tolerance));
        }
        self.tat = tat + interval;
        Ok(())
    }
}

/// SipHash, keyed per map: limiter keys come from the network (a client's address before any
/// authentication), and foldhash, faster, makes no claim against an attacker who probes for
/// collisions.
type Hasher = std::collections::hash_map::RandomState;

/// One limiter (per IP, per identity, or per identity and tool), keyed by `K`.
pub struct Limiter<K = String> {
    shards: Vec<Mutex<HashMap<K, Entry, Hasher>>>,
    hasher: Hasher,
    epoch: Instant,
    max_keys: AtomicU64,
}

impl<K: Hash + Eq> Limiter<K> {
    /// A limiter tracking at most `max_keys` keys.
    pub fn new(max_keys: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::default())).collect(),
            hasher: Hasher::default(),
            epoch: Instant::now(),
            max_keys: AtomicU64::new(max_keys.max(SHARDS) as u64),
        }
    }

    /// Changes the cap (on config reload).
    pub fn set_max_keys(&self, max_keys: usize) {
        self.max_keys.store(max_keys.max(SHARDS) as u64, Ordering::Relaxed);
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Counts one request for `key`; `Err(retry_after)` when it is over `rate`.
    pub fn check<Q>(&self, key: &Q, rate: Rate) -> Result<(), Duration>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_at(key, rate, self.now_ns())
    }

    fn check_at<Q>(&self, key: &Q, rate: Rate, now: u64) -> Result<(), Duration>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let window = u64::try_from(rate.window.as_nanos()).unwrap_or(u64::MAX);
        let interval = (window / rate.requests.max(1)).max(1);
        let tolerance = window.saturating_sub(interval);
        let shard = &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS];
        let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
        // A known key (the common case) is found without copying it.
        if let Some(entry) = map.get_mut(key) {
            return entry.advance(now, interval, tolerance);
        }
        let cap = (self.max_keys.load(Ordering::Relaxed) as usize / SHARDS).max(1);
        if map.len() >= cap {
            evict(&mut map, now, cap);
        }
        map.entry(key.to_owned())
            .or_insert(Entry {
                tat: now,
                last_seen: now,
            })
            .advance(now, interval, tolerance)
    }

    /// Keys tracked now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    /// No keys tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Drops idle keys (TAT in the past), then the least recently used, down to 90% of `cap`.
fn evict<K>(map: &mut HashMap<K, Entry, Hasher>, now: u64, cap: usize) {
    map.retain(|_, e| e.tat > now);
    let target = cap - cap / 10 - 1;
    if map.len() > target {
        let mut seen: Vec<u64> = map.values().map(|e| e.last_seen).collect();
        let cut = map.len() - target;
        seen.select_nth_unstable(cut - 1);
        let threshold = seen[cut - 1];
        let mut removed = 0;
        map.retain(|_, e| {
            if removed < cut && e.last_seen <= threshold {
                removed += 1;
                false
            } else {
                true
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn allows_the_rate_then_refuses_with_retry_after() {
        let l = Limiter::new(1000);
        let rate = Rate {
            requests: 3,
            window: Duration::from_secs(60),
        };
        for _ in 0..3 {
            assert!(l.check_at("k", rate, 10 * SEC).is_ok());
        }
        let retry = l.check_at("k", rate, 10 * SEC).unwrap_err();
        assert_eq!(retry, Duration::from_secs(20));
        assert!(
            l.check_at("k", rate, 30 * SEC).is_ok(),
            "one request's worth refilled after 20 s"
        );
        assert!(l.check_at("other", rate, 30 * SEC).is_ok(), "keys are independent");
    }

    #[test]
    fn a_flood_of_distinct_keys_stays_at_the_cap() {
        let l = Limiter::new(50_000);
        let rate = Rate {
            requests: 60,
            window: Duration::from_secs(60),
        };
        for i in 0..100_000u64 {
            assert!(l.check_at(&format!("key-{i}"), rate, 1000 * SEC + i).is_ok());
        }
        assert!(l.len() <= 50_000, "{} keys", l.len());
        assert!(l.len() >= 40_000, "eviction is not overeager: {}", l.len());
    }

    #[test]
    fn recently_used_keys_survive_eviction() {
        let l = Limiter::new(160);
        let rate = Rate {
            requests: 1,
            window: Duration::from_secs(3600),
        };
        assert!(l.check_at("hot", rate, SEC).is_ok());
        for i in 0..1000u64 {
            let _ = l.check_at(&format!("k{i}"), rate, 2 * SEC + i);
            let _ = l.check_at("hot", rate, 2 * SEC + i);
        }
        assert!(l.check_at("hot", rate, 3 * SEC).is_err(), "the hot key kept its state");
    }
}
