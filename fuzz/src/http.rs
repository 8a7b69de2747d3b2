//! The whole MCP endpoint as a target: a real proxy (the quickstart's config, sealed sessions,
//! trusted proxies, audit to a file) in front of the real example service, both on loopback in
//! this process, and each input sent as one HTTP request on its own connection.
//!
//! Input: an optional header block, then the body. When the input starts with `@` or a header
//! name followed by `:`, every line up to the first empty one is a header (`@METHOD PATH` sets
//! the request line); the rest is the body. `$SESSION` anywhere is replaced by a fresh sealed
//! session id for the version the input names, so the fuzzer reaches past the session check.
//!
//! Properties: the proxy answers every request within [`ANSWER_WITHIN`] (the tools' timeout is
//! 1 s), never with a 500, and a JSON answer is a well-formed JSON-RPC response (one object per
//! request; `resultType` on every 2026-07-28 result).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::targets::{sealed_session, session_key_text};

/// Longest a request may wait for its answer.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(4);

/// The quickstart config, served on an ephemeral port in front of `upstream`.
pub fn config_text(upstream: SocketAddr, dir: &std::path::Path) -> String {
    let quickstart = include_str!("../../example/proxy.yaml");
    let keys = dir.join("session-keys");
    std::fs::write(&keys, session_key_text()).expect("write the session key file");
    quickstart
        .replace("listen: 127.0.0.1:8931", "listen: 127.0.0.1:0")
        .replace(
            "adminListen: 127.0.0.1:9464",
            &format!("adminListen: 127.0.0.1:0\n  sessionKeyFile: {}", keys.display()),
        )
        .replace(
            "baseUrl: http://127.0.0.1:8080\n  timeoutMs: 10000",
            &format!("baseUrl: http://{upstream}\n  timeoutMs: 1000"),
        )
        .replace(
            "audit: {sink: stdout}",
            // A file sink, but one that does not grow through a long run.
            "audit: {sink: file, path: /dev/null}",
        )
        .replace(
            "perIp: {requests: 1200, windowSeconds: 60}",
            "perIp: {requests: 1000000000, windowSeconds: 60}\n    trustedProxies: [127.0.0.1/32, \"::1\"]",
        )
        .replace(
            "perIdentity: {requests: 600, windowSeconds: 60}",
            "perIdentity: {requests: 1000000000, windowSeconds: 60}",
        )
}

/// The proxy's MCP address; starts the service and the proxy on first use.
fn proxy() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime");
            rt.block_on(async move {
                let upstream = toolgate_example_service::spawn()
                    .await
                    .expect("the example service starts");
                let dir = std::env::temp_dir().join(format!("toolgate-fuzz-{}", std::process::id()));
                std::fs::create_dir_all(&dir).expect("a scratch directory");
                let cfg = toolgate_config::parse_yaml(&config_text(upstream, &dir)).expect("the fuzz config parses");
                let running = toolgate_proxy::start(cfg, toolgate_proxy::StartOptions::default())
                    .await
                    .expect("the proxy starts");
                tx.send(running.mcp_addr).expect("the fuzz thread waits");
                std::future::pending::<()>().await;
            });
        });
        rx.recv().expect("the proxy started")
    })
}

/// One request as the input describes it.
pub struct Request {
    /// `POST` unless `@METHOD` says otherwise.
    pub method: String,
    /// `/mcp` unless `@METHOD PATH` says otherwise.
    pub path: String,
    /// Header lines, CR and LF removed.
    pub headers: Vec<(String, String)>,
    /// The body, `$SESSION` replaced.
    pub body: Vec<u8>,
}

fn starts_with_header(data: &[u8]) -> bool {
    if data.first() == Some(&b'@') {
        return true;
    }
    let line = data.split(|b| *b == b'\n').next().unwrap_or(&[]);
    match line.iter().position(|b| *b == b':') {
        Some(i) if i > 0 => line[..i].iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-'),
        _ => false,
    }
}

