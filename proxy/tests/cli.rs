//! The `toolgate-proxy` binary: `check`, `schema`, start-up errors and SIGTERM draining.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_toolgate-proxy");

fn write_temp(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("toolgate-cli-{}-{name}", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn check_accepts_the_examples() {
    for f in ["example/proxy.yaml", "example/architecture-example.yaml"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(f);
        let out = Command::new(BIN).arg("check").arg(&path).output().unwrap();
        assert!(out.status.success(), "{f}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn check_lists_every_problem_and_exits_64() {
    let path = write_temp(
        "bad.yaml",
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {baseUrl: 'http://127.0.0.1:1', timeoutMs: 60000}\ntools:\n  - {name: a, inputSchema: {type: array}, http: {method: GET, path: '/x/{id}'}}\n  - {name: a, inputSchema: {type: object}, http: {method: GET, path: /y}}\n",
    );
    let out = Command::new(BIN).arg("check").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "upstream.timeoutMs",
        "tools[0] (a).inputSchema",
        "tools[1] (a).name: duplicate tool name",
        "4 problems",
    ] {
        assert!(err.contains(needle), "`{needle}` missing from:\n{err}");
    }
}

#[test]
fn check_reads_every_file_the_config_references_as_serving_would() {
    let dir = std::env::temp_dir().join(format!("toolgate-cli-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    let text = format!(
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nserver: {{sessionKeyFile: {d}/keys, adminTokenFile: {d}/admin}}\n\
         upstream: {{baseUrl: 'http://127.0.0.1:1', credential: {{header: Authorization, file: {d}/upstream}}}}\n\
         policy:\n  auth: {{mode: apiKey, credentialsFile: {d}/credentials.yaml}}\n\
         \x20 rateLimit: {{store: {{redis: {{url: 'redis://127.0.0.1:6379', passwordFile: {d}/redis-password}}}}}}\n\
         tools:\n  - {{name: a, inputSchema: {{type: object}}, http: {{method: GET, path: /a}}}}\n"
    );
    let path = dir.join("proxy.yaml");
    std::fs::write(&path, &text).unwrap();
    // Nothing it references exists, or the credentials file has the wrong top-level key.
    std::fs::write(
        dir.join("credentials.yaml"),
        "keys:\n  - {id: a, key: a-long-secret-key-1, role: viewer}\n",
    )
    .unwrap();
    let check = Command::new(BIN).arg("check").arg(&path).output().unwrap();
    assert_eq!(
        check.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let err = String::from_utf8_lossy(&check.stderr);
    for needle in [
        "policy.auth.credentialsFile",
        "upstream.credential.file",
        "server.adminTokenFile",
        "server.sessionKeyFile",
        "policy.rateLimit.store.redis.passwordFile",
    ] {
        assert!(err.contains(needle), "`{needle}` missing from:\n{err}");
    }
    assert!(!err.contains("a-long-secret-key-1"), "no secret echoed: {err}");
    let serve = Command::new(BIN).arg("--config").arg(&path).output().unwrap();
    assert_eq!(serve.status.code(), Some(64), "--config agrees");

    // With every file in order, both accept it.
    std::fs::write(
        dir.join("credentials.yaml"),
        "credentials:\n  - {id: a, key: a-long-secret-key-1, role: viewer}\n",
    )
    .unwrap();
    std::fs::write(dir.join("keys"), format!("{}\n", "A".repeat(43) + "=")).unwrap();
    std::fs::write(dir.join("admin"), "an-admin-token-of-some-length\n").unwrap();
    std::fs::write(dir.join("upstream"), "Bearer x\n").unwrap();
    std::fs::write(dir.join("redis-password"), "pw\n").unwrap();
    let check = Command::new(BIN).arg("check").arg(&path).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    assert!(String::from_utf8_lossy(&check.stdout).contains("ok (1 tools)"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serving_a_bad_config_exits_64_with_one_clear_line() {
    let path = write_temp(
        "bad2.yaml",
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {baseUrl: 'ftp://x'}\n",
    );
    let out = Command::new(BIN).arg("--config").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("upstream.baseUrl"), "{err}");
}

#[test]
fn the_published_config_schema_is_current() {
    let out = Command::new(BIN).arg("schema").output().unwrap();
    let generated: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/proxy-config.schema.json");
    let checked_in: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(
        generated == checked_in,
        "proxy-config.schema.json is stale: run `cargo run -p toolgate-proxy -- schema > proxy/config/proxy-config.schema.json`"
    );
}

#[tokio::test]
async fn sigterm_drains_in_flight_calls_then_exits_zero() {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let (mcp, admin) = (common::free_port(), common::free_port());
    let audit = std::env::temp_dir().join(format!("toolgate-cli-{}-audit.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&audit);
    let policy = format!(
        "policy:\n  readOnly: false\n  audit: {{sink: file, path: '{}'}}\n",
        audit.display()
    );
    let text = common::config_with_policy(upstream, "", &policy)
        .replace("listen: 127.0.0.1:0", &format!("listen: 127.0.0.1:{mcp}"))
        .replace("adminListen: 127.0.0.1:0", &format!("adminListen: 127.0.0.1:{admin}"))
        .replace("timeoutMs: 300", "timeoutMs: 5000");
    let path = write_temp("drain.yaml", &text);
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let http = common::client();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = http
            .get(format!("http://127.0.0.1:{admin}/readyz").parse().unwrap())
            .await;
        if ready.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "proxy never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = common::Session::open(http.clone(), format!("http://127.0.0.1:{mcp}/mcp"), "2025-06-18").await;
    let call = tokio::spawn(async move { s.envelope("slow", json!({"ms": 800})).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let killed = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(killed.success());
    let (env, is_error) = call.await.unwrap();
    assert!(!is_error, "the in-flight call was cut off: {env}");
    assert_eq!(env["data"]["slept"], 800);
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    // The drained call's audit record was written before the process exited.
    let records = std::fs::read_to_string(&audit).unwrap();
    assert_eq!(records.lines().count(), 1, "{records}");
    assert!(
        records.contains("\"tool\":\"slow\"") && records.contains("\"decision\":\"allowed\""),
        "{records}"
    );
    // New connections are refused once the listener is closed.
    assert!(std::net::TcpStream::connect(("127.0.0.1", mcp)).is_err());
}

#[tokio::test]
async fn a_shutdown_delay_keeps_serving_with_readiness_failing() {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    // Long enough for the session below on a loaded machine; the test waits for the
    // readiness to fail rather than sleeping, so the delay is all left for the calls.
    // The slow tool may take a second here (its upstream timeout is 300 ms in the common config).
    let base = common::config_text(upstream, "  shutdownDelaySeconds: 4\n");
    let text = base.replace("timeoutMs: 300}", "timeoutMs: 5000}");
    assert_ne!(text, base, "the slow tool's timeout is raised");
    let proxy = toolgate_proxy::start(toolgate_config::parse_yaml(&text).unwrap(), Default::default())
        .await
        .unwrap();
    let (mcp, admin) = (proxy.mcp_addr, proxy.admin_addr);
    let http = common::client();
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let initialize = || async {
        let url = format!("http://{mcp}/mcp");
        common::send(&http, "POST", &url, &common::base_headers(), init.to_string().into()).await
    };
    let (status, headers, _) = initialize().await;
    assert_eq!(status, 200);
    assert!(
        !headers.contains_key("connection"),
        "connections are kept alive: {headers:?}"
    );
    // A keep-alive call already in flight when the shutdown starts: its answer, produced during
    // the delay, sends its client elsewhere too.
    let s = common::Session::open(http.clone(), format!("http://{mcp}/mcp"), "2025-06-18").await;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "slow", "arguments": {"ms": 1000}}});
    let served = common::upstream_requests(&http, upstream).await;
    let in_flight = tokio::spawn(raw_keep_alive(
        mcp,
        call.to_string(),
        format!("mcp-session-id: {}\r\nmcp-protocol-version: 2025-06-18\r\n", s.id),
    ));
    common::wait_upstream_received(&http, upstream, served).await;
    let stopping = tokio::spawn(proxy.shutdown());
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let ready = http
            .get(format!("http://{admin}/readyz").parse().unwrap())
            .await
            .unwrap();
        if ready.status() == 503 {
            break;
        }
        assert!(Instant::now() < deadline, "readiness never failed during the delay");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A keep-alive request: the draining proxy answers it, says so, and closes the connection
    // (well before the delay ends, when every connection would close anyway).
    let answer = raw_keep_alive(mcp, init.to_string(), String::new()).await;
    assert!(answer.starts_with("http/1.1 200"), "{answer}");
    assert!(
        answer.contains("\r\nconnection: close\r\n"),
        "a draining proxy sends its keep-alive clients elsewhere: {answer}"
    );
    let answer = in_flight.await.unwrap();
    assert!(
        answer.starts_with("http/1.1 200") && answer.contains("\\\"slept\\\":1000"),
        "the call in flight is served: {answer}"
    );
    assert!(
        answer.contains("\r\nconnection: close\r\n"),
        "a call in flight when the shutdown started sends its client elsewhere too: {answer}"
    );
    let s = common::Session::open(http, format!("http://{mcp}/mcp"), "2025-06-18").await;
    let (env, _) = s.envelope("get_customer", json!({"customerId": "42"})).await;
    assert_eq!(env["status"], "success", "calls are still served during the delay");
    stopping.await.unwrap();
    assert!(std::net::TcpStream::connect(mcp).is_err());
}

/// Sends one MCP POST with `body` on a new HTTP/1.1 connection that asks to be kept alive, and
/// returns the whole answer (lowercased), read until the proxy closes the connection: within a
/// second of the answer, or the test fails (as it does if no answer comes within 10 s).
async fn raw_keep_alive(mcp: std::net::SocketAddr, body: String, extra_headers: String) -> String {
    tokio::time::timeout(
        Duration::from_secs(10),
        raw_keep_alive_exchange(mcp, body, extra_headers),
    )
    .await
    .expect("an answer within 10 s")
}

async fn raw_keep_alive_exchange(mcp: std::net::SocketAddr, body: String, extra_headers: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(mcp).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {mcp}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\n{extra_headers}content-length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    // The head first (the call may take its time), then the close.
    let mut buf = [0u8; 4096];
    let n = c.read(&mut buf).await.unwrap();
    answer.extend_from_slice(&buf[..n]);
    tokio::time::timeout(Duration::from_secs(1), c.read_to_end(&mut answer))
        .await
        .expect("the connection is closed after the answer")
        .unwrap();
    String::from_utf8(answer).unwrap().to_ascii_lowercase()
}
