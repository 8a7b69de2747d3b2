//! Test harness: the real example service on a loopback port, the proxy on another, and a
//! small MCP-over-HTTP client.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use toolgate_proxy::{start, Running, StartOptions};

pub mod policy;
pub mod services;

/// A loopback port nothing listens on now, for a server that names its port before it binds
/// it; never the same one twice in this process. Two picks in a row otherwise return the same
/// port about once in 7,000 (binds to port 0 with SO_REUSEADDR draw from half the ephemeral
/// range), and the two servers then race for it.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
}

/// `127.0.0.1:port` (0: any) bound without listening: connections to it are refused, as with
/// nothing there, and while the socket is kept no bind to port 0 is given this port. A server
/// that binds it by number with SO_REUSEADDR (as redis-server does) still can, beside it: that
/// is how a restarted server gets its port back. It reuses the address itself, so a server
/// just killed on that port leaves nothing in the way.
pub fn hold(port: u16) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
    Ok(socket)
}

/// The write tools say `requiredRole: viewer`: the harness serves them to every caller,
/// anonymous ones included (a write tool needs `operator` unless it says so).
pub const TOOLS: &str = r#"
tools:
  - name: get_customer
    description: Returns one customer.
    whenToUse: The id is known.
    inputSchema:
      type: object
      additionalProperties: false
      required: [customerId]
      properties: {customerId: {type: string}}
    outputSchema: {type: object, required: [id], properties: {id: {type: string}}}
    http: {method: GET, path: "/customers/{customerId}"}
    response:
      redact: [/internalNotes]
      statuses:
        "404": {status: needs_more_info, message: Customer not found, message_es: No encontré al cliente, nextQuestion: "¿Me compartes tu número de cliente?"}
  - name: create_ticket
    requiredRole: viewer
    inputSchema:
      type: object
      additionalProperties: false
      required: [customerId, subject]
      properties:
        customerId: {type: string}
        subject: {type: string}
        metadata: {type: object}
        tags: {type: array, items: {type: string}}
    http: {method: POST, path: /tickets}
    response: {evidence: [/ticketId]}
  - name: create_ticket_no_evidence
    requiredRole: viewer
    inputSchema: {type: object, properties: {customerId: {type: string}, subject: {type: string}}}
    http: {method: POST, path: /tickets}
    response: {evidence: [/receiptId]}
  - name: submit_payment
    requiredRole: viewer
    inputSchema: {type: object}
    http: {method: POST, path: /payments}
    safety: external_send
  - name: confirm
    requiredRole: viewer
    inputSchema: {type: object}
    http: {method: POST, path: /confirmations}
  - name: status
    inputSchema: {type: object, required: [code], properties: {code: {type: integer}}}
    http: {method: GET, path: "/status/{code}"}
  - name: slow
    inputSchema: {type: object, properties: {ms: {type: integer}}}
    http: {method: GET, path: /slow, query: {ms: "{ms}"}, timeoutMs: 300}
  - name: text
    inputSchema: {type: object}
    http: {method: GET, path: /text}
  - name: echo
    requiredRole: viewer
    inputSchema:
      type: object
      required: [id]
      properties: {id: {type: string}, q: {type: string}, trace: {type: string}, note: {type: object}}
    http: {method: PATCH, path: "/echo/{id}", query: {q: "{q}"}, headers: {X-Trace: "{trace}"}}
  - name: big
    inputSchema: {type: object, properties: {bytes: {type: integer}}}
    http: {method: GET, path: /big, query: {bytes: "{bytes}"}}
"#;

/// A config document for `upstream` with `extra_server` YAML lines under `server:`; write tools
/// are served and audit is off unless `policy` says otherwise.
pub fn config_text(upstream: SocketAddr, extra_server: &str) -> String {
    config_with_policy(
        upstream,
        extra_server,
        "policy:\n  readOnly: false\n  audit: {enabled: false}\n  rateLimit: {perIp: {requests: 1000000}, perIdentity: {requests: 1000000}}\n",
    )
}

/// A config document with an explicit `policy:` block (YAML, including the `policy:` line).
pub fn config_with_policy(upstream: SocketAddr, extra_server: &str, policy: &str) -> String {
    format!(
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nserver:\n  listen: 127.0.0.1:0\n  adminListen: 127.0.0.1:0\n  shutdownGraceSeconds: 5\n{extra_server}upstream:\n  baseUrl: http://{upstream}\n  timeoutMs: 5000\n{policy}{TOOLS}"
    )
}

