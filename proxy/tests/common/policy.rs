//! The policy tests' harness (tests/policy.rs, tests/oauth.rs): the proxy on loopback in front
//! of the real example service, with credentials from a file in a temp dir and audit records read
//! back from it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use serde_json::Value;
use toolgate_proxy::{Running, StartError};

use super::{base_headers, send, Session};

pub const TOOLS: &str = r#"
tools:
  - name: get_customer
    inputSchema: {type: object, additionalProperties: false, required: [customerId], properties: {customerId: {type: string}, note: {type: string}}}
    http: {method: GET, path: "/customers/{customerId}"}
  - name: create_ticket
    requiredRole: operator
    inputSchema: {type: object, properties: {customerId: {type: string}, subject: {type: string}, cardNumber: {type: string}}}
    http: {method: POST, path: /tickets}
  - name: echo_read
    inputSchema: {type: object, required: [id], properties: {id: {type: string}}}
    http: {method: GET, path: "/echo/{id}"}
  - name: fail_read
    inputSchema: {type: object}
    http: {method: GET, path: /status/500}
  - name: slow_read
    inputSchema: {type: object}
    http: {method: GET, path: /slow, query: {ms: "600"}}
"#;

pub const CREDENTIALS: &str = "credentials:
  - {id: reader, key: reader-secret-key-1, role: viewer}
  - {id: operator-a, key: operator-secret-key-2, role: operator, tools: ['get_*', 'echo_*']}
  - {id: admin, key: admin-secret-key-3, role: admin}
  - {id: retired, key: expired-secret-key-4, role: admin, expiresAt: '2020-01-01T00:00:00Z'}
";

pub struct Setup {
    pub proxy: Running,
    pub dir: PathBuf,
    pub url: String,
}

pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("toolgate-policy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

async fn try_setup(name: &str, policy: &str, mcp_port: u16) -> Result<Setup, StartError> {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let dir = temp_dir(name);
    std::fs::write(dir.join("credentials.yaml"), CREDENTIALS).unwrap();
    std::fs::write(dir.join("upstream-token"), "upstream-token-5\n").unwrap();
    let policy = policy.replace("{dir}", dir.to_str().unwrap());
    let text = format!(
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nserver: {{listen: '127.0.0.1:{mcp_port}', adminListen: '127.0.0.1:0'}}\nupstream:\n  baseUrl: http://{upstream}\n  credential: {{header: Authorization, file: '{}/upstream-token', prefix: 'Bearer '}}\npolicy:\n{policy}{TOOLS}",
        dir.to_str().unwrap()
    );
    let proxy = super::try_start_watched(dir.join("proxy.yaml"), &text).await?;
    let url = format!("http://{}/mcp", proxy.mcp_addr);
    Ok(Setup { proxy, dir, url })
}

/// Starts the proxy with `policy` (YAML lines under `policy:`; `{dir}` is replaced by a temp
/// dir holding `credentials.yaml`) on any port.
pub async fn setup(name: &str, policy: &str) -> Setup {
    try_setup(name, policy, 0).await.unwrap_or_else(|e| panic!("{e}"))
}

/// Like [`setup`], with every `RESOURCE` in `policy` replaced by the proxy's own MCP URL
/// (returned beside it). That URL names the port before the proxy binds it, so the port is
/// chosen first; when another test's listener takes it in between, another one is chosen.
pub async fn setup_resource(name: &str, policy: &str) -> (Setup, String) {
    for _ in 0..5 {
        let port = super::free_port();
        let resource = format!("http://127.0.0.1:{port}/mcp");
        match try_setup(name, &policy.replace("RESOURCE", &resource), port).await {
            Ok(s) => return (s, resource),
            Err(StartError::Bind { source, .. }) if source.kind() == std::io::ErrorKind::AddrInUse => {}
            Err(e) => panic!("{e}"),
        }
    }
    panic!("no free port for {name} after 5 tries");
}

pub const API_KEYS: &str = "  readOnly: false\n  auth: {mode: apiKey, credentialsFile: '{dir}/credentials.yaml'}\n  audit: {sink: file, path: '{dir}/audit.jsonl', redactArguments: [/cardNumber]}\n";

impl Setup {
    pub async fn session(&self, key: &str) -> Session {
        Session::open_with(super::client(), self.url.clone(), "2025-06-18", &[("x-api-key", key)]).await
    }

    pub async fn raw(&self, headers: &[(&str, &str)], body: &str) -> (StatusCode, http::HeaderMap, Value) {
        let mut hs = base_headers();
        hs.extend_from_slice(headers);
        let (status, h, b) = send(&super::client(), "POST", &self.url, &hs, Bytes::from(body.to_string())).await;
        (status, h, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    /// Waits until `headers` authenticate (a changed credentials file was reloaded). Polls
    /// slowly enough to stay under the per-IP limit.
    pub async fn wait_accepted(&self, headers: &[(&str, &str)]) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.raw(headers, INIT).await.0 != StatusCode::OK {
            assert!(Instant::now() < deadline, "{headers:?} were never accepted");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The audit records written so far, once there are at least `n`.
    pub async fn audit(&self, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(self.dir.join("audit.jsonl")).unwrap_or_default();
            let records: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            if records.len() >= n || Instant::now() > deadline {
                return records;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

pub fn names(list: &Value) -> Vec<String> {
    list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}
