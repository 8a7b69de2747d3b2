//! Static credentials (API keys, bearer tokens, custom header sets) from a file that comes from
//! a mounted Secret. Held only as SHA-256 digests; presented secrets are hashed and compared
//! in constant time.
//!
//! ```yaml
//! credentials:
//!   - id: whaapy-prod            # the subject in audit records and limits
//!     sha256: 9f86d08...         # hex digest of the key (preferred), or `key: <plain text>`
//!     role: operator             # one of policy.roles (default: the lowest)
//!     tools: ["get_*", "search_*"]   # optional allowlist (globs)
//!     expiresAt: 2027-01-01T00:00:00Z  # optional
//!   - id: partner
//!     headers: {X-Tenant: acme, X-Signature: s3cr3t}   # customHeaders mode
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// One credential, without its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// Stable id: the authenticated subject.
    pub id: String,
    /// Role name.
    pub role: String,
    /// Role rank in `policy.roles`.
    pub rank: usize,
    /// Tool allowlist (globs).
    pub tools: Option<Arc<Vec<String>>>,
    /// Expiry (Unix seconds).
    pub expires_at: Option<i64>,
    /// [`crate::mcp::sealed::subject_digest`] of `id`, computed once here rather than on every
    /// request that checks a session.
    pub subject_digest: Arc<str>,
}

