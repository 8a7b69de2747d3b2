//! The policy layers in front of every call: client IP, pre-auth throttle, authentication,
//! per-identity and per-tool limits, and authorization (read-only mode, roles, per-identity
//! tool allowlists).

pub mod auth;
pub mod clientip;
pub mod credentials;
pub mod jwks;
pub mod jwt;
pub mod ratelimit;
pub mod time;

use std::sync::Arc;

use toolgate_config::{PolicyConfig, ToolConfig};

/// Who is calling, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Key id, JWT `sub`, or `anonymous`.
    pub subject: String,
    /// The role's name.
    pub role: String,
    /// Index of the role in `policy.roles` (higher is more privileged).
    pub rank: usize,
    /// Tools this identity may see and call (globs); `None` is every tool.
    pub tools: Option<Arc<Vec<String>>>,
    /// The acting agent, when known (JWT `act`/`azp`/`client_id`, or a trusted header).
    pub agent: Option<String>,
    /// `subject`'s [`Identity::subject_digest`] when known ahead: an API key's is computed when
    /// the keys load and `anonymous`'s once, so a session is checked without hashing.
    pub(crate) digest: Option<Arc<str>>,
}

impl Identity {
    /// The caller when authentication is off: anonymous, with the lowest role (rank 0). No
    /// credentials prove nothing, so tools with a `requiredRole` above the lowest stay hidden
    /// until callers authenticate.
    pub fn anonymous(roles: &[String]) -> Self {
        Self {
            subject: "anonymous".into(),
            role: roles.first().cloned().unwrap_or_default(),
            rank: 0,
            tools: None,
            agent: None,
            digest: Some(crate::mcp::sealed::anonymous_digest().clone()),
        }
    }

    /// What sessions and the shared store name the subject by
    /// ([`crate::mcp::sealed::subject_digest`]).
    pub fn subject_digest(&self) -> std::borrow::Cow<'_, str> {
        match &self.digest {
            Some(d) => {
                debug_assert_eq!(
                    **d,
                    crate::mcp::sealed::subject_digest(&self.subject),
                    "a digest known ahead is the subject's"
                );
                std::borrow::Cow::Borrowed(d)
            }
            None => std::borrow::Cow::Owned(crate::mcp::sealed::subject_digest(&self.subject)),
        }
    }
}

/// Whether `name` matches `pattern` (`*` any run, `?` one character).
pub fn glob(pattern: &str, name: &str) -> bool {
    fn rec(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => rec(&p[1..], n) || (!n.is_empty() && rec(p, &n[1..])),
            (Some(b'?'), Some(_)) => rec(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => rec(&p[1..], &n[1..]),
            _ => false,
        }
    }
    rec(pattern.as_bytes(), name.as_bytes())
}

/// Why a tool is not available to a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// Hidden: read-only mode and a tool it does not serve (a write tool, or a read over a
    /// method other than GET/HEAD, see [`PolicyConfig::serves`]). Answered like an unknown tool.
    ReadOnly,
    /// Hidden: not in the identity's tool allowlist. Answered like an unknown tool.
    NotAllowed,
    /// In scope, but the role is too low. Answered with a clear forbidden error.
    Role,
}

impl Denied {
    /// Stable reason for audit records and metrics.
    pub fn reason(self) -> &'static str {
        match self {
            Denied::ReadOnly => "read_only",
            Denied::NotAllowed => "not_in_allowlist",
            Denied::Role => "role_too_low",
        }
    }

    /// Whether the tool's existence is hidden from the caller.
    pub fn hides(self) -> bool {
        !matches!(self, Denied::Role)
    }
}

