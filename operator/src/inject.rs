//! The proxy container, and the server-side-apply patch that adds it to a Deployment as a
//! native sidecar (an `initContainers` entry with `restartPolicy: Always`).
//!
//! The patch holds only what the operator adds. Applying it with the operator's field
//! manager adds or updates exactly those fields; applying [`removal_patch`] with the same
//! manager removes them and leaves the Deployment as its owner wrote it. Tool changes only
//! change the ConfigMap (hot reload), never this patch, so they cause no rollout.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::crd::McpServer;
use crate::render::{configmap_name, SecretMount, CONFIG_DIR, CONFIG_KEY};

/// Name of the proxy container (sidecar and gateway).
pub const CONTAINER: &str = "toolgate-proxy";
/// Name of the MCP container port.
pub const MCP_PORT_NAME: &str = "toolgate-mcp";
/// Name of the admin container port.
pub const ADMIN_PORT_NAME: &str = "toolgate-admin";
/// Deployment annotation: the McpServer whose sidecar it carries.
pub const SERVER_ANNOTATION: &str = "toolgate.dev/server";
/// Annotation on everything the operator applies: hash of what it applied.
pub const HASH_ANNOTATION: &str = "toolgate.dev/applied-hash";
/// Volume holding the rendered config.
pub const CONFIG_VOLUME: &str = "toolgate-config";
/// An empty volume mounted over the ServiceAccount token directory in the proxy container: the
/// proxy needs no Kubernetes API, so it never sees the token the application's containers get.
pub const NO_TOKEN_VOLUME: &str = "toolgate-no-token";
/// Where the kubelet mounts a pod's ServiceAccount token.
pub const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Every volume name the operator may add to a pod.
pub const VOLUMES: [&str; 8] = [
    CONFIG_VOLUME,
    NO_TOKEN_VOLUME,
    "toolgate-auth-credentials",
    "toolgate-oauth-jwks",
    "toolgate-upstream-credential",
    "toolgate-session-keys",
    "toolgate-store-password",
    "toolgate-store-ca",
];

/// Operator-wide settings that end up in pods.
#[derive(Debug, Clone)]
pub struct ProxyDefaults {
    /// Image used when the McpServer names none.
    pub image: String,
    /// How long each step of a session-key rotation is held, so the kubelet brings every
    /// replica's mounted copy of the Secret up to date first.
    pub session_key_propagation: std::time::Duration,
}

impl Default for ProxyDefaults {
    fn default() -> Self {
        Self {
            image: format!("toolgate/toolgate-proxy:{}", env!("CARGO_PKG_VERSION")),
            session_key_propagation: std::time::Duration::from_secs(120),
        }
    }
}

/// The proxy container. `sidecar` adds `restartPolicy: Always` (a native sidecar).
pub fn proxy_container(server: &McpServer, mounts: &[SecretMount], defaults: &ProxyDefaults, sidecar: bool) -> Value {
    let spec = &server.spec;
    let name = server.metadata.name.as_deref().unwrap_or_default();
    let ns = server.metadata.namespace.as_deref().unwrap_or("default");
    // The runtime's worker threads: the CPU request in whole cores, rounded up (the Downward
    // API rounds up with divisor 1), so the default 50m request runs one worker (a
    // current-thread runtime: no cross-thread wakeups, 15 µs less CPU per call at
    // concurrency 1 on the dev machine) rather than one per CPU of the node. Without a request
    // the value is 0 and the proxy uses the CPUs it may use.
    let mut env = vec![json!({
        "name": "TOOLGATE_WORKER_THREADS",
        "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1"}}
    })];
    let telemetry = spec.telemetry.clone().unwrap_or_default();
    if let Some(level) = &telemetry.log_level {
        env.push(json!({"name": "TOOLGATE_LOG", "value": level}));
    }
    if let Some(endpoint) = &telemetry.otlp_endpoint {
        env.push(json!({"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": endpoint}));
        let service = telemetry.service_name.clone().unwrap_or_else(|| format!("{name}.{ns}"));
        env.push(json!({"name": "OTEL_SERVICE_NAME", "value": service}));
    }
    let mut volume_mounts = vec![
        json!({"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": true}),
        json!({"name": NO_TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": true}),
    ];
    for m in mounts {
        volume_mounts.push(json!({"name": volume_name(m), "mountPath": m.dir(), "readOnly": true}));
    }
    let resources = match &spec.resources {
        Some(r) => serde_json::to_value(r).unwrap_or_default(),
        None => json!({"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}),
    };
    let probe = |path: &str, period: i32, failures: i32| json!({"httpGet": {"path": path, "port": ADMIN_PORT_NAME}, "periodSeconds": period, "failureThreshold": failures});
    let mut c = json!({
        "name": CONTAINER,
        "image": spec.image.clone().unwrap_or_else(|| defaults.image.clone()),
        "args": ["--config", format!("{CONFIG_DIR}/{CONFIG_KEY}")],
        "ports": [
            {"name": MCP_PORT_NAME, "containerPort": spec.port, "protocol": "TCP"},
            {"name": ADMIN_PORT_NAME, "containerPort": spec.admin_port, "protocol": "TCP"}
        ],
        "env": env,
        "resources": resources,
        "startupProbe": probe("/healthz", 1, 30),
        "livenessProbe": probe("/healthz", 10, 3),
        "readinessProbe": probe("/readyz", 5, 2),
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "volumeMounts": volume_mounts
    });
    if let Some(policy) = &spec.image_pull_policy {
        c["imagePullPolicy"] = policy.as_str().into();
    }
    if sidecar {
        c["restartPolicy"] = "Always".into();
    }
    c
}

/// The empty directory mounted (read-only) over the proxy's service-account token path. In
/// memory: on disk even an empty directory's 4 KiB block counts against `sizeLimit`, and a
/// real kubelet evicted every pod with the 1 KiB limit this once had.
fn no_token_volume() -> Value {
    json!({"name": NO_TOKEN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "64Ki"}})
}

/// The pod volumes the proxy needs: the ConfigMap and each Secret key.
pub fn proxy_volumes(server: &McpServer, mounts: &[SecretMount]) -> Vec<Value> {
    let mut v = vec![
        json!({"name": CONFIG_VOLUME, "configMap": {"name": configmap_name(server)}}),
        no_token_volume(),
    ];
    for m in mounts {
        v.push(json!({"name": volume_name(m), "secret": {"secretName": m.secret, "items": [{"key": m.key, "path": m.key}]}}));
    }
    v
}

fn volume_name(m: &SecretMount) -> String {
    let name = format!("toolgate-{}", m.volume);
    debug_assert!(VOLUMES.contains(&name.as_str()), "{name} missing from VOLUMES");
    name
}

/// The server-side-apply patch that adds the sidecar to Deployment `deployment`.
pub fn sidecar_patch(server: &McpServer, deployment: &str, mounts: &[SecretMount], defaults: &ProxyDefaults) -> Value {
    let ns = server.metadata.namespace.as_deref().unwrap_or("default");
    let server_name = server.metadata.name.as_deref().unwrap_or_default();
    let mut patch = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": deployment, "namespace": ns, "annotations": {SERVER_ANNOTATION: server_name}},
        "spec": {"template": {"spec": {
            "initContainers": [proxy_container(server, mounts, defaults, true)],
            "volumes": proxy_volumes(server, mounts)
        }}}
    });
    stamp(&mut patch);
    patch
}

