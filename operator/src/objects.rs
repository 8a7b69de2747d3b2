//! The objects the operator owns, as server-side-apply documents: the ConfigMap with the
//! rendered ProxyConfig, the `<server>-mcp` Service and, in Gateway mode, the gateway
//! Deployment. Pure functions; each document is stamped with the hash of its content so
//! an unchanged object is never written again.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::crd::McpServer;
use crate::inject::{proxy_container, proxy_volumes, stamp, ProxyDefaults, MCP_PORT_NAME};
use crate::render::{configmap_name, service_name, Rendered, CONFIG_KEY};

/// Label on every object the operator creates (the owned-object watches select on it).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "toolgate-operator");
/// ConfigMap annotation: SHA-256 of the rendered config.
pub const CONFIG_HASH_ANNOTATION: &str = "toolgate.dev/config-hash";

fn labels(server: &McpServer, component: &str) -> Value {
    json!({
        MANAGED_BY.0: MANAGED_BY.1,
        "app.kubernetes.io/name": "toolgate",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/instance": server.metadata.name.as_deref().unwrap_or_default(),
    })
}

/// Metadata of an object the operator owns for `server`: labels and the controller owner
/// reference.
pub fn owned_meta(server: &McpServer, name: &str, component: &str) -> Value {
    meta(server, name, component)
}

fn meta(server: &McpServer, name: &str, component: &str) -> Value {
    let owner = json!({
        "apiVersion": "toolgate.dev/v1alpha1",
        "kind": "McpServer",
        "name": server.metadata.name.as_deref().unwrap_or_default(),
        "uid": server.metadata.uid.as_deref().unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    });
    json!({
        "name": name,
        "namespace": server.metadata.namespace.as_deref().unwrap_or("default"),
        "labels": labels(server, component),
        "ownerReferences": [owner],
    })
}

/// ConfigMap `<server>-toolgate` holding `proxy.json`.
pub fn configmap(server: &McpServer, rendered: &Rendered) -> Value {
    let mut m = meta(server, &configmap_name(server), "config");
    m["annotations"] = json!({CONFIG_HASH_ANNOTATION: rendered.hash});
    let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": m, "data": {CONFIG_KEY: rendered.text}});
    stamp(&mut cm);
    cm
}

/// Service `<server>-mcp` selecting `selector`, port `spec.port` named `mcp`, targeting the
/// proxy's named container port (never a number an author picks: with no proxy in the pods,
/// the Service has no endpoint instead of exposing an application port).
pub fn service(server: &McpServer, selector: &BTreeMap<String, String>) -> Value {
    let mut svc = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(server, &service_name(server), "endpoint"),
        "spec": {
            "selector": selector,
            "ports": [{"name": "mcp", "port": server.spec.port, "targetPort": MCP_PORT_NAME, "protocol": "TCP", "appProtocol": "http"}]
        }
    });
    stamp(&mut svc);
    svc
}

/// Name of the gateway Deployment.
pub fn gateway_name(server: &McpServer) -> String {
    format!("{}-gateway", server.metadata.name.as_deref().unwrap_or_default())
}

/// Pod labels of the gateway (also the Service selector in Gateway mode).
pub fn gateway_selector(server: &McpServer) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "toolgate-gateway".to_string()),
        (
            "app.kubernetes.io/instance".to_string(),
            server.metadata.name.clone().unwrap_or_default(),
        ),
    ])
}

/// The gateway Deployment: the proxy alone, in front of `upstream.service`.
/// The gateway pod's termination grace: the proxy's whole shutdown (the delay, then one grace
/// for connections and the calls that outlive them, then up to 5 s flushing audit records and
/// 2 s exporting spans) and a margin, so the kubelet never kills a draining proxy.
pub fn termination_grace_seconds(server: &toolgate_config::ServerConfig) -> u64 {
    server.shutdown_delay_seconds + server.shutdown_grace_seconds + 15
}

pub fn gateway(server: &McpServer, rendered: &Rendered, defaults: &ProxyDefaults) -> Value {
    let selector = gateway_selector(server);
    let mut pod_labels = labels(server, "gateway");
    for (k, v) in &selector {
        pod_labels[k] = v.as_str().into();
    }
    let mut container = proxy_container(server, &rendered.mounts, defaults, false);
    container["ports"][0]["name"] = MCP_PORT_NAME.into();
    let mut d = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(server, &gateway_name(server), "gateway"),
        "spec": {
            "replicas": server.spec.replicas.unwrap_or(2),
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": termination_grace_seconds(&rendered.config.server),
                    "containers": [container],
                    "volumes": proxy_volumes(server, &rendered.mounts)
                }
            }
        }
    });
    d["metadata"]["labels"]["app.kubernetes.io/name"] = "toolgate-gateway".into();
    stamp(&mut d);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::applied_hash;
    use crate::render::render;
    use serde_json::json;

    #[test]
    fn owned_objects_point_back_to_their_server() {
        let s = McpServer::test("shop");
        let r = render(&s, &[]);
        let cm = configmap(&s, &r);
        assert_eq!(cm["metadata"]["name"], "shop-toolgate");
        assert_eq!(cm["metadata"]["ownerReferences"][0]["uid"], "uid-shop");
        assert_eq!(cm["metadata"]["annotations"][CONFIG_HASH_ANNOTATION], r.hash.as_str());
        assert_eq!(cm["data"]["proxy.json"], r.text.as_str());
        let svc = service(&s, &BTreeMap::from([("app".to_string(), "shop".to_string())]));
        assert_eq!(svc["metadata"]["name"], "shop-mcp");
        assert_eq!(svc["spec"]["selector"], json!({"app": "shop"}));
        assert_eq!(svc["spec"]["ports"][0]["port"], 8931);
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], MCP_PORT_NAME);
    }

    #[test]
    fn the_gateway_runs_the_proxy_as_its_only_container() {
        let s = McpServer::test("shop").with(json!({"mode": "Gateway", "workloadRef": null, "upstream": {"port": null, "service": {"name": "api", "port": 80}}}));
        let r = render(&s, &[]);
        let d = gateway(&s, &r, &ProxyDefaults::default());
        assert_eq!(d["metadata"]["name"], "shop-gateway");
        assert_eq!(d["spec"]["replicas"], 2);
        let pod = &d["spec"]["template"];
        assert_eq!(pod["spec"]["containers"][0]["name"], "toolgate-proxy");
        assert!(pod["spec"]["containers"][0].get("restartPolicy").is_none());
        for (k, v) in gateway_selector(&s) {
            assert_eq!(pod["metadata"]["labels"][&k], v.as_str());
        }
        assert!(applied_hash(&d).is_some());
    }
}