/// Writes `text` to `path` and starts the proxy from it, watching the file every 50 ms (the
/// tests that edit the config or a file it names see the change within a few polls).
pub async fn start_watched(path: std::path::PathBuf, text: &str) -> Running {
    try_start_watched(path, text).await.unwrap()
}

/// [`start_watched`], with the start's error (a port taken, say) returned.
pub async fn try_start_watched(path: std::path::PathBuf, text: &str) -> Result<Running, toolgate_proxy::StartError> {
    std::fs::write(&path, text).unwrap();
    let cfg = toolgate_config::parse_yaml(text).unwrap_or_else(|e| panic!("{e}"));
    start(
        cfg,
        StartOptions {
            config_path: Some(path),
            reload_interval: Duration::from_millis(50),
            ..StartOptions::default()
        },
    )
    .await
}

pub struct Harness {
    pub proxy: Running,
    pub upstream: SocketAddr,
    pub http: Client<HttpConnector, Full<Bytes>>,
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with("").await
    }

    pub async fn start_with(extra_server: &str) -> Self {
        let upstream = toolgate_example_service::spawn().await.unwrap();
        let cfg = toolgate_config::parse_yaml(&config_text(upstream, extra_server)).unwrap();
        let proxy = start(cfg, StartOptions::default()).await.unwrap();
        Self {
            proxy,
            upstream,
            http: client(),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.proxy.mcp_addr)
    }

    /// Sends a raw request to the MCP endpoint.
    pub async fn raw(
        &self,
        method: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> (StatusCode, http::HeaderMap, Bytes) {
        send(&self.http, method, &self.url(), headers, body.into()).await
    }

    /// Counts requests the upstream has served (including this one).
    pub async fn upstream_requests(&self) -> u64 {
        upstream_requests(&self.http, self.upstream).await
    }

    /// An initialized session at `version`.
    pub async fn session(&self, version: &str) -> Session {
        Session::open(self.http.clone(), self.url(), version).await
    }
}

/// Counts requests the example service at `upstream` has received (including this one), from
/// its `/stats`: a test waits on it for a call to have reached the upstream.
pub async fn upstream_requests(http: &Client<HttpConnector, Full<Bytes>>, upstream: SocketAddr) -> u64 {
    let (_, _, body) = send(http, "GET", &format!("http://{upstream}/stats"), &[], Bytes::new()).await;
    serde_json::from_slice::<Value>(&body).unwrap()["requests"]
        .as_u64()
        .unwrap()
}

