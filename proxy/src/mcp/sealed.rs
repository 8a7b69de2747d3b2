//! Sealed session ids: the session's state, encrypted and authenticated with a key every
//! replica of one server holds, so any replica accepts an id another issued without a lookup.
//!
//! An id is `tg1.` and the base64url (no padding) of `kid (4) ‖ nonce (24) ‖ ciphertext ‖ tag
//! (16)`: XChaCha20-Poly1305 (the `chacha20poly1305` crate) over the JSON claims, with the
//! format tag as associated data. The 192-bit nonce is random per id (never repeated under one
//! key, unlike a 96-bit nonce at scale), and the claims carry another 128 random bits (the
//! session's handle), so an id holds 320 unpredictable bits. `kid` is the first four bytes of
//! the key's SHA-256: it picks the key to try, nothing more.
//!
//! The key file holds one base64 32-byte key per line (`#` comments and blank lines ignored).
//! The first line seals; every line opens. Rotation: add the new key on a second line, wait
//! until every replica has the file, move it to the first line, then drop the old line one
//! session TTL later (ids expire by then).

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What every sealed id starts with.
pub const PREFIX: &str = "tg1.";
const AAD: &[u8] = b"toolgate session v1";
const KID: usize = 4;
const NONCE: usize = 24;
const TAG: usize = 16;
/// Longest id accepted for opening (claims are bounded: client name and version 128 bytes each,
/// no control characters, so even all-quote names seal to about 970 characters).
pub const MAX_ID_CHARS: usize = 1024;

/// What a sealed id carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// 128 random bits, hex: the session's name in audit records, traces and revocations.
    #[serde(rename = "h")]
    pub handle: String,
    /// [`subject_digest`] of the subject that opened the session.
    #[serde(rename = "s")]
    pub subject: String,
    /// Negotiated protocol version.
    #[serde(rename = "p")]
    pub version: String,
    /// `clientInfo.name`.
    #[serde(rename = "n", default, skip_serializing_if = "Option::is_none")]
    pub client_name: Option<String>,
    /// `clientInfo.version`.
    #[serde(rename = "v", default, skip_serializing_if = "Option::is_none")]
    pub client_version: Option<String>,
    /// The caller's role rank at initialize.
    #[serde(rename = "r")]
    pub rank: usize,
    /// Issued at, Unix seconds.
    #[serde(rename = "i")]
    pub issued: u64,
    /// Expires at, Unix seconds.
    #[serde(rename = "e")]
    pub expires: u64,
}

/// The keys of one server.
pub struct SessionKeys {
    keys: Vec<([u8; KID], XChaCha20Poly1305)>,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionKeys").field("keys", &self.keys.len()).finish()
    }
}

/// SHA-256 of a subject, first 16 bytes, hex: what a session (and a shared-store key) names a
/// subject by, so neither holds the subject itself.
pub fn subject_digest(subject: &str) -> String {
    hex(&Sha256::digest(subject.as_bytes())[..16])
}

/// The [`subject_digest`] of `anonymous` (the caller when authentication is off), computed once:
/// an anonymous session is checked on every request.
pub fn anonymous_digest() -> &'static std::sync::Arc<str> {
    static ANONYMOUS: std::sync::LazyLock<std::sync::Arc<str>> =
        std::sync::LazyLock::new(|| subject_digest("anonymous").into());
    &ANONYMOUS
}

pub use crate::trace::to_hex as hex;

/// 16 random bytes, hex.
pub fn random_handle() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS random number generator is available");
    hex(&b)
}