/// The patch that, applied with the same field manager, removes everything
/// [`sidecar_patch`] added.
pub fn removal_patch(namespace: &str, deployment: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": deployment, "namespace": namespace}})
}

/// Adds [`HASH_ANNOTATION`]: the SHA-256 of the object as it is before the annotation.
pub fn stamp(object: &mut Value) {
    let hash: String = Sha256::digest(object.to_string().as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let meta = object["metadata"].as_object_mut().expect("metadata");
    let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
    annotations[HASH_ANNOTATION] = hash.into();
}

/// The hash [`stamp`] put on `object`, if any.
pub fn applied_hash(object: &Value) -> Option<&str> {
    object["metadata"]["annotations"][HASH_ANNOTATION].as_str()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::McpTool;
    use crate::render::render;
    use serde_json::json;

    fn server() -> McpServer {
        McpServer::test("shop")
            .with(json!({"auth": {"mode": "bearer", "credentialsSecretRef": {"name": "keys", "key": "creds.yaml"}}}))
    }

    #[test]
    fn the_sidecar_is_a_native_sidecar_with_probes_mounts_and_a_locked_down_context() {
        let s = server();
        let r = render(&s, &[]);
        let p = sidecar_patch(&s, "shop", &r.mounts, &ProxyDefaults::default());
        let c = &p["spec"]["template"]["spec"]["initContainers"][0];
        assert_eq!(c["restartPolicy"], "Always");
        assert_eq!(c["args"], json!(["--config", "/etc/toolgate/config/proxy.json"]));
        assert_eq!(c["ports"][0]["containerPort"], 8931);
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        let volumes = &p["spec"]["template"]["spec"]["volumes"];
        assert_eq!(volumes[0]["configMap"]["name"], "shop-toolgate");
        // The proxy never sees the pod's ServiceAccount token.
        // In memory: on disk an empty directory's block already exceeds a tiny sizeLimit.
        assert_eq!(
            volumes[1],
            json!({"name": NO_TOKEN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "64Ki"}})
        );
        assert_eq!(
            c["volumeMounts"][1],
            json!({"name": NO_TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": true})
        );
        assert_eq!(
            volumes[2]["secret"],
            json!({"secretName": "keys", "items": [{"key": "creds.yaml", "path": "creds.yaml"}]})
        );
        assert_eq!(
            c["volumeMounts"][2]["mountPath"],
            "/etc/toolgate/secrets/auth-credentials"
        );
        assert!(applied_hash(&p).is_some());
    }

    #[test]
    fn tool_changes_do_not_change_the_patch_but_the_image_does() {
        let s = server();
        let d = ProxyDefaults::default();
        let one = render(&s, &[McpTool::test("a")]);
        let two = render(&s, &[McpTool::test("a"), McpTool::test("b")]);
        assert_ne!(one.hash, two.hash);
        assert_eq!(
            sidecar_patch(&s, "shop", &one.mounts, &d),
            sidecar_patch(&s, "shop", &two.mounts, &d)
        );
        let s2 = s.clone().with(json!({"image": "toolgate/toolgate-proxy:next"}));
        assert_ne!(
            applied_hash(&sidecar_patch(&s, "shop", &one.mounts, &d)),
            applied_hash(&sidecar_patch(&s2, "shop", &one.mounts, &d))
        );
    }

    #[test]
    fn telemetry_becomes_environment() {
        let s = McpServer::test("shop")
            .with(json!({"telemetry": {"logLevel": "debug", "otlpEndpoint": "http://otel:4318"}}));
        let c = proxy_container(&s, &[], &ProxyDefaults::default(), false);
        assert_eq!(
            c["env"],
            json!([
                {
                    "name": "TOOLGATE_WORKER_THREADS",
                    "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1"}}
                },
                {"name": "TOOLGATE_LOG", "value": "debug"},
                {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel:4318"},
                {"name": "OTEL_SERVICE_NAME", "value": "shop.demo"}
            ])
        );
        assert!(c.get("restartPolicy").is_none());
    }
}
