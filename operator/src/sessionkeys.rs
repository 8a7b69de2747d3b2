//! The session keys of one McpServer, in the Secret `<server>-session-keys` the operator
//! creates and owns: 32 random bytes per key, base64, one per line, the first sealing new
//! session ids and every line opening them (the proxy's `server.sessionKeyFile`).
//!
//! Rotation (raise `spec.sessions.keyGeneration`) goes through three states, each written to
//! the Secret and held long enough for the kubelet to bring every replica's mounted copy up to
//! date (`--session-key-propagation-seconds`):
//!
//! 1. `staged`: `old, new`. Every replica learns the new key while the old one still seals.
//! 2. `active`: `new, old`. The new key seals; ids sealed with the old one still open.
//! 3. `stable`: `new`, once every id the old key sealed has expired (session TTL + propagation).
//!
//! No replica ever meets an id sealed with a key it does not have. This module decides; the
//! controller reads and writes the Secret.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// Annotation: the key generation the Secret holds (or is rotating to).
pub const GENERATION_ANNOTATION: &str = "toolgate.dev/session-key-generation";
/// Annotation: `stable`, `staged` or `active`.
pub const PHASE_ANNOTATION: &str = "toolgate.dev/session-key-phase";
/// Annotation: Unix seconds when the phase began.
pub const SINCE_ANNOTATION: &str = "toolgate.dev/session-key-since";
/// Annotation: the session TTL (seconds) when the new key began to seal: the old key's ids
/// may live that long, even if the TTL is lowered meanwhile.
pub const TTL_ANNOTATION: &str = "toolgate.dev/session-key-ttl";

/// Where a rotation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// One key.
    Stable,
    /// The new key is second: accepted, not sealing.
    Staged,
    /// The new key is first; the old one is still accepted.
    Active,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Stable => "stable",
            Phase::Staged => "staged",
            Phase::Active => "active",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "stable" => Some(Phase::Stable),
            "staged" => Some(Phase::Staged),
            "active" => Some(Phase::Active),
            _ => None,
        }
    }
}

/// The content and bookkeeping of the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// Base64 keys, the first sealing.
    pub keys: Vec<String>,
    /// Key generation.
    pub generation: i64,
    /// Rotation state.
    pub phase: Phase,
    /// When the phase began (Unix seconds).
    pub since: i64,
    /// Active: the session TTL (seconds) when the phase began.
    pub ttl: i64,
}

/// A new random key, base64.
pub fn new_key() -> String {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("the OS random number generator is available");
    STANDARD.encode(b)
}

impl Keys {
    /// The first key of a new server.
    pub fn fresh(generation: i64, now: i64) -> Self {
        Self {
            keys: vec![new_key()],
            generation,
            phase: Phase::Stable,
            since: now,
            ttl: 0,
        }
    }