impl SessionKeys {
    /// Parses a key file's text; the error names the line, never its content.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut keys = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bytes = STANDARD
                .decode(line)
                .or_else(|_| URL_SAFE_NO_PAD.decode(line))
                .map_err(|_| format!("line {}: not base64", n + 1))?;
            let key: [u8; 32] = bytes
                .as_slice()
                .try_into()
                .map_err(|_| format!("line {}: a key is 32 bytes, this one {}", n + 1, bytes.len()))?;
            let mut kid = [0u8; KID];
            kid.copy_from_slice(&Sha256::digest(key)[..KID]);
            if keys.iter().any(|(k, _)| *k == kid) {
                return Err(format!("line {}: the same key twice", n + 1));
            }
            keys.push((kid, XChaCha20Poly1305::new(&key.into())));
        }
        if keys.is_empty() {
            return Err("no key: one base64-encoded 32-byte key per line".into());
        }
        Ok(Self { keys })
    }

    /// A new sealed id for `claims`, under the first key.
    pub fn seal(&self, claims: &Claims) -> String {
        let (kid, cipher) = &self.keys[0];
        let mut nonce = [0u8; NONCE];
        getrandom::fill(&mut nonce).expect("the OS random number generator is available");
        let plain = serde_json::to_vec(claims).unwrap_or_default();
        let sealed = cipher
            .encrypt(&XNonce::from(nonce), Payload { msg: &plain, aad: AAD })
            .expect("XChaCha20-Poly1305 seals any message that fits in memory");
        let mut raw = Vec::with_capacity(KID + NONCE + sealed.len());
        raw.extend_from_slice(kid);
        raw.extend_from_slice(&nonce);
        raw.extend_from_slice(&sealed);
        let id = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(raw));
        debug_assert!(id.len() <= MAX_ID_CHARS, "claims are bounded so every id opens");
        id
    }

    /// The claims of `id`, if one of these keys sealed it and nobody altered it (expiry and
    /// subject are the caller's to check).
    pub fn open(&self, id: &str) -> Option<Claims> {
        if id.len() > MAX_ID_CHARS {
            return None;
        }
        let raw = URL_SAFE_NO_PAD.decode(id.strip_prefix(PREFIX)?).ok()?;
        if raw.len() < KID + NONCE + TAG {
            return None;
        }
        let (kid, rest) = raw.split_at(KID);
        let (nonce, sealed) = rest.split_at(NONCE);
        let (_, cipher) = self.keys.iter().find(|(k, _)| k.as_slice() == kid)?;
        let nonce: [u8; NONCE] = nonce.try_into().ok()?;
        let plain = cipher
            .decrypt(&XNonce::from(nonce), Payload { msg: sealed, aad: AAD })
            .ok()?;
        serde_json::from_slice(&plain).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_line(byte: u8) -> String {
        STANDARD.encode([byte; 32])
    }

    fn claims() -> Claims {
        Claims {
            handle: random_handle(),
            subject: subject_digest("ops-key"),
            version: "2025-06-18".into(),
            client_name: Some("whaapy".into()),
            client_version: Some("1.2".into()),
            rank: 1,
            issued: 1_000,
            expires: 4_600,
        }
    }

    #[test]
    fn a_sealed_id_opens_to_its_claims_and_is_visible_ascii() {
        let keys = SessionKeys::parse(&key_line(1)).unwrap();
        let c = claims();
        let id = keys.seal(&c);
        assert!(
            id.starts_with(PREFIX) && id.bytes().all(|b| (0x21..=0x7e).contains(&b)),
            "{id}"
        );
        assert_eq!(keys.open(&id), Some(c.clone()));
        assert_ne!(keys.seal(&c), id, "a fresh nonce per id");
        assert!(
            !id.contains("whaapy") && !id.contains(&c.subject),
            "the claims are encrypted"
        );
    }

    #[test]
    fn tampered_truncated_and_foreign_ids_do_not_open() {
        let keys = SessionKeys::parse(&key_line(1)).unwrap();
        let id = keys.seal(&claims());
        let body = id.strip_prefix(PREFIX).unwrap();
        let mut raw = URL_SAFE_NO_PAD.decode(body).unwrap();
        for i in [0, KID, KID + NONCE, raw.len() - 1] {
            raw[i] ^= 1;
            let forged = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(&raw));
            assert_eq!(keys.open(&forged), None, "a flipped bit at {i} is refused");
            raw[i] ^= 1;
        }
        assert_eq!(keys.open(&id[..id.len() - 4]), None, "truncated");
        assert_eq!(keys.open(&format!("tg2.{body}")), None, "another format");
        assert_eq!(keys.open("tg1.!!!"), None, "not base64");
        assert_eq!(
            keys.open(&format!("{id}{}", "A".repeat(MAX_ID_CHARS))),
            None,
            "too long"
        );
        let other = SessionKeys::parse(&key_line(2)).unwrap();
        assert_eq!(other.open(&id), None, "another server's key");
    }

    #[test]
    fn rotation_opens_ids_of_every_listed_key_and_seals_with_the_first() {
        let old = SessionKeys::parse(&key_line(1)).unwrap();
        let before = old.seal(&claims());
        // Phase 1: the new key is accepted everywhere, the old one still seals.
        let both = SessionKeys::parse(&format!("{}\n{}\n", key_line(1), key_line(2))).unwrap();
        assert!(both.open(&before).is_some());
        // Phase 2: the new key seals; ids of the old one still open until it is dropped.
        let swapped = SessionKeys::parse(&format!("# rotated\n{}\n\n{}\n", key_line(2), key_line(1))).unwrap();
        let after = swapped.seal(&claims());
        assert!(swapped.open(&before).is_some() && both.open(&after).is_some());
        // Phase 3: the old key is gone, and so are its ids.
        let new = SessionKeys::parse(&key_line(2)).unwrap();
        assert!(new.open(&before).is_none() && new.open(&after).is_some());
    }

    #[test]
    fn bad_key_files_are_refused_without_echoing_them() {
        for (text, want) in [
            ("", "no key"),
            ("# only a comment\n", "no key"),
            ("not base64 at all!", "line 1: not base64"),
            (&STANDARD.encode([7u8; 16]), "32 bytes, this one 16"),
            (
                &format!("{}\n{}", key_line(3), key_line(3)),
                "line 2: the same key twice",
            ),
        ] {
            let e = SessionKeys::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(text.is_empty() || !e.contains(text.trim()), "{e}");
        }
    }
}