/// Waits until the example service at `upstream` has received a request beyond `served` (what
/// [`upstream_requests`] said before it was sent): that request is then in flight. Each poll is
/// a request to the service too, and is counted as such.
pub async fn wait_upstream_received(http: &Client<HttpConnector, Full<Bytes>>, upstream: SocketAddr, served: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut asked = 1;
    while upstream_requests(http, upstream).await <= served + asked {
        assert!(Instant::now() < deadline, "the request never reached the upstream");
        asked += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn send(
    http: &Client<HttpConnector, Full<Bytes>>,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = http.request(req.body(Full::new(body)).unwrap()).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, body)
}

pub struct Session {
    pub http: Client<HttpConnector, Full<Bytes>>,
    pub url: String,
    pub id: String,
    pub version: String,
    /// Headers sent with every request (credentials).
    pub auth: Vec<(String, String)>,
    next_id: std::sync::atomic::AtomicU64,
}

impl Session {
    pub async fn open(http: Client<HttpConnector, Full<Bytes>>, url: String, version: &str) -> Self {
        Self::open_with(http, url, version, &[]).await
    }

    /// Opens a session sending `auth` headers with every request.
    pub async fn open_with(
        http: Client<HttpConnector, Full<Bytes>>,
        url: String,
        version: &str,
        auth: &[(&str, &str)],
    ) -> Self {
        let auth: Vec<(String, String)> = auth.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "harness", "version": "1"}}});
        let mut hs = base_headers();
        hs.extend(auth.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let (status, headers, body) = send(&http, "POST", &url, &hs, Bytes::from(init.to_string())).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let id = headers["mcp-session-id"].to_str().unwrap().to_string();
        let negotiated = serde_json::from_slice::<Value>(&body).unwrap()["result"]["protocolVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let s = Self {
            http,
            url,
            id,
            version: negotiated,
            auth,
            next_id: 1.into(),
        };
        let (status, _, body) = s
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
        assert!(body.is_empty());
        s
    }

    pub async fn post(&self, msg: &Value) -> (StatusCode, http::HeaderMap, Bytes) {
        let mut h = base_headers();
        h.push(("mcp-session-id", &self.id));
        h.push(("mcp-protocol-version", &self.version));
        h.extend(self.auth.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        send(&self.http, "POST", &self.url, &h, Bytes::from(msg.to_string())).await
    }

    /// Sends a request and returns the whole JSON-RPC response.
    pub async fn request(&self, method: &str, params: Value) -> Value {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (status, _, body) = self
            .post(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["id"], id);
        v
    }

    /// Calls a tool; returns the JSON-RPC response.
    pub async fn call(&self, tool: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": args}))
            .await
    }

    /// Calls a tool that must produce a result; returns (envelope, isError) after checking the
    /// one-text-block rule and that structuredContent equals the text.
    pub async fn envelope(&self, tool: &str, args: Value) -> (Value, bool) {
        let resp = self.call(tool, args).await;
        let result = &resp["result"];
        assert!(result.is_object(), "expected a result: {resp}");
        let content = result["content"].as_array().unwrap();
        assert_eq!(content.len(), 1, "exactly one content block");
        assert_eq!(content[0]["type"], "text");
        let env: Value = serde_json::from_str(content[0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(result["structuredContent"], env);
        for key in [
            "ok",
            "status",
            "data",
            "errors",
            "nextQuestion",
            "toolName",
            "safety",
            "durationMs",
        ] {
            assert!(env.get(key).is_some(), "envelope lacks {key}: {env}");
        }
        assert_eq!(env["toolName"], tool);
        (env, result["isError"].as_bool().unwrap())
    }
}

pub fn base_headers() -> Vec<(&'static str, &'static str)> {
    vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ]
}

/// A 2026-07-28 client: no session; every request carries its `_meta` and the headers that
/// mirror it.
pub struct Modern {
    pub http: Client<HttpConnector, Full<Bytes>>,
    pub url: String,
    /// Headers sent with every request (credentials).
    pub auth: Vec<(String, String)>,
    next_id: std::sync::atomic::AtomicU64,
}

/// The `_meta` a 2026-07-28 client sends.
pub fn modern_meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
           "io.modelcontextprotocol/clientCapabilities": {},
           "io.modelcontextprotocol/clientInfo": {"name": "harness-modern", "version": "2"}})
}

impl Modern {
    pub fn new(http: Client<HttpConnector, Full<Bytes>>, url: String, auth: &[(&str, &str)]) -> Self {
        Self {
            http,
            url,
            auth: auth.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            next_id: 1.into(),
        }
    }

    /// Sends `method` with `params` (plus `_meta`) and the matching headers, with `extra`
    /// headers appended; returns status, headers and the JSON body.
    pub async fn send(
        &self,
        method: &str,
        mut params: Value,
        extra: &[(&str, &str)],
    ) -> (StatusCode, http::HeaderMap, Value) {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if params.get("_meta").is_none() {
            params["_meta"] = modern_meta();
        }
        let name = params.get("name").and_then(Value::as_str).map(str::to_string);
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut h = base_headers();
        h.push(("mcp-protocol-version", "2026-07-28"));
        h.push(("mcp-method", method));
        if let Some(n) = name.as_deref() {
            h.push(("mcp-name", n));
        }
        h.extend(self.auth.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        h.extend_from_slice(extra);
        let (status, headers, body) = send(&self.http, "POST", &self.url, &h, Bytes::from(msg.to_string())).await;
        (status, headers, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// A request that must succeed: its `result`.
    pub async fn result(&self, method: &str, params: Value) -> Value {
        let (status, _, body) = self.send(method, params, &[]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body["result"].is_object(), "{body}");
        body["result"].clone()
    }

    /// Calls a tool; returns (envelope, isError) after checking the one-text-block rule.
    pub async fn envelope(&self, tool: &str, args: Value) -> (Value, bool) {
        let result = self
            .result("tools/call", json!({"name": tool, "arguments": args}))
            .await;
        assert_eq!(result["resultType"], "complete", "{result}");
        let content = result["content"].as_array().unwrap();
        assert_eq!(content.len(), 1, "exactly one content block");
        let env: Value = serde_json::from_str(content[0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(result["structuredContent"], env);
        (env, result["isError"].as_bool().unwrap())
    }
}
