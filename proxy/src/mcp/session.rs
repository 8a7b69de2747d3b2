//! MCP sessions of the 2025 revisions. With `server.sessionKeyFile` an id is sealed (see
//! [`super::sealed`]): any replica holding the key accepts it, it lives `sessionTtlSeconds`
//! from `initialize`, and `DELETE` revokes it (in the shared store when there is one, so on
//! every replica). Without a key, sessions live in this table: a cryptographically random id
//! per `initialize`, ended by `DELETE`, by idling past the TTL, or to make room when the table
//! is full (one replica only).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// Keys are the random ids this proxy issued (clients only look them up): foldhash.
use foldhash::{HashMap, HashMapExt};

use super::sealed::{anonymous_digest, subject_digest, Claims, SessionKeys};
use crate::policy::Identity;

/// One client session.
#[derive(Debug)]
pub struct Session {
    /// The id sent in `Mcp-Session-Id`.
    pub id: Arc<str>,
    /// What audit records, traces and revocations name the session by: the id itself for an
    /// in-memory session, the sealed id's random handle otherwise.
    pub handle: Arc<str>,
    /// The negotiated protocol version.
    pub version: &'static str,
    /// `clientInfo.name` from initialize.
    pub client_name: Option<String>,
    /// `clientInfo.version` from initialize.
    pub client_version: Option<String>,
    /// Digest of the authenticated subject that opened the session; only it may use it.
    pub subject: String,
    /// The subject's role rank at initialize: the tools up to it were in its view, so a later
    /// call to one of them that its (since lowered) role cannot make gets a clear refusal
    /// rather than "unknown tool".
    pub rank: usize,
    /// Sealed sessions: when the id stops opening (Unix seconds).
    pub expires: Option<u64>,
    /// When the session was opened (Unix milliseconds; a sealed id has its `issued` second).
    pub started_ms: u64,
    /// In-memory sessions: when it was created, on the table's clock (as `last_seen_ms`).
    created_ms: u64,
    anonymous: bool,
    last_seen_ms: AtomicU64,
}

impl Session {
    /// Whether `who` opened this session.
    pub fn belongs_to(&self, who: &Identity) -> bool {
        self.subject == who.subject_digest()
    }

    /// Seconds until a sealed session expires (at least 1); `None` for an in-memory one.
    pub fn remaining(&self) -> Option<Duration> {
        self.expires
            .map(|e| Duration::from_secs(e.saturating_sub(unix_now()).max(1)))
    }
}

/// Unix time in seconds.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `DELETE`: it lasted until now.
    Deleted,
    /// Idle past the TTL (in memory): it lasted until it was last used.
    Idle,
    /// Pushed out of a full table (in memory): until it was last used, `error.type=evicted`.
    Evicted,
}

/// Records the end of `session` in `mcp.server.session.duration`. A sealed session that is
/// never deleted just stops opening: no replica sees it end, so it is not recorded.
pub fn ended(session: &Session, end: End) {
    let ms = match end {
        End::Deleted => unix_now_ms().saturating_sub(session.started_ms),
        End::Idle | End::Evicted => session
            .last_seen_ms
            .load(Ordering::Relaxed)
            .saturating_sub(session.created_ms),
    };
    let seconds = ms as f64 / 1e3;
    let error = (end == End::Evicted).then_some("evicted");
    crate::metrics::METRICS
        .mcp_session_duration
        .with_label_values(&[session.version, error.unwrap_or("")])
        .observe(seconds);
    if crate::otel::metrics_enabled() {
        use crate::otel::KeyValue;
        let mut attributes = vec![
            KeyValue::new("mcp.protocol.version", session.version),
            KeyValue::new("network.transport", "tcp"),
            KeyValue::new("network.protocol.name", "http"),
        ];
        if let Some(e) = error {
            attributes.push(KeyValue::new("error.type", e));
        }
        crate::otel::session_duration(seconds, &attributes);
    }
}

/// A new sealed session's id and state.
pub fn seal(
    keys: &SessionKeys,
    version: &'static str,
    client_name: Option<String>,
    client_version: Option<String>,
    subject: &str,
    rank: usize,
    ttl: Duration,
) -> Arc<Session> {
    let issued = unix_now();
    let claims = Claims {
        handle: super::sealed::random_handle(),
        subject: subject_digest(subject),
        version: version.into(),
        client_name,
        client_version,
        rank,
        issued,
        expires: issued.saturating_add(ttl.as_secs()),
    };
    let id = keys.seal(&claims);
    from_claims(id, claims, version)
}

/// The sealed session `id`, if a key opens it and it has not expired, by the expiry it was
/// sealed with or by `ttl` now, whichever comes first (a TTL lowered in an incident applies to
/// sessions already open). The subject and revocations are the caller's to check.
pub fn open(keys: &SessionKeys, id: &str, ttl: Duration) -> Option<Arc<Session>> {
    let mut claims = keys.open(id)?;
    claims.expires = claims.expires.min(claims.issued.saturating_add(ttl.as_secs()));
    if claims.expires <= unix_now() {
        return None;
    }
    let version = toolgate_config::LEGACY_PROTOCOL_VERSIONS
        .iter()
        .copied()
        .find(|v| *v == claims.version)?;
    Some(from_claims(id.to_string(), claims, version))
}

