//! MCP sessions: a cryptographically random `Mcp-Session-Id` per `initialize`, ended by
//! `DELETE`, by idling past the TTL, or to make room when the table is full.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// One client session.
#[derive(Debug)]
pub struct Session {
    /// The id sent in `Mcp-Session-Id`.
    pub id: Arc<str>,
    /// The negotiated protocol version.
    pub version: &'static str,
    /// `clientInfo.name` from initialize.
    pub client_name: Option<String>,
    /// `clientInfo.version` from initialize.
    pub client_version: Option<String>,
    /// The authenticated subject that opened the session; only it may use the session.
    pub subject: String,
    /// `notifications/initialized` arrived.
    pub initialized: AtomicBool,
    /// The highest role rank at which this session was shown `tools/list` (plus one; 0: never).
    listed_rank: AtomicUsize,
    last_seen_ms: AtomicU64,
}

/// The session table.
pub struct Sessions {
    map: RwLock<HashMap<Arc<str>, Arc<Session>>>,
    epoch: Instant,
}

impl Default for Sessions {
    fn default() -> Self {
        Self {
            map: RwLock::new(HashMap::new()),
            epoch: Instant::now(),
        }
    }
}

/// A new random session id: 32 bytes from the OS CSPRNG, hex encoded (visible ASCII).
pub fn new_id() -> String {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf).expect("the OS random number generator is available");
    let mut s = String::with_capacity(64);
    for b in buf {
        s.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        s.push(char::from_digit(u32::from(b & 15), 16).unwrap_or('0'));
    }
    s
}

impl Session {
    /// Records that the session was shown the tools visible at role `rank`.
    pub fn saw_tools_at_rank(&self, rank: usize) {
        self.listed_rank.fetch_max(rank + 1, Ordering::Relaxed);
    }

    /// Whether the session was shown the tools a caller of role `rank` sees.
    pub fn was_shown_rank(&self, rank: usize) -> bool {
        self.listed_rank.load(Ordering::Relaxed) > rank
    }
}

impl Sessions {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Creates a session, evicting expired ones (or the longest idle) when `max` are live.
    pub fn create(
        &self,
        version: &'static str,
        client_name: Option<String>,
        client_version: Option<String>,
        subject: String,
        ttl: Duration,
        max: usize,
    ) -> Arc<Session> {
        let now = self.now_ms();
        let id: Arc<str> = Arc::from(new_id());
        let session = Arc::new(Session {
            id: id.clone(),
            version,
            client_name,
            client_version,
            subject,
            initialized: AtomicBool::new(false),
            listed_rank: AtomicUsize::new(0),
            last_seen_ms: AtomicU64::new(now),
        });
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        // One subject may hold at most half the table, so no single caller can push everyone
        // else's sessions out (not applied to `anonymous`, the only subject without auth).
        if session.subject != "anonymous" {
            let cap = (max / 2).max(1);
            let mut own: Vec<(u64, Arc<str>)> = map
                .iter()
                .filter(|(_, s)| s.subject == session.subject)
                .map(|(k, s)| (s.last_seen_ms.load(Ordering::Relaxed), k.clone()))
                .collect();
            if own.len() >= cap {
                own.sort_unstable();
                for (_, k) in own.iter().take(own.len() + 1 - cap) {
                    map.remove(k);
                }
            }
        }
        if map.len() >= max {
            let ttl_ms = ttl.as_millis() as u64;
            map.retain(|_, s| now.saturating_sub(s.last_seen_ms.load(Ordering::Relaxed)) <= ttl_ms);
            while map.len() >= max {
                let Some(oldest) = map
                    .iter()
                    .min_by_key(|(_, s)| s.last_seen_ms.load(Ordering::Relaxed))
                    .map(|(k, _)| k.clone())
                else {
                    break;
                };
                map.remove(&oldest);
            }
        }
        map.insert(id, session.clone());
        session
    }

    /// The live session `id`, refreshed; `None` if unknown, ended or expired.
    pub fn get(&self, id: &str, ttl: Duration) -> Option<Arc<Session>> {
        let now = self.now_ms();
        let session = self.map.read().unwrap_or_else(|e| e.into_inner()).get(id).cloned()?;
        if now.saturating_sub(session.last_seen_ms.load(Ordering::Relaxed)) > ttl.as_millis() as u64 {
            self.remove(id);
            return None;
        }
        session.last_seen_ms.store(now, Ordering::Relaxed);
        Some(session)
    }

    /// Ends session `id`; whether it existed.
    pub fn remove(&self, id: &str) -> bool {
        self.map.write().unwrap_or_else(|e| e.into_inner()).remove(id).is_some()
    }

    /// Drops every session idle longer than `ttl`.
    pub fn sweep(&self, ttl: Duration) {
        let now = self.now_ms();
        let ttl_ms = ttl.as_millis() as u64;
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, s| now.saturating_sub(s.last_seen_ms.load(Ordering::Relaxed)) <= ttl_ms);
    }

    /// Live sessions.
    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// No live sessions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(60);

    #[test]
    fn ids_are_random_and_visible_ascii() {
        let a = new_id();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, new_id());
    }

    #[test]
    fn removed_and_expired_sessions_are_gone() {
        let s = Sessions::default();
        let a = s.create("2025-06-18", None, None, "s".into(), TTL, 10);
        assert!(s.get(&a.id, TTL).is_some());
        assert!(s.remove(&a.id));
        assert!(s.get(&a.id, TTL).is_none());
        let b = s.create("2025-06-18", None, None, "s".into(), TTL, 10);
        std::thread::sleep(Duration::from_millis(5));
        assert!(s.get(&b.id, Duration::from_millis(1)).is_none());
    }

    #[test]
    fn one_subject_cannot_push_out_everyone_else() {
        let s = Sessions::default();
        let other = s.create("2025-06-18", None, None, "victim".into(), TTL, 4);
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(1));
            s.create("2025-06-18", None, None, "flooder".into(), TTL, 4);
        }
        assert!(s.get(&other.id, TTL).is_some(), "the other subject's session survives");
        assert_eq!(s.len(), 3, "the flooder holds at most half the table");
    }

    #[test]
    fn the_table_is_bounded_and_evicts_the_longest_idle() {
        let s = Sessions::default();
        let first = s.create("2025-06-18", None, None, "anonymous".into(), TTL, 3);
        std::thread::sleep(Duration::from_millis(2));
        let second = s.create("2025-06-18", None, None, "anonymous".into(), TTL, 3);
        std::thread::sleep(Duration::from_millis(2));
        s.get(&first.id, TTL);
        s.create("2025-06-18", None, None, "anonymous".into(), TTL, 3);
        s.create("2025-06-18", None, None, "anonymous".into(), TTL, 3);
        assert_eq!(s.len(), 3);
        assert!(s.get(&second.id, TTL).is_none(), "the longest-idle session is evicted");
        assert!(s.get(&first.id, TTL).is_some());
    }
}