/// All credentials, by digest of their secret.
#[derive(Debug, Default)]
pub struct Credentials {
    by_digest: HashMap<[u8; 32], Arc<Credential>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    credentials: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Entry {
    id: String,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    headers: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    expires_at: Option<String>,
}

/// SHA-256 of `bytes`.
pub fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The digest of a custom-header set, in the configured header order.
pub fn header_set_digest<'a>(values: impl Iterator<Item = (&'a str, &'a str)>) -> [u8; 32] {
    let mut h = Sha256::new();
    for (name, value) in values {
        h.update(name.to_ascii_lowercase().as_bytes());
        h.update([0]);
        h.update(value.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

/// Equality that takes the same time wherever the inputs differ.
pub fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn parse_hex(s: &str) -> Option<[u8; 32]> {
    crate::trace::from_hex::<32>(s.trim())
}

impl Credentials {
    /// Parses a credentials document (YAML or JSON). `custom_headers` names the headers a
    /// customHeaders credential must carry, in order; `roles` is `policy.roles`.
    pub fn parse(text: &str, roles: &[String], custom_headers: &[String]) -> Result<Self, Vec<String>> {
        let value = toolgate_config::parse_yaml_value(text).map_err(|e| vec![e.to_string()])?;
        let doc: FileDoc = serde_path_to_error_free(value)?;
        let mut errs = Vec::new();
        let mut by_digest = HashMap::new();
        let mut ids = std::collections::HashSet::new();
        for (i, e) in doc.credentials.into_iter().enumerate() {
            let at = format!("credentials[{i}] ({})", e.id);
            if e.id.trim().is_empty() || !ids.insert(e.id.clone()) {
                errs.push(format!("{at}.id: ids must be unique and non-empty"));
            }
            let role = e
                .role
                .clone()
                .unwrap_or_else(|| roles.first().cloned().unwrap_or_default());
            let Some(rank) = roles.iter().position(|r| *r == role) else {
                errs.push(format!(
                    "{at}.role: `{role}` is not one of policy.roles ({})",
                    roles.join(", ")
                ));
                continue;
            };
            let expires_at = match &e.expires_at {
                None => None,
                Some(t) => match super::time::parse_rfc3339(t) {
                    Some(t) => Some(t),
                    None => {
                        errs.push(format!(
                            "{at}.expiresAt: `{t}` is not an RFC 3339 time (2027-01-31T00:00:00Z)"
                        ));
                        continue;
                    }
                },
            };
            let secret = match (&e.key, &e.sha256, &e.headers) {
                (Some(k), None, None) if !k.is_empty() => digest(k.as_bytes()),
                (None, Some(h), None) => match parse_hex(h) {
                    Some(d) => d,
                    None => {
                        errs.push(format!("{at}.sha256: must be 64 hex digits"));
                        continue;
                    }
                },
                (None, None, Some(hs)) => {
                    let lower: HashMap<String, &String> = hs.iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect();
                    let missing: Vec<&String> = custom_headers
                        .iter()
                        .filter(|h| !lower.contains_key(&h.to_ascii_lowercase()))
                        .collect();
                    if custom_headers.is_empty() || !missing.is_empty() || lower.len() != custom_headers.len() {
                        errs.push(format!(
                            "{at}.headers: must give exactly the headers of policy.auth.customHeaders ({})",
                            custom_headers.join(", ")
                        ));
                        continue;
                    }
                    header_set_digest(
                        custom_headers
                            .iter()
                            .map(|h| (h.as_str(), lower[&h.to_ascii_lowercase()].as_str())),
                    )
                }
                _ => {
                    errs.push(format!("{at}: give exactly one of key, sha256 or headers"));
                    continue;
                }
            };
            let cred = Credential {
                subject_digest: crate::mcp::sealed::subject_digest(&e.id).into(),
                id: e.id,
                role,
                rank,
                tools: e.tools.map(Arc::new),
                expires_at,
            };
            if by_digest.insert(secret, Arc::new(cred)).is_some() {
                errs.push(format!("{at}: the same secret is used by two credentials"));
            }
        }
        if errs.is_empty() {
            Ok(Self { by_digest })
        } else {
            Err(errs)
        }
    }

    /// The credential whose secret hashes to `d`.
    pub fn find(&self, d: &[u8; 32]) -> Option<&Arc<Credential>> {
        let (stored, cred) = self.by_digest.get_key_value(d)?;
        ct_eq(stored, d).then_some(cred)
    }

    /// Number of credentials.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// No credentials.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

/// Deserializes the document, reporting where a problem is but never the offending value (it
/// may be a key).
fn serde_path_to_error_free(value: serde_json::Value) -> Result<FileDoc, Vec<String>> {
    serde_path_to_error::deserialize::<_, FileDoc>(value).map_err(|e| {
        let inner = e.inner().to_string();
        let what = if inner.starts_with("unknown field") || inner.starts_with("missing field") {
            inner.split(", expected").next().unwrap_or("").to_string()
        } else {
            "has the wrong type or shape".to_string()
        };
        vec![format!("credentials file: `{}` {what}", e.path())]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles() -> Vec<String> {
        toolgate_config::default_roles()
    }

    #[test]
    fn keys_are_found_by_digest_and_carry_role_tools_and_expiry() {
        let hex: String = digest(b"k2").iter().map(|b| format!("{b:02x}")).collect();
        let c = Credentials::parse(
            &format!("credentials:\n  - {{id: a, key: k1, role: operator, tools: ['get_*'], expiresAt: '2030-01-01T00:00:00Z'}}\n  - {{id: b, sha256: {hex}}}\n"),
            &roles(),
            &[],
        )
        .unwrap();
        let a = c.find(&digest(b"k1")).unwrap();
        assert_eq!((a.id.as_str(), a.rank, a.expires_at), ("a", 1, Some(1_893_456_000)));
        assert_eq!(a.tools.as_deref().unwrap(), &vec!["get_*".to_string()]);
        assert_eq!(c.find(&digest(b"k2")).unwrap().role, "viewer");
        assert!(c.find(&digest(b"k3")).is_none());
    }

    #[test]
    fn bad_entries_are_all_reported() {
        let e = Credentials::parse(
            "credentials:\n  - {id: a, key: k, role: root}\n  - {id: b}\n  - {id: c, sha256: zz}\n  - {id: d, key: x, expiresAt: soon}\n",
            &roles(),
            &[],
        )
        .unwrap_err();
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(e[0].contains("`root` is not one of policy.roles"));
        // A digest with a sign in it is not hex (it once read as another digest).
        let plus = format!("credentials:\n  - {{id: p, sha256: '+{}'}}\n", "a".repeat(63));
        assert!(Credentials::parse(&plus, &roles(), &[]).is_err());
    }

    #[test]
    fn errors_never_echo_a_secret() {
        let e = Credentials::parse("credentials:\n  - {id: a, key: 123456789}\n", &roles(), &[]).unwrap_err();
        assert!(!e[0].contains("123456789"), "{e:?}");
        assert!(e[0].contains("credentials[0].key"), "{e:?}");
    }

    #[test]
    fn header_sets_need_exactly_the_configured_headers() {
        let hs = vec!["X-Tenant".to_string(), "X-Signature".to_string()];
        let c = Credentials::parse(
            "credentials:\n  - {id: p, headers: {x-tenant: acme, X-Signature: s}}\n",
            &roles(),
            &hs,
        )
        .unwrap();
        let d = header_set_digest([("X-Tenant", "acme"), ("X-Signature", "s")].into_iter());
        assert_eq!(c.find(&d).unwrap().id, "p");
        assert!(Credentials::parse("credentials:\n  - {id: p, headers: {x-tenant: acme}}\n", &roles(), &hs).is_err());
    }
}
