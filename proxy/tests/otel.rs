//! Traces reach a real OpenTelemetry Collector (built by e2e/tools.sh) over OTLP/HTTP: one
//! server span per JSON-RPC request, a child client span per upstream call, parent/child links
//! continuing the client's `traceparent`, and the MCP/GenAI attributes.

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_port(port: u16, what: &str) {
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let start = Instant::now();
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what} did not listen on {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn otelcol() -> std::path::PathBuf {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/tools.sh");
    let out = Command::new(script)
        .args(["path", "otelcol"])
        .output()
        .expect("e2e/tools.sh");
    assert!(
        out.status.success(),
        "the collector is not built: run e2e/tools.sh build otelcol"
    );
    std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn attr(span: &Value, key: &str) -> Option<Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| {
            let v = &a["value"];
            v.get("stringValue")
                .or(v.get("intValue"))
                .or(v.get("boolValue"))
                .cloned()
                .unwrap_or(Value::Null)
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_yields_linked_server_and_client_spans_in_a_real_collector() {
    let dir = std::env::temp_dir().join(format!("toolgate-otel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let spans_file = dir.join("spans.json");
    let otlp_port = free_port();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/tools.sh");
    let cfg = Command::new(&script)
        .args(["otelcol-config", &otlp_port.to_string(), spans_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(cfg.status.success());
    std::fs::write(dir.join("otelcol.yaml"), &cfg.stdout).unwrap();
    let _collector = Kill(
        Command::new(otelcol())
            .arg(format!("--config={}", dir.join("otelcol.yaml").display()))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("otelcol.log")).unwrap())
            .spawn()
            .expect("start the collector"),
    );
    wait_port(otlp_port, "the collector");

    let upstream = toolgate_example_service::spawn().await.unwrap();
    let (mcp, admin) = (free_port(), free_port());
    let config = config_text(upstream, "")
        .replace("listen: 127.0.0.1:0", &format!("listen: 127.0.0.1:{mcp}"))
        .replace("adminListen: 127.0.0.1:0", &format!("adminListen: 127.0.0.1:{admin}"));
    std::fs::write(dir.join("proxy.yaml"), config).unwrap();
    let mut proxy = Kill(
        Command::new(env!("CARGO_BIN_EXE_toolgate-proxy"))
            .args(["--config", dir.join("proxy.yaml").to_str().unwrap()])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{otlp_port}"))
            .env("OTEL_SERVICE_NAME", "toolgate-otel-test")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("proxy.log")).unwrap())
            .spawn()
            .expect("start toolgate-proxy"),
    );
    wait_port(mcp, "the proxy");

    // The client's span: the proxy's request span must be its child.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let url = format!("http://127.0.0.1:{mcp}/mcp");
    let http = client();
    let s = Session::open_with(
        http,
        url,
        "2025-06-18",
        &[
            ("traceparent", &format!("00-{trace_id}-{client_span}-01")),
            ("tracestate", "vendor=abc,other=x"),
        ],
    )
    .await;
    let (env, is_error) = s.envelope("echo", json!({"id": "a1"})).await;
    assert!(!is_error, "{env}");
    let upstream_parent = env["data"]["headers"]["traceparent"]
        .as_str()
        .expect("traceparent sent upstream")
        .to_string();
    assert!(
        upstream_parent.starts_with(&format!("00-{trace_id}-")),
        "{upstream_parent}"
    );

    assert_eq!(
        env["data"]["headers"]["tracestate"], "vendor=abc,other=x",
        "tracestate forwarded unchanged"
    );

    // Stop the proxy at once: the spans still queued are exported on the way out.
    let _ = Command::new("kill").args(["-TERM", &proxy.0.id().to_string()]).status();
    let status = proxy.0.wait().unwrap();
    assert!(status.success(), "the proxy exits 0 on SIGTERM");

    // The collector writes what it received (OTLP/JSON lines).
    let start = Instant::now();
    let spans: Vec<Value> = loop {
        let text = std::fs::read_to_string(&spans_file).unwrap_or_default();
        let spans: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .flat_map(|v| {
                let mut out = Vec::new();
                for rs in v["resourceSpans"].as_array().cloned().unwrap_or_default() {
                    let service = rs["resource"]["attributes"]
                        .as_array()
                        .and_then(|a| a.iter().find(|a| a["key"] == "service.name").cloned());
                    for ss in rs["scopeSpans"].as_array().cloned().unwrap_or_default() {
                        for mut sp in ss["spans"].as_array().cloned().unwrap_or_default() {
                            sp["service"] = service.clone().unwrap_or(Value::Null)["value"]["stringValue"].clone();
                            out.push(sp);
                        }
                    }
                }
                out
            })
            .filter(|s| s["traceId"].as_str().is_some_and(|t| t.eq_ignore_ascii_case(trace_id)))
            .collect();
        if spans.iter().any(|s| s["name"] == "tools/call echo") && spans.iter().any(|s| s["kind"] == 3) {
            break spans;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "spans did not arrive; collector log:\n{}\nproxy log:\n{}",
            std::fs::read_to_string(dir.join("otelcol.log")).unwrap_or_default(),
            std::fs::read_to_string(dir.join("proxy.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let server = spans.iter().find(|s| s["name"] == "tools/call echo").unwrap();
    assert_eq!(server["kind"], 2, "SERVER");
    assert_eq!(
        server["parentSpanId"].as_str().unwrap().to_lowercase(),
        client_span,
        "child of the client's span"
    );
    assert_eq!(server["service"], "toolgate-otel-test");
    assert_eq!(attr(server, "mcp.method.name"), Some(json!("tools/call")));
    assert_eq!(attr(server, "gen_ai.tool.name"), Some(json!("echo")));
    assert!(attr(server, "jsonrpc.request.id").is_some());
    assert_eq!(attr(server, "mcp.session.id"), Some(json!(s.id.clone())));
    assert_eq!(attr(server, "http.response.status_code"), Some(json!("200")));

    let upstream_span = spans.iter().find(|s| s["kind"] == 3).unwrap();
    assert_eq!(upstream_span["name"], "PATCH");
    assert_eq!(
        upstream_span["parentSpanId"], server["spanId"],
        "the upstream call is a child of the request span"
    );
    assert_eq!(attr(upstream_span, "http.response.status_code"), Some(json!("200")));
    assert_eq!(attr(upstream_span, "url.template"), Some(json!("/echo/{id}")));
    let upstream_span_id = upstream_span["spanId"].as_str().unwrap().to_lowercase();
    assert!(
        upstream_parent.contains(&upstream_span_id),
        "the upstream saw the client span as its parent: {upstream_parent}"
    );

    // Other requests of the session have spans too (initialize, notifications/initialized).
    assert!(
        spans
            .iter()
            .any(|s| attr(s, "mcp.method.name") == Some(json!("initialize"))),
        "{spans:?}"
    );
}
