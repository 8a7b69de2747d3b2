//! /metrics on the admin listener: what a scrape shows after real calls, bounded labels,
//! `promtool check metrics` on the scrape, and the runtime log level.

mod common;

use std::collections::BTreeMap;

use bytes::Bytes;
use common::*;
use serde_json::json;

type Series = Vec<(String, BTreeMap<String, String>, f64)>;

/// The registry is per process: tests that count calls run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn parse(text: &str) -> Series {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (head, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = match head.split_once('{') {
                Some((n, rest)) => {
                    let inner = rest.trim_end_matches('}');
                    let labels = inner
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            let (k, v) = p.split_once("=\"").unwrap();
                            (k.to_string(), v.trim_end_matches('"').to_string())
                        })
                        .collect();
                    (n.to_string(), labels)
                }
                None => (head.to_string(), BTreeMap::new()),
            };
            (name, labels, value.parse().unwrap())
        })
        .collect()
}

fn value(series: &Series, name: &str, labels: &[(&str, &str)]) -> f64 {
    series
        .iter()
        .filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|(_, _, v)| v)
        .sum()
}

async fn scrape(h: &Harness) -> String {
    let url = format!("http://{}/metrics", h.proxy.admin_addr);
    let (status, headers, body) = send(&h.http, "GET", &url, &[], Bytes::new()).await;
    assert_eq!(status, 200);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn a_scrape_counts_calls_by_tool_status_and_tier_with_bounded_labels() {
    // The registry is per process: compare with a scrape taken first.
    let _serial = SERIAL.lock().await;
    let h = Harness::start().await;
    let before = parse(&scrape(&h).await);
    let s = h.session("2025-06-18").await;
    let (env, is_error) = s.envelope("get_customer", json!({"customerId": "42"})).await;
    assert!(!is_error, "{env}");
    let invalid = s.call("get_customer", json!({"customerId": 42})).await;
    assert_eq!(invalid["error"]["code"], -32602, "{invalid}");
    let unknown = s.call("no_such_tool_made_up_by_a_client", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    s.request("tools/list", json!({})).await;

    let text = scrape(&h).await;
    let after = parse(&text);
    let value = |name: &str, labels: &[(&str, &str)]| value(&after, name, labels) - value(&before, name, labels);
    let ok = [("tool", "get_customer"), ("status", "success"), ("tier", "read")];
    assert_eq!(value("toolgate_tool_calls_total", &ok), 1.0, "{text}");
    assert_eq!(
        value(
            "toolgate_tool_calls_total",
            &[("tool", "get_customer"), ("status", "invalid")]
        ),
        1.0
    );
    assert_eq!(
        value("toolgate_validation_failures_total", &[("tool", "get_customer")]),
        1.0
    );
    assert_eq!(
        value(
            "toolgate_tool_calls_total",
            &[("tool", "unknown"), ("status", "invalid")]
        ),
        1.0
    );
    assert_eq!(
        value("toolgate_tool_call_duration_seconds_count", &[("tool", "get_customer")]),
        2.0
    );
    assert_eq!(
        value(
            "toolgate_upstream_request_duration_seconds_count",
            &[("tool", "get_customer"), ("code", "200")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "toolgate_mcp_requests_total",
            &[("method", "initialize"), ("code", "ok")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "toolgate_mcp_requests_total",
            &[("method", "tools/call"), ("code", "-32602")]
        ),
        2.0
    );
    assert_eq!(
        value(
            "toolgate_mcp_requests_total",
            &[("method", "tools/list"), ("code", "ok")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "toolgate_mcp_requests_total",
            &[("method", "notifications/initialized"), ("code", "ok")]
        ),
        1.0
    );
    assert_eq!(self::value(&after, "toolgate_config_generation", &[]), 1.0);
    // Bounded label values exist from the start (at 0), so a first increment shows in increase().
    for (name, label, v) in [
        ("toolgate_config_reloads_total", "result", "refused"),
        ("toolgate_rate_limited_total", "scope", "identity"),
        ("toolgate_audit_records_total", "decision", "denied"),
    ] {
        let present = after
            .iter()
            .any(|(n, l, _)| n == name && l.get(label).map(String::as_str) == Some(v));
        assert!(present, "{name}{{{label}={v}}} missing");
    }
    assert!(self::value(&after, "toolgate_sessions_active", &[]) >= 1.0);
    assert!(self::value(&after, "process_resident_memory_bytes", &[]) > 0.0);
    // A made-up tool name never becomes a label value.
    assert!(!text.contains("no_such_tool"), "{text}");
    let configured: Vec<String> = h
        .proxy
        .shared
        .runtime
        .load()
        .tools
        .iter()
        .map(|t| t.config.name.clone())
        .collect();
    for (_, labels, _) in &after {
        if let Some(tool) = labels.get("tool") {
            assert!(
                tool == "unknown" || configured.contains(tool),
                "unexpected tool label {tool}"
            );
        }
    }
}

#[tokio::test]
async fn promtool_accepts_a_real_scrape() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start().await;
    let s = h.session("2025-06-18").await;
    s.envelope("get_customer", json!({"customerId": "42"})).await;
    let text = scrape(&h).await;
    let promtool = promtool();
    let mut child = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn the_log_level_changes_at_runtime_with_the_admin_token_only() {
    toolgate_telemetry::log::init("info");
    let dir = std::env::temp_dir().join(format!("toolgate-loglevel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("admin-token");
    std::fs::write(&token_file, "admin-token-0123456789\n").unwrap();
    let h = Harness::start_with(&format!("  adminTokenFile: '{}'\n", token_file.display())).await;
    let url = format!("http://{}/loglevel", h.proxy.admin_addr);
    let good = [("authorization", "Bearer admin-token-0123456789")];
    // From loopback, without the token or with another one: refused, filter unchanged.
    for headers in [&[][..], &[("authorization", "Bearer admin-token-0123456780")][..]] {
        let (status, h, body) = send(&h.http, "PUT", &url, headers, Bytes::from("trace")).await;
        assert_eq!(status, 401, "{}", String::from_utf8_lossy(&body));
        assert_eq!(h["www-authenticate"], "Bearer");
    }
    let (status, _, body) = send(&h.http, "PUT", &url, &good, Bytes::from("debug,hyper=info")).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (_, _, body) = send(&h.http, "GET", &url, &[], Bytes::new()).await;
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["filter"],
        "debug,hyper=info"
    );
    let (status, _, body) = send(&h.http, "PUT", &url, &good, Bytes::from("info,[[[")).await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    let (status, _, _) = send(&h.http, "PUT", &url, &good, Bytes::from("  ")).await;
    assert_eq!(status, 400, "an empty filter is refused, not read as `error`");
    let (_, _, body) = send(&h.http, "GET", &url, &[], Bytes::new()).await;
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["filter"],
        "debug,hyper=info",
        "a bad filter keeps the old one"
    );

    // Without server.adminTokenFile, PUT is off, whoever asks.
    let plain = Harness::start().await;
    let url = format!("http://{}/loglevel", plain.proxy.admin_addr);
    let (status, _, body) = send(&plain.http, "PUT", &url, &good, Bytes::from("trace")).await;
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("server.adminTokenFile"));
    let (_, _, body) = send(&plain.http, "GET", &url, &[], Bytes::new()).await;
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["filter"],
        "debug,hyper=info"
    );
}

#[tokio::test]
async fn metrics_listen_moves_metrics_off_the_probe_port() {
    let h = Harness::start_with("  metricsListen: 127.0.0.1:0\n").await;
    let metrics = h.proxy.metrics_addr.expect("a metrics listener");
    let (status, _, body) = send(&h.http, "GET", &format!("http://{metrics}/metrics"), &[], Bytes::new()).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("toolgate_config_generation"));
    let (status, _, _) = send(&h.http, "GET", &format!("http://{metrics}/healthz"), &[], Bytes::new()).await;
    assert_eq!(status, 404, "the metrics listener serves nothing else");
    let admin = h.proxy.admin_addr;
    let (status, _, _) = send(&h.http, "GET", &format!("http://{admin}/metrics"), &[], Bytes::new()).await;
    assert_eq!(status, 404, "the probe port no longer serves /metrics");
    let (status, _, _) = send(&h.http, "GET", &format!("http://{admin}/readyz"), &[], Bytes::new()).await;
    assert_eq!(status, 200);
}

/// promtool built by e2e/tools.sh (test.sh builds it).
fn promtool() -> std::path::PathBuf {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/tools.sh");
    let out = std::process::Command::new(script)
        .args(["path", "promtool"])
        .output()
        .expect("e2e/tools.sh");
    assert!(
        out.status.success(),
        "promtool is not built: run e2e/tools.sh build promtool"
    );
    std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}