    /// Reads the Secret's `keys` text and annotations; `None` if they are not the operator's
    /// format (then the Secret is left alone and reported).
    pub fn read(text: &str, annotations: Option<&BTreeMap<String, String>>) -> Option<Self> {
        let keys: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_string)
            .collect();
        if keys.is_empty() || keys.iter().any(|k| STANDARD.decode(k).map(|b| b.len()) != Ok(32)) {
            return None;
        }
        let a = annotations?;
        Some(Self {
            generation: a.get(GENERATION_ANNOTATION)?.parse().ok()?,
            phase: Phase::parse(a.get(PHASE_ANNOTATION)?)?,
            since: a.get(SINCE_ANNOTATION)?.parse().ok()?,
            ttl: a.get(TTL_ANNOTATION).and_then(|t| t.parse().ok()).unwrap_or(0),
            keys,
        })
    }

    /// The Secret's `keys` text.
    pub fn text(&self) -> String {
        let mut t = self.keys.join("\n");
        t.push('\n');
        t
    }

    /// The Secret's annotations.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([
            (GENERATION_ANNOTATION.to_string(), self.generation.to_string()),
            (PHASE_ANNOTATION.to_string(), self.phase.as_str().to_string()),
            (SINCE_ANNOTATION.to_string(), self.since.to_string()),
        ]);
        if self.phase == Phase::Active {
            a.insert(TTL_ANNOTATION.to_string(), self.ttl.to_string());
        }
        a
    }

    /// The next state, if it is time for one, and when to look again.
    pub fn step(&self, want: i64, now: i64, propagation: Duration, ttl: Duration) -> (Option<Keys>, Option<Duration>) {
        let prop = i64::try_from(propagation.as_secs()).unwrap_or(i64::MAX);
        let ttl_now = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        // Ids the old key sealed live as long as the TTL was when the new key took over.
        let ttl = ttl_now.max(self.ttl);
        let wait = |until: i64| Some(Duration::from_secs(u64::try_from(until - now).unwrap_or(0).max(1)));
        match self.phase {
            // A staged Secret that lost its second key (edited by hand): start the rotation over.
            Phase::Staged if self.keys.len() < 2 => {
                let next = Keys {
                    keys: vec![self.keys[0].clone(), new_key()],
                    since: now,
                    ..self.clone()
                };
                (Some(next), wait(now + prop))
            }
            Phase::Stable if want > self.generation => {
                let next = Keys {
                    keys: vec![self.keys[0].clone(), new_key()],
                    generation: want,
                    phase: Phase::Staged,
                    since: now,
                    ttl: 0,
                };
                (Some(next), wait(now + prop))
            }
            Phase::Stable => (None, None),
            Phase::Staged if now >= self.since.saturating_add(prop) => {
                let next = Keys {
                    keys: vec![self.keys[1].clone(), self.keys[0].clone()],
                    phase: Phase::Active,
                    since: now,
                    ttl: ttl_now,
                    ..self.clone()
                };
                (Some(next), wait(now + ttl_now.saturating_add(prop)))
            }
            Phase::Active if now >= self.since.saturating_add(ttl).saturating_add(prop) => {
                let next = Keys {
                    keys: vec![self.keys[0].clone()],
                    phase: Phase::Stable,
                    since: now,
                    ttl: 0,
                    ..self.clone()
                };
                (Some(next), None)
            }
            Phase::Staged => (None, wait(self.since.saturating_add(prop))),
            Phase::Active => (None, wait(self.since.saturating_add(ttl).saturating_add(prop))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROP: Duration = Duration::from_secs(120);
    const TTL: Duration = Duration::from_secs(3600);

    #[test]
    fn a_rotation_stages_activates_then_drops_the_old_key() {
        let k = Keys::fresh(1, 1000);
        assert_eq!(k.step(1, 5000, PROP, TTL), (None, None), "nothing to do");
        let (staged, again) = k.step(2, 5000, PROP, TTL);
        let staged = staged.unwrap();
        assert_eq!((staged.phase, staged.generation, again), (Phase::Staged, 2, Some(PROP)));
        assert_eq!(staged.keys[0], k.keys[0], "the old key still seals");
        assert_ne!(staged.keys[1], k.keys[0]);
        let new = staged.keys[1].clone();
        assert_eq!(
            staged.step(2, 5060, PROP, TTL),
            (None, Some(Duration::from_secs(60))),
            "not propagated yet"
        );
        assert_eq!(
            staged.step(3, 5060, PROP, TTL).0,
            None,
            "a rotation finishes before the next starts"
        );
        let active = staged.step(2, 5120, PROP, TTL).0.unwrap();
        assert_eq!(
            (active.phase, active.keys.clone()),
            (Phase::Active, vec![new.clone(), k.keys[0].clone()])
        );
        assert_eq!(
            active.step(2, 5120 + 3600, PROP, TTL).0,
            None,
            "old ids may still be live"
        );
        let done = active.step(2, 5120 + 3720, PROP, TTL).0.unwrap();
        assert_eq!((done.phase, done.keys), (Phase::Stable, vec![new]));
    }

    #[test]
    fn a_lowered_ttl_does_not_cut_the_old_keys_sessions_short_and_a_broken_stage_restarts() {
        let (staged, _) = Keys::fresh(1, 0).step(2, 0, PROP, TTL);
        let active = staged.unwrap().step(2, 200, PROP, TTL).0.unwrap();
        assert_eq!(active.ttl, 3600);
        let back = Keys::read(&active.text(), Some(&active.annotations())).unwrap();
        assert_eq!(back, active, "the TTL in force is kept in the Secret");
        let short = Duration::from_secs(60);
        assert_eq!(
            back.step(2, 200 + 600, PROP, short).0,
            None,
            "ids sealed under a 3600 s TTL may still be live"
        );
        assert!(back.step(2, 200 + 3720, PROP, short).0.is_some());
        let mut broken = Keys::fresh(1, 0);
        broken.phase = Phase::Staged;
        let (again, when) = broken.step(2, 10, PROP, TTL);
        let again = again.unwrap();
        assert_eq!((again.phase, again.keys.len(), when), (Phase::Staged, 2, Some(PROP)));
        assert_eq!(again.keys[0], broken.keys[0]);
    }

    #[test]
    fn the_secret_round_trips_and_foreign_content_is_not_taken() {
        let k = Keys::fresh(3, 42);
        assert_eq!(Keys::read(&k.text(), Some(&k.annotations())), Some(k.clone()));
        assert_eq!(Keys::read("not-a-key\n", Some(&k.annotations())), None);
        assert_eq!(Keys::read(&k.text(), None), None, "no bookkeeping: not ours");
        assert_eq!(Keys::read("", Some(&k.annotations())), None);
    }
}
