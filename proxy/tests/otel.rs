//! Traces and metrics reach a real OpenTelemetry Collector (built by e2e/tools.sh) over
//! OTLP/HTTP from the OpenTelemetry SDK: one server span per JSON-RPC request, a child client
//! span per upstream call, parent/child links continuing the client's `traceparent` and
//! `tracestate`, the attributes of OpenTelemetry's MCP conventions, and the
//! `mcp.server.operation.duration` / `mcp.server.session.duration` histograms (also on
//! `/metrics` under their Prometheus names), all flushed on SIGTERM.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

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
    // A tool error (an unknown customer: needs_more_info, isError) and a JSON-RPC error.
    let (bad, is_error) = s.envelope("get_customer", json!({"customerId": "nobody"})).await;
    assert!(is_error, "{bad}");
    let unknown = s.request("no/such", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    // The metrics on /metrics, under their Prometheus names.
    let admin_url = format!("http://127.0.0.1:{admin}/metrics");
    let (_, _, scrape) = send(&s.http, "GET", &admin_url, &[], bytes::Bytes::new()).await;
    let scrape = String::from_utf8(scrape.to_vec()).unwrap();
    let series = |name: &str, labels: &[&str]| {
        scrape
            .lines()
            .any(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
    };
    assert!(
        series(
            "mcp_server_operation_duration_seconds_count",
            &[
                r#"mcp_method_name="tools/call""#,
                r#"gen_ai_tool_name="echo""#,
                r#"gen_ai_operation_name="execute_tool""#,
                r#"error_type="""#,
                r#"mcp_protocol_version="2025-06-18""#
            ]
        ),
        "{scrape}"
    );
    assert!(
        series(
            "mcp_server_operation_duration_seconds_count",
            &[r#"gen_ai_tool_name="get_customer""#, r#"error_type="tool_error""#]
        ),
        "{scrape}"
    );
    assert!(
        series(
            "mcp_server_operation_duration_seconds_count",
            &[
                r#"mcp_method_name="other""#,
                r#"error_type="-32601""#,
                r#"rpc_response_status_code="-32601""#
            ]
        ),
        "{scrape}"
    );
    // Ending the session records its duration.
    let mut h = base_headers();
    h.push(("mcp-session-id", &s.id));
    h.push(("mcp-protocol-version", &s.version));
    let (status, _, _) = send(&s.http, "DELETE", &s.url, &h, bytes::Bytes::new()).await;
    assert_eq!(status, 204);
    let (_, _, scrape) = send(&s.http, "GET", &admin_url, &[], bytes::Bytes::new()).await;
    let scrape = String::from_utf8(scrape.to_vec()).unwrap();
    assert!(
        scrape
            .lines()
            .any(|l| l.starts_with("mcp_server_session_duration_seconds_count")
                && l.contains(r#"mcp_protocol_version="2025-06-18""#)
                && l.ends_with(" 1")),
        "{scrape}"
    );

    // Stop the proxy at once: the spans still queued are exported on the way out.
    let _ = Command::new("kill").args(["-TERM", &proxy.0.id().to_string()]).status();
    let status = proxy.0.wait().unwrap();
    assert!(status.success(), "the proxy exits 0 on SIGTERM");

    // The collector writes what it received (OTLP/JSON lines).
    let start = Instant::now();
    let (spans, text): (Vec<Value>, String) = loop {
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
        if spans.iter().any(|s| s["name"] == "tools/call echo")
            && spans.iter().any(|s| s["kind"] == 3)
            && text.contains("mcp.server.session.duration")
        {
            break (spans, text);
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
    assert_eq!(attr(server, "gen_ai.operation.name"), Some(json!("execute_tool")));
    assert_eq!(attr(server, "mcp.protocol.version"), Some(json!("2025-06-18")));
    assert_eq!(attr(server, "network.transport"), Some(json!("tcp")));
    assert_eq!(attr(server, "network.protocol.name"), Some(json!("http")));
    assert_eq!(attr(server, "network.protocol.version"), Some(json!("1.1")));
    assert_eq!(attr(server, "client.address"), Some(json!("127.0.0.1")));
    assert!(attr(server, "client.port").is_some());
    assert_eq!(attr(server, "error.type"), None, "a successful call has no error.type");
    assert_eq!(
        server["traceState"], "vendor=abc,other=x",
        "the client's tracestate is on the span"
    );

    let tool_error = spans
        .iter()
        .find(|s| s["name"] == "tools/call get_customer")
        .expect("the refused call's span");
    assert_eq!(attr(tool_error, "error.type"), Some(json!("tool_error")));
    assert_eq!(tool_error["status"]["code"], 2, "ERROR");
    let rpc_error = spans
        .iter()
        .find(|s| attr(s, "mcp.method.name") == Some(json!("no/such")))
        .expect("the unknown method's span");
    assert_eq!(rpc_error["name"], "other", "a client cannot mint span names");
    assert_eq!(attr(rpc_error, "rpc.response.status_code"), Some(json!("-32601")));
    assert_eq!(attr(rpc_error, "error.type"), Some(json!("-32601")));

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

    // The histograms, exported over OTLP on the way out.
    let points = |metric: &str| -> Vec<Value> {
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .flat_map(|v| v["resourceMetrics"].as_array().cloned().unwrap_or_default())
            .flat_map(|rm| rm["scopeMetrics"].as_array().cloned().unwrap_or_default())
            .flat_map(|sm| sm["metrics"].as_array().cloned().unwrap_or_default())
            .filter(|m| m["name"] == metric)
            .inspect(|m| assert_eq!(m["unit"], "s", "{m}"))
            .flat_map(|m| m["histogram"]["dataPoints"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let operations = points("mcp.server.operation.duration");
    let echo = operations
        .iter()
        .find(|p| attr(p, "gen_ai.tool.name") == Some(json!("echo")))
        .unwrap_or_else(|| panic!("no echo point: {operations:?}"));
    assert_eq!(attr(echo, "mcp.method.name"), Some(json!("tools/call")));
    assert_eq!(attr(echo, "gen_ai.operation.name"), Some(json!("execute_tool")));
    assert_eq!(attr(echo, "network.transport"), Some(json!("tcp")));
    assert_eq!(attr(echo, "mcp.protocol.version"), Some(json!("2025-06-18")));
    assert_eq!(echo["count"], "1");
    assert!(operations
        .iter()
        .any(|p| attr(p, "gen_ai.tool.name") == Some(json!("get_customer"))
            && attr(p, "error.type") == Some(json!("tool_error"))));
    let sessions = points("mcp.server.session.duration");
    assert!(
        sessions
            .iter()
            .any(|p| attr(p, "mcp.protocol.version") == Some(json!("2025-06-18")) && p["count"] == "1"),
        "{sessions:?}"
    );
}