fn from_claims(id: String, c: Claims, version: &'static str) -> Arc<Session> {
    Arc::new(Session {
        id: Arc::from(id),
        handle: Arc::from(c.handle),
        version,
        client_name: c.client_name,
        client_version: c.client_version,
        anonymous: *c.subject == **anonymous_digest(),
        subject: c.subject,
        rank: c.rank,
        expires: Some(c.expires),
        started_ms: c.issued.saturating_mul(1000),
        created_ms: 0,
        last_seen_ms: AtomicU64::new(0),
    })
}

/// The in-memory session table.
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
    super::sealed::hex(&buf)
}

impl Sessions {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Creates a session, evicting expired ones (or the longest idle) when `max` are live.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        version: &'static str,
        client_name: Option<String>,
        client_version: Option<String>,
        subject: &str,
        rank: usize,
        ttl: Duration,
        max: usize,
    ) -> Arc<Session> {
        let now = self.now_ms();
        let id: Arc<str> = Arc::from(new_id());
        let session = Arc::new(Session {
            id: id.clone(),
            handle: id.clone(),
            version,
            client_name,
            client_version,
            subject: subject_digest(subject),
            rank,
            expires: None,
            started_ms: unix_now_ms(),
            created_ms: now,
            anonymous: subject == "anonymous",
            last_seen_ms: AtomicU64::new(now),
        });
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        // One subject may hold at most half the table, so no single caller can push everyone
        // else's sessions out (not applied to `anonymous`, the only subject without auth).
        if !session.anonymous {
            let cap = (max / 2).max(1);
            let mut own: Vec<(u64, Arc<str>)> = map
                .iter()
                .filter(|(_, s)| s.subject == session.subject)
                .map(|(k, s)| (s.last_seen_ms.load(Ordering::Relaxed), k.clone()))
                .collect();
            if own.len() >= cap {
                own.sort_unstable();
                for (_, k) in own.iter().take(own.len() + 1 - cap) {
                    if let Some(s) = map.remove(k) {
                        ended(&s, End::Evicted);
                    }
                }
            }
        }
        if map.len() >= max {
            retain_live(&mut map, now, ttl);
            while map.len() >= max {
                let Some(oldest) = map
                    .iter()
                    .min_by_key(|(_, s)| s.last_seen_ms.load(Ordering::Relaxed))
                    .map(|(k, _)| k.clone())
                else {
                    break;
                };
                if let Some(s) = map.remove(&oldest) {
                    ended(&s, End::Evicted);
                }
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
            self.take(id, End::Idle);
            return None;
        }
        session.last_seen_ms.store(now, Ordering::Relaxed);
        Some(session)
    }

    /// Ends session `id` (`DELETE`); whether it existed.
    pub fn remove(&self, id: &str) -> bool {
        self.take(id, End::Deleted)
    }

    fn take(&self, id: &str, end: End) -> bool {
        let removed = self.map.write().unwrap_or_else(|e| e.into_inner()).remove(id);
        if let Some(s) = &removed {
            ended(s, end);
        }
        removed.is_some()
    }

    /// Drops every session idle longer than `ttl`.
    pub fn sweep(&self, ttl: Duration) {
        let now = self.now_ms();
        retain_live(&mut self.map.write().unwrap_or_else(|e| e.into_inner()), now, ttl);
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

/// Keeps the sessions seen within `ttl` of `now` (table milliseconds); the others end.
fn retain_live(map: &mut HashMap<Arc<str>, Arc<Session>>, now: u64, ttl: Duration) {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    map.retain(|_, s| {
        let live = now.saturating_sub(s.last_seen_ms.load(Ordering::Relaxed)) <= ttl_ms;
        if !live {
            ended(s, End::Idle);
        }
        live
    });
}

/// Sealed sessions ended by `DELETE` on this replica, until they expire (the shared store
/// carries them to the other replicas). Bounded: when full, the entry closest to expiry goes.
#[derive(Default)]
pub struct Revoked {
    map: Mutex<HashMap<Arc<str>, u64>>,
}

impl Revoked {
    /// Remembers that `session` ended; at most `max` entries are kept.
    pub fn insert(&self, session: &Session, max: usize) {
        let Some(expires) = session.expires else { return };
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= max.max(1) {
            let now = unix_now();
            map.retain(|_, e| *e > now);
            while map.len() >= max.max(1) {
                let Some(k) = map.iter().min_by_key(|(_, e)| **e).map(|(k, _)| k.clone()) else {
                    break;
                };
                map.remove(&k);
            }
        }
        map.insert(session.handle.clone(), expires);
    }

    /// Whether `session` was ended here.
    pub fn contains(&self, session: &Session) -> bool {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&session.handle)
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
    fn sealed_sessions_open_until_they_expire_and_name_their_subject_by_digest() {
        use base64::Engine;
        let keys = SessionKeys::parse(&base64::engine::general_purpose::STANDARD.encode([9u8; 32])).unwrap();
        let s = seal(&keys, "2025-06-18", Some("sdk".into()), None, "ops", 2, TTL);
        let back = open(&keys, &s.id, TTL).expect("opens");
        assert_eq!(
            (back.version, back.rank, back.client_name.as_deref()),
            ("2025-06-18", 2, Some("sdk"))
        );
        assert_eq!(back.handle, s.handle);
        assert_eq!(s.handle.len(), 32);
        // Identities whose digest is computed on demand (a JWT's subject) and known ahead (an
        // API key's, `anonymous`'s) check the same.
        let who = |subject: &str, ahead: bool| Identity {
            subject: subject.into(),
            digest: ahead.then(|| subject_digest(subject).into()),
            ..Identity::anonymous(&[])
        };
        for ahead in [false, true] {
            assert!(back.belongs_to(&who("ops", ahead)), "ahead: {ahead}");
            assert!(!back.belongs_to(&who("other", ahead)) && !back.belongs_to(&who("anonymous", ahead)));
        }
        assert!(!back.belongs_to(&Identity::anonymous(&[])));
        let anon = open(
            &keys,
            &seal(&keys, "2025-06-18", None, None, "anonymous", 0, TTL).id,
            TTL,
        )
        .unwrap();
        assert!(anon.belongs_to(&Identity::anonymous(&[])) && !anon.belongs_to(&who("ops", true)));
        let here = Sessions::default().create("2025-06-18", None, None, "anonymous", 0, TTL, 10);
        assert!(here.belongs_to(&Identity::anonymous(&[])) && !here.belongs_to(&who("ops", false)));
        let expired = seal(&keys, "2025-06-18", None, None, "ops", 0, Duration::ZERO);
        assert!(open(&keys, &expired.id, TTL).is_none(), "an expired id does not open");
        assert!(
            open(&keys, &s.id, Duration::ZERO).is_none(),
            "a lowered TTL applies to open sessions"
        );
    }

    #[test]
    fn revocations_are_bounded_and_keep_the_latest() {
        use base64::Engine;
        let keys = SessionKeys::parse(&base64::engine::general_purpose::STANDARD.encode([9u8; 32])).unwrap();
        let r = Revoked::default();
        let first = seal(&keys, "2025-06-18", None, None, "a", 0, Duration::from_secs(10));
        let later = seal(&keys, "2025-06-18", None, None, "a", 0, Duration::from_secs(1000));
        r.insert(&first, 2);
        r.insert(&later, 2);
        assert!(r.contains(&first) && r.contains(&later));
        let third = seal(&keys, "2025-06-18", None, None, "a", 0, Duration::from_secs(500));
        r.insert(&third, 2);
        assert!(!r.contains(&first), "the entry closest to expiry makes room");
        assert!(r.contains(&later) && r.contains(&third));
    }

    #[test]
    fn removed_and_expired_sessions_are_gone() {
        let s = Sessions::default();
        let a = s.create("2025-06-18", None, None, "s", 0, TTL, 10);
        assert!(s.get(&a.id, TTL).is_some());
        assert!(s.remove(&a.id));
        assert!(s.get(&a.id, TTL).is_none());
        let b = s.create("2025-06-18", None, None, "s", 0, TTL, 10);
        std::thread::sleep(Duration::from_millis(5));
        assert!(s.get(&b.id, Duration::from_millis(1)).is_none());
    }

    #[test]
    fn one_subject_cannot_push_out_everyone_else() {
        let s = Sessions::default();
        let other = s.create("2025-06-18", None, None, "victim", 0, TTL, 4);
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(1));
            s.create("2025-06-18", None, None, "flooder", 0, TTL, 4);
        }
        assert!(s.get(&other.id, TTL).is_some(), "the other subject's session survives");
        assert_eq!(s.len(), 3, "the flooder holds at most half the table");
    }

    #[test]
    fn the_table_is_bounded_and_evicts_the_longest_idle() {
        let s = Sessions::default();
        let first = s.create("2025-06-18", None, None, "anonymous", 0, TTL, 3);
        std::thread::sleep(Duration::from_millis(2));
        let second = s.create("2025-06-18", None, None, "anonymous", 0, TTL, 3);
        std::thread::sleep(Duration::from_millis(2));
        s.get(&first.id, TTL);
        s.create("2025-06-18", None, None, "anonymous", 0, TTL, 3);
        s.create("2025-06-18", None, None, "anonymous", 0, TTL, 3);
        assert_eq!(s.len(), 3);
        assert!(s.get(&second.id, TTL).is_none(), "the longest-idle session is evicted");
        assert!(s.get(&first.id, TTL).is_some());
    }
}
