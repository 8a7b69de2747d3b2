//! What an McpServer author may make the operator do on their behalf. The operator acts with
//! its own rights, so every target an author names must be one its owner agreed to: a
//! Deployment opts in to a sidecar, a Secret opts in to being mounted, the proxy image comes
//! from an allowlist the operator's administrator set, an upstream stays a Service of the
//! server's namespace, and the operator's own namespace is never a target. Pure functions.

use std::collections::BTreeMap;

/// Deployment annotation, set by whoever may edit the Deployment: the McpServer (by name)
/// allowed to add its proxy as a sidecar.
pub const WORKLOAD_OPT_IN: &str = "toolgate.dev/allow-mcp-server";
/// Secret label, set by whoever may write the Secret: it may be mounted into proxies.
pub const SECRET_USAGE_LABEL: &str = "toolgate.dev/usage";
/// The value of [`SECRET_USAGE_LABEL`] that allows mounting.
pub const SECRET_USAGE_PROXY: &str = "proxy";

/// The administrator's rules, from the operator's flags.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// Image repositories proxy containers may run (`registry/repo`, any tag or digest), or
    /// prefixes ending in `*`. Empty: only the repository of the default proxy image.
    pub allowed_images: Vec<String>,
    /// Mount any Secret of the McpServer's namespace, labelled or not.
    pub trust_namespace_secrets: bool,
    /// The operator's own namespace: no McpServer there is served (its ServiceAccount token
    /// reads Secrets cluster-wide).
    pub protected_namespace: Option<String>,
}

/// The repository of an image reference: without `@digest` and without `:tag` (a `:` after
/// the last `/` is a tag; before it, a registry port).
pub fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match (image.rfind(':'), image.rfind('/')) {
        (Some(colon), Some(slash)) if colon > slash => &image[..colon],
        (Some(colon), None) => &image[..colon],
        _ => image,
    }
}

impl Guard {
    /// Whether `image` may run as a proxy, given the default image `default`.
    pub fn image_allowed(&self, image: &str, default: &str) -> bool {
        if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return false;
        }
        let repo = repository(image);
        if self.allowed_images.is_empty() {
            return repo == repository(default);
        }
        self.allowed_images.iter().any(|a| match a.strip_suffix('*') {
            Some(prefix) => repo.starts_with(prefix),
            None => repo == a.as_str(),
        })
    }

    /// Whether a Secret with `labels` may be mounted into a proxy.
    pub fn secret_allowed(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.trust_namespace_secrets
            || labels
                .and_then(|l| l.get(SECRET_USAGE_LABEL))
                .is_some_and(|v| v == SECRET_USAGE_PROXY)
    }

    /// Whether namespace `ns` is the operator's own.
    pub fn protects(&self, ns: &str) -> bool {
        self.protected_namespace.as_deref() == Some(ns)
    }
}

/// Whether a Deployment with `annotations` agreed to carry McpServer `server`'s sidecar.
pub fn workload_opted_in(annotations: Option<&BTreeMap<String, String>>, server: &str) -> bool {
    annotations
        .and_then(|a| a.get(WORKLOAD_OPT_IN))
        .is_some_and(|v| v.split(',').any(|s| s.trim() == server))
}

/// A DNS-1035 label (what a Service name is): 1-63 of `a-z 0-9 -`, starting with a letter,
/// not ending with `-`.
pub fn is_dns1035_label(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1] != b'-'
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: &str = "ghcr.io/toolgate/toolgate-proxy:0.1.0";

    #[test]
    fn repositories_drop_tags_and_digests_but_keep_registry_ports() {
        assert_eq!(repository("toolgate/toolgate-proxy:0.1.0"), "toolgate/toolgate-proxy");
        assert_eq!(repository("reg:5000/tg/proxy:1@sha256:ab"), "reg:5000/tg/proxy");
        assert_eq!(repository("reg:5000/tg/proxy"), "reg:5000/tg/proxy");
        assert_eq!(repository("proxy@sha256:ab"), "proxy");
        assert_eq!(repository("busybox:1"), "busybox");
    }

    #[test]
    fn only_allowlisted_repositories_run_as_the_proxy() {
        let g = Guard::default();
        assert!(g.image_allowed("ghcr.io/toolgate/toolgate-proxy:next", DEFAULT));
        assert!(g.image_allowed("ghcr.io/toolgate/toolgate-proxy@sha256:0123", DEFAULT));
        for hostile in [
            "busybox:1",
            "ghcr.io/toolgate/toolgate-proxy-evil:1",
            "ghcr.io/toolgate/toolgate-proxy/../evil:1",
            "evil.io/ghcr.io/toolgate/toolgate-proxy:1",
            "ghcr.io/toolgate/toolgate-proxy:1 ",
            "",
        ] {
            assert!(!g.image_allowed(hostile, DEFAULT), "{hostile}");
        }
        let g = Guard {
            allowed_images: vec!["registry.corp/mcp/*".into(), "toolgate/toolgate-proxy".into()],
            ..Guard::default()
        };
        assert!(g.image_allowed("registry.corp/mcp/proxy:2", DEFAULT));
        assert!(g.image_allowed("toolgate/toolgate-proxy:1", DEFAULT));
        assert!(
            !g.image_allowed(DEFAULT, DEFAULT),
            "an explicit list replaces the default"
        );
    }

    #[test]
    fn secrets_and_workloads_must_opt_in() {
        let g = Guard::default();
        let labelled = BTreeMap::from([(SECRET_USAGE_LABEL.to_string(), SECRET_USAGE_PROXY.to_string())]);
        assert!(g.secret_allowed(Some(&labelled)));
        assert!(!g.secret_allowed(None));
        let trusting = Guard {
            trust_namespace_secrets: true,
            ..Guard::default()
        };
        assert!(trusting.secret_allowed(None));
        let a = BTreeMap::from([(WORKLOAD_OPT_IN.to_string(), "billing, shop".to_string())]);
        assert!(workload_opted_in(Some(&a), "shop"));
        assert!(!workload_opted_in(Some(&a), "sho"));
        assert!(!workload_opted_in(None, "shop"));
    }

    #[test]
    fn service_names_are_dns_1035_labels() {
        assert!(is_dns1035_label("api"));
        assert!(is_dns1035_label("shop-api-2"));
        for hostile in [
            "127.0.0.1:38080/",
            "169.254.169.254:80/x",
            "vault.prod.svc.cluster.local:8200/",
            "api.other-ns",
            "Api",
            "-api",
            "api-",
            "1api",
            "",
        ] {
            assert!(!is_dns1035_label(hostile), "{hostile}");
        }
        assert!(!is_dns1035_label(&"a".repeat(64)));
    }
}