impl Request {
    /// Reads an input.
    pub fn parse(data: &[u8]) -> Self {
        let mut req = Request {
            method: "POST".into(),
            path: "/mcp".into(),
            headers: Vec::new(),
            body: data.to_vec(),
        };
        if starts_with_header(data) {
            let text = String::from_utf8_lossy(data);
            let (head, body) = text.split_once("\n\n").map_or((text.as_ref(), ""), |(h, b)| (h, b));
            for line in head.lines() {
                let line = line.replace('\r', "");
                if let Some(rl) = line.strip_prefix('@') {
                    let mut parts = rl.splitn(2, ' ');
                    let m = parts.next().unwrap_or("POST");
                    if !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()) {
                        req.method = m.into();
                    }
                    if let Some(p) = parts.next().filter(|p| p.starts_with('/') && !p.contains(' ')) {
                        req.path = p.into();
                    }
                } else if let Some((k, v)) = line.split_once(':') {
                    let k = k.trim();
                    if !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                        req.headers.push((k.into(), v.trim().into()));
                    }
                }
            }
            req.body = body.as_bytes().to_vec();
        }
        let version = req
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("mcp-protocol-version"))
            .map(|(_, v)| v.clone())
            // The proxy seals only the version it negotiated; a mutated header is not one.
            .filter(|v| v.len() <= 16)
            .unwrap_or_else(|| "2025-06-18".to_string());
        let needs_session = |b: &[u8]| b.windows(8).any(|w| w == b"$SESSION");
        for (_, v) in &mut req.headers {
            if v.contains("$SESSION") {
                *v = v.replace("$SESSION", &sealed_session(&version));
            }
        }
        if needs_session(&req.body) {
            let text = String::from_utf8_lossy(&req.body).replace("$SESSION", &sealed_session(&version));
            req.body = text.into_bytes();
        }
        req
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The bytes on the wire: the client's headers (without framing ones), then ours.
    pub fn wire(&self, addr: SocketAddr) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\nhost: {addr}\r\n", self.method, self.path).into_bytes();
        let framing = [
            "host",
            "content-length",
            "transfer-encoding",
            "connection",
            "expect",
            "upgrade",
        ];
        for (k, v) in &self.headers {
            if framing.iter().any(|f| k.eq_ignore_ascii_case(f)) {
                continue;
            }
            out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        if self.header("content-type").is_none() {
            out.extend_from_slice(b"content-type: application/json\r\n");
        }
        if self.header("accept").is_none() {
            out.extend_from_slice(b"accept: application/json, text/event-stream\r\n");
        }
        out.extend_from_slice(format!("content-length: {}\r\n\r\n", self.body.len()).as_bytes());
        out.extend_from_slice(&self.body);
        out
    }
}

/// What came back.
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Lowercased header block.
    pub head: String,
    /// The body (de-chunked), or what arrived of a stream.
    pub body: Vec<u8>,
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = std::str::from_utf8(&raw[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok());
        let Some(size) = size.filter(|s| *s > 0) else {
            return out;
        };
        let start = eol + 2;
        let end = (start + size).min(raw.len());
        out.extend_from_slice(&raw[start..end]);
        raw = raw.get(end + 2..).unwrap_or(&[]);
    }
}

fn stream_answered(body: &[u8]) -> bool {
    String::from_utf8_lossy(body).lines().any(|line| {
        let Some(data) = line.strip_prefix("data:") else {
            return false;
        };
        let Ok(v) = serde_json::from_str::<Value>(data.trim()) else {
            return false;
        };
        (v.get("id").is_some() && (v.get("result").is_some() || v.get("error").is_some()))
            || v.get("method") == Some(&Value::from("notifications/subscriptions/acknowledged"))
    })
}