/// Decides whether `who` may call (and see) `tool` under `policy`.
pub fn authorize(policy: &PolicyConfig, who: &Identity, tool: &ToolConfig) -> Result<(), Denied> {
    if !policy.serves(tool) {
        return Err(Denied::ReadOnly);
    }
    if let Some(allowed) = &who.tools {
        if !allowed.iter().any(|p| glob(p, &tool.name)) {
            return Err(Denied::NotAllowed);
        }
    }
    if who.rank < policy.required_rank(tool) {
        return Err(Denied::Role);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgate_config::parse_yaml;

    #[test]
    fn globs_match_names() {
        assert!(glob("get_*", "get_customer"));
        assert!(glob("*", "x"));
        assert!(glob("a?c", "abc"));
        assert!(!glob("get_*", "create_ticket"));
        assert!(!glob("a?c", "ac"));
    }

    fn config(policy: &str) -> toolgate_config::ProxyConfig {
        parse_yaml(&format!(
            "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {{baseUrl: 'http://x:1'}}\npolicy: {policy}\ntools:\n  - {{name: a, inputSchema: {{type: object}}, http: {{method: GET, path: /a}}}}\n  - {{name: b, requiredRole: operator, inputSchema: {{type: object}}, http: {{method: POST, path: /b}}}}\n  - {{name: search, tier: read, safety: read_only, inputSchema: {{type: object}}, http: {{method: POST, path: /s}}}}\n  - {{name: c, requiredRole: operator, inputSchema: {{type: object}}, http: {{method: GET, path: /c}}}}\n",
        ))
        .unwrap()
    }

    #[test]
    fn read_only_hides_write_tools_and_roles_are_ordered() {
        let ro = config("{}");
        let rw = config("{readOnly: false}");
        let t = &ro.tools;
        let viewer = Identity {
            subject: "k".into(),
            role: "viewer".into(),
            rank: 0,
            tools: None,
            agent: None,
            digest: None,
        };
        let admin = Identity {
            rank: 2,
            role: "admin".into(),
            ..viewer.clone()
        };
        assert_eq!(authorize(&ro.policy, &admin, &t[1]), Err(Denied::ReadOnly));
        assert_eq!(authorize(&rw.policy, &viewer, &t[1]), Err(Denied::Role));
        assert_eq!(authorize(&rw.policy, &admin, &t[1]), Ok(()));
        assert_eq!(authorize(&ro.policy, &viewer, &t[0]), Ok(()));
        let scoped = Identity {
            tools: Some(Arc::new(vec!["b".into()])),
            ..admin
        };
        assert_eq!(authorize(&rw.policy, &scoped, &t[0]), Err(Denied::NotAllowed));
        assert_eq!(authorize(&rw.policy, &scoped, &t[1]), Ok(()));
    }

    #[test]
    fn read_only_serves_a_read_over_post_only_when_allowed() {
        let viewer = Identity::anonymous(&toolgate_config::default_roles());
        let ro = config("{}");
        assert_eq!(authorize(&ro.policy, &viewer, &ro.tools[2]), Err(Denied::ReadOnly));
        let allowed = config("{allowReadOverPost: true}");
        assert_eq!(authorize(&allowed.policy, &viewer, &allowed.tools[2]), Ok(()));
        assert_eq!(
            authorize(&allowed.policy, &viewer, &allowed.tools[1]),
            Err(Denied::ReadOnly),
            "a write POST stays hidden"
        );
        // A PUT that claims to be a safe read (a config that skipped validation) is not served.
        let mut put = ro.tools[0].clone();
        put.http.method = toolgate_config::Method::Put;
        assert_eq!(authorize(&allowed.policy, &viewer, &put), Err(Denied::ReadOnly));
    }

    #[test]
    fn anonymous_callers_have_the_lowest_role() {
        let roles = toolgate_config::default_roles();
        let anon = Identity::anonymous(&roles);
        assert_eq!(
            (anon.subject.as_str(), anon.role.as_str(), anon.rank),
            ("anonymous", "viewer", 0)
        );
        let rw = config("{readOnly: false}");
        assert_eq!(authorize(&rw.policy, &anon, &rw.tools[0]), Ok(()));
        assert_eq!(authorize(&rw.policy, &anon, &rw.tools[3]), Err(Denied::Role));
        assert_eq!(Identity::anonymous(&[]).rank, 0);
    }

    #[test]
    fn write_tools_need_more_than_the_lowest_role_unless_opened() {
        let rw = config("{readOnly: false}");
        let mut open = rw.tools[1].clone();
        open.required_role = Some("viewer".into());
        let mut unset = rw.tools[1].clone();
        unset.required_role = None;
        let mut read_over_post = rw.tools[2].clone();
        read_over_post.required_role = None;
        let anon = Identity::anonymous(&rw.policy.roles);
        let viewer = Identity {
            subject: "k".into(),
            digest: None,
            ..anon.clone()
        };
        let operator = Identity {
            role: "operator".into(),
            rank: 1,
            ..viewer.clone()
        };
        // A POST without requiredRole is write tier: operator or higher.
        assert_eq!(rw.policy.required_role(&unset), Some("operator"));
        assert_eq!(authorize(&rw.policy, &viewer, &unset), Err(Denied::Role));
        assert_eq!(authorize(&rw.policy, &anon, &unset), Err(Denied::Role));
        assert_eq!(authorize(&rw.policy, &operator, &unset), Ok(()));
        // requiredRole: viewer opens it to every caller, the anonymous one included.
        assert_eq!(authorize(&rw.policy, &anon, &open), Ok(()));
        // A tool declared read tier (a search over POST) stays open.
        assert_eq!(rw.policy.required_role(&read_over_post), None);
        assert_eq!(authorize(&rw.policy, &viewer, &read_over_post), Ok(()));
        // With one role there is nothing above it: every caller has it.
        let mut single = rw.policy.clone();
        single.roles = vec!["member".into()];
        assert_eq!(single.required_role(&unset), None);
        assert_eq!(authorize(&single, &Identity::anonymous(&single.roles), &unset), Ok(()));
    }
}
