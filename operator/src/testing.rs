//! Builders for tests: `McpServer::test("shop")`, `McpTool::test("get_customer")`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{json, Value};
use toolgate_config::Method;

use crate::crd::*;

impl McpServer {
    /// A Sidecar server named `name` in namespace `demo`, injecting into Deployment `name`,
    /// upstream port 8080, serving without authentication (said explicitly).
    pub fn test(name: &str) -> Self {
        let spec: McpServerSpec = serde_json::from_value(json!({
            "workloadRef": {"name": name},
            "upstream": {"port": 8080},
            "auth": {"mode": "none"}
        }))
        .expect("valid spec");
        let mut s = McpServer::new(name, spec);
        s.metadata.namespace = Some("demo".into());
        s.metadata.generation = Some(1);
        s.metadata.uid = Some(format!("uid-{name}"));
        s
    }

    /// Serve write tools too.
    pub fn writable(mut self) -> Self {
        self.spec.read_only = false;
        self
    }

    /// Merge `patch` (JSON) into the spec.
    pub fn with(mut self, patch: Value) -> Self {
        self.spec = patched(&self.spec, patch);
        self
    }
}

impl McpTool {
    /// A GET tool `name` of server `shop`: `GET /customers/{id}` with a required string `id`.
    pub fn test(name: &str) -> Self {
        let spec: McpToolSpec = serde_json::from_value(json!({
            "serverRef": {"name": "shop"},
            "name": name,
            "description": format!("{name} test tool"),
            "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
            "http": {"method": "GET", "path": "/customers/{id}"}
        }))
        .expect("valid spec");
        let object = name.replace('_', "-");
        let mut t = McpTool::new(&object, spec);
        t.metadata.namespace = Some("demo".into());
        t.metadata.generation = Some(1);
        t
    }

    /// Another object name (the MCP name stays).
    pub fn object(mut self, name: &str) -> Self {
        self.metadata.name = Some(name.into());
        self
    }

    /// Created `secs` after the epoch (older tools keep contested names).
    pub fn created(mut self, secs: i64) -> Self {
        self.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("time")));
        self
    }

    /// Use this HTTP method.
    pub fn method(mut self, method: Method) -> Self {
        self.spec.http.method = method;
        self
    }

    /// Replace the input schema.
    pub fn with_schema(mut self, schema: Value) -> Self {
        self.spec.input_schema = schema;
        self
    }

    /// Merge `patch` (JSON) into the spec.
    pub fn with(mut self, patch: Value) -> Self {
        self.spec = patched(&self.spec, patch);
        self
    }
}

/// `spec` with `patch` merged in (JSON merge patch), still a valid spec.
fn patched<T: serde::Serialize + serde::de::DeserializeOwned>(spec: &T, patch: Value) -> T {
    let mut v = serde_json::to_value(spec).expect("spec");
    merge(&mut v, patch);
    serde_json::from_value(v).expect("valid spec")
}

/// JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(&k);
                } else {
                    merge(t.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other,
    }
}