/// Whether `raw` (a response so far) is complete: its head and the body its framing says.
fn complete(raw: &[u8], method: &str) -> bool {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let body = &raw[end + 4..];
    if head.contains("content-type: text/event-stream") && (method == "GET" || stream_answered(&dechunk(body))) {
        // A stream ends the exchange at its answer: the response to the request, or a
        // subscription's acknowledgement (the stream itself stays open by design).
        return true;
    }
    if head.contains("transfer-encoding: chunked") {
        return body.ends_with(b"0\r\n\r\n");
    }
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    match length {
        Some(n) => body.len() >= n,
        // Neither: the body ends when the connection does.
        None => false,
    }
}

/// Sends `req` on a new connection and reads the answer (only the head of an event stream).
/// The connection is then reset rather than closed, so a long run leaves no TIME_WAIT sockets
/// to exhaust loopback's ephemeral ports.
pub fn send(req: &Request) -> Response {
    let addr = proxy();
    let started = Instant::now();
    let mut conn = TcpStream::connect(addr).expect("the proxy accepts connections");
    conn.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("a read timeout");
    // A refused request may be answered before its body is read and the connection closed: a
    // failed write is not the proxy's fault, its answer is what counts.
    let _ = conn.write_all(&req.wire(addr));
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while !complete(&raw, &req.method) {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            // A read timeout, or libFuzzer's timer signal interrupting the read (EINTR): no
            // answer yet, so read again (the deadline below still holds).
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => break,
        }
        assert!(
            started.elapsed() < ANSWER_WITHIN,
            "no complete answer within {ANSWER_WITHIN:?} to {} {}; got {:?}",
            req.method,
            req.path,
            String::from_utf8_lossy(&raw)
        );
    }
    let _ = socket2::SockRef::from(&conn).set_linger(Some(Duration::ZERO));
    drop(conn);
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP response head: {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let rest = &raw[end + 4..];
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Response { status, head, body }
}

fn check_rpc(v: &Value, modern: bool, context: &str) {
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("a JSON-RPC response is an object: {context}"));
    assert_eq!(obj.get("jsonrpc"), Some(&Value::from("2.0")), "{context}");
    match (obj.get("result"), obj.get("error")) {
        (Some(r), None) => {
            if modern {
                assert!(
                    r.get("resultType").is_some(),
                    "a 2026-07-28 result without resultType: {context}"
                );
            }
        }
        (None, Some(e)) => {
            assert!(
                e.get("code").and_then(Value::as_i64).is_some(),
                "an error without a code: {context}"
            );
            assert!(
                e.get("message").and_then(Value::as_str).is_some(),
                "an error without a message: {context}"
            );
        }
        _ => panic!("exactly one of result and error: {context}"),
    }
}

/// The target.
pub fn http_mcp(data: &[u8]) {
    let req = Request::parse(data);
    let resp = send(&req);
    let context = || {
        format!(
            "{} {} {:?} {:?}\n→ {}\n{}",
            req.method,
            req.path,
            req.headers,
            String::from_utf8_lossy(&req.body),
            resp.head,
            String::from_utf8_lossy(&resp.body)
        )
    };
    assert_ne!(resp.status, 500, "{}", context());
    let json = resp.head.contains("content-type: application/json");
    if resp.status == 200 && json {
        let v: Value = serde_json::from_slice(&resp.body).unwrap_or_else(|e| panic!("{e}: {}", context()));
        let modern = req.header("mcp-protocol-version") == Some("2026-07-28");
        check_rpc(&v, modern, &context());
    }
    if resp.status == 200 && resp.head.contains("content-type: text/event-stream") && req.method == "POST" {
        for line in String::from_utf8_lossy(&resp.body).lines() {
            if let Some(data) = line.strip_prefix("data:") {
                let data = data.trim();
                if data.is_empty() {
                    continue;
                }
                let v: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {}", context()));
                if v.get("id").is_some() && v.get("method").is_none() {
                    check_rpc(&v, req.header("mcp-protocol-version") == Some("2026-07-28"), &context());
                }
            }
        }
    }
}
