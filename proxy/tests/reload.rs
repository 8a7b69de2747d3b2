//! Hot reload: file changes (including the kubelet's `..data` symlink swap) are applied
//! atomically, invalid files are refused, and no call fails while configs change under load.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{config_text, Session};
use serde_json::{json, Value};
use toolgate_proxy::{start, Running, StartOptions};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("toolgate-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const EXTRA_TOOL: &str =
    "  - name: added_later\n    inputSchema: {type: object}\n    http: {method: GET, path: /health}\n";

async fn start_watching(path: &Path) -> Running {
    let (cfg, sha) = toolgate_proxy::reload::load_file_with_digest(path).unwrap();
    watch_from(path, cfg, sha).await
}

/// Serves `cfg`, parsed from bytes whose SHA-256 is `sha`, and watches `path` for changes.
async fn watch_from(path: &Path, cfg: toolgate_config::ProxyConfig, sha: [u8; 32]) -> Running {
    start(
        cfg,
        StartOptions {
            config_path: Some(path.to_path_buf()),
            config_sha256: Some(sha),
            reload_interval: Duration::from_millis(50),
            ..StartOptions::default()
        },
    )
    .await
    .unwrap()
}

async fn tool_names(s: &Session) -> Vec<String> {
    let r = s.request("tools/list", json!({})).await;
    r["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

async fn wait_for_generation(p: &Running, generation: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.shared.runtime.load().generation < generation {
        assert!(Instant::now() < deadline, "generation {generation} never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn readyz(p: &Running) -> Value {
    let (_, _, body) = common::send(
        &common::client(),
        "GET",
        &format!("http://{}/readyz", p.admin_addr),
        &[],
        Default::default(),
    )
    .await;
    serde_json::from_slice(&body).unwrap()
}

/// Replaces the config file at once (a new file renamed over it), as a ConfigMap update or an
/// editor's save does: the watcher never reads it half-written, so every refusal it counts is
/// of a file a test meant to be invalid.
fn write_config(path: &Path, text: impl AsRef<[u8]>) -> std::io::Result<()> {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Refusals are counted in one process-wide series, so a test waiting for its own file to be
/// refused holds this: another test's refusal then cannot end the wait early (the other tests
/// write only valid configs, each at once).
static REFUSALS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn refusals() -> u64 {
    toolgate_proxy::metrics::METRICS
        .config_reloads
        .with_label_values(&["refused"])
        .get()
}

/// Waits until a refusal after `before` was counted.
async fn wait_refused(before: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while refusals() == before {
        assert!(Instant::now() < deadline, "the watcher never refused the file");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_changed_file_is_applied_and_an_invalid_one_is_refused() {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let dir = temp_dir("apply");
    let path = dir.join("proxy.yaml");
    let base = config_text(upstream, "");
    write_config(&path, &base).unwrap();
    let p = start_watching(&path).await;
    let s = Session::open(common::client(), format!("http://{}/mcp", p.mcp_addr), "2025-06-18").await;
    assert!(!tool_names(&s).await.contains(&"added_later".to_string()));

    write_config(&path, format!("{base}{EXTRA_TOOL}")).unwrap();
    wait_for_generation(&p, 2).await;
    assert!(
        tool_names(&s).await.contains(&"added_later".to_string()),
        "sessions survive a reload"
    );
    assert_eq!(readyz(&p).await["generation"], 2);

    let refusing = REFUSALS.lock().await;
    let before = refusals();
    write_config(&path, base.replace("type: object", "type: string")).unwrap();
    wait_refused(before).await;
    drop(refusing);
    assert_eq!(
        p.shared.runtime.load().generation,
        2,
        "an invalid config is never applied"
    );
    assert!(tool_names(&s).await.contains(&"added_later".to_string()));
    let (env, _) = s.envelope("get_customer", json!({"customerId": "42"})).await;
    assert_eq!(env["status"], "success");

    write_config(&path, &base).unwrap();
    wait_for_generation(&p, 3).await;
    assert!(!tool_names(&s).await.contains(&"added_later".to_string()));
    p.shutdown().await;
}

const PATTERNED_TOOL: &str = "  - name: patterned\n    inputSchema: {type: object, required: [code], properties: {code: {type: string, pattern: '^[A-Z]{3}$'}}}\n    http: {method: GET, path: /health}\n";

#[tokio::test]
async fn schemas_compile_on_first_call_and_a_bad_pattern_is_still_refused_at_load() {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let dir = temp_dir("lazy");
    let path = dir.join("proxy.yaml");
    let base = format!("{}{PATTERNED_TOOL}", config_text(upstream, ""));
    write_config(&path, &base).unwrap();
    let p = start_watching(&path).await;
    let rt = p.shared.runtime.load_full();
    let patterned = &rt.tool("patterned").unwrap().input;
    assert!(
        !patterned.is_compiled(),
        "no schema is compiled before its tool is called"
    );
    let s = Session::open(common::client(), format!("http://{}/mcp", p.mcp_addr), "2025-06-18").await;
    let refused = s.call("patterned", json!({"code": "abc"})).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert_eq!(refused["error"]["data"]["field"], "code", "{refused}");
    let (env, is_error) = s.envelope("patterned", json!({"code": "ABC"})).await;
    assert!(!is_error && env["status"] == "success", "{env}");
    assert!(patterned.is_compiled());
    assert!(
        !rt.tool("get_customer").unwrap().input.is_compiled(),
        "calling one tool compiles that tool's schema only"
    );

    // A pattern the linear-time engine cannot run is refused when the file is loaded, not on
    // the first call: the generation in force stays, and so does its validation.
    let refusing = REFUSALS.lock().await;
    let before = refusals();
    write_config(&path, base.replace("^[A-Z]{3}$", r"^(a*)*\1b$")).unwrap();
    wait_refused(before).await;
    drop(refusing);
    assert_eq!(
        p.shared.runtime.load().generation,
        1,
        "the bad pattern is never applied"
    );
    let refused = s.call("patterned", json!({"code": "abc"})).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    p.shutdown().await;
}

#[tokio::test]
async fn a_change_made_before_the_first_check_is_applied() {
    // The watcher starts from the digest of the bytes the served config was parsed from; a file
    // rewritten between that read and the watcher's first look must still differ from it.
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let dir = temp_dir("early");
    let path = dir.join("proxy.yaml");
    let base = config_text(upstream, "");
    write_config(&path, &base).unwrap();
    let (cfg, sha) = toolgate_proxy::reload::load_file_with_digest(&path).unwrap();
    write_config(&path, format!("{base}{EXTRA_TOOL}")).unwrap();
    let p = watch_from(&path, cfg, sha).await;
    assert!(p.shared.runtime.load().tool("added_later").is_none());
    wait_for_generation(&p, 2).await;
    assert!(p.shared.runtime.load().tool("added_later").is_some());
    p.shutdown().await;
}

#[tokio::test]
async fn the_kubelet_symlink_swap_of_a_configmap_is_followed() {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let dir = temp_dir("symlink");
    let base = config_text(upstream, "");
    // The layout a kubelet writes for a ConfigMap volume.
    std::fs::create_dir(dir.join("..2026_11_30_01")).unwrap();
    std::fs::write(dir.join("..2026_11_30_01/proxy.yaml"), &base).unwrap();
    std::os::unix::fs::symlink("..2026_11_30_01", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/proxy.yaml", dir.join("proxy.yaml")).unwrap();
    let p = start_watching(&dir.join("proxy.yaml")).await;

    std::fs::create_dir(dir.join("..2026_11_30_02")).unwrap();
    std::fs::write(dir.join("..2026_11_30_02/proxy.yaml"), format!("{base}{EXTRA_TOOL}")).unwrap();
    std::os::unix::fs::symlink("..2026_11_30_02", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(dir.join("..2026_11_30_01")).unwrap();

    wait_for_generation(&p, 2).await;
    assert!(p.shared.runtime.load().tool("added_later").is_some());
    p.shutdown().await;
}

#[tokio::test]
async fn in_flight_calls_finish_on_the_config_they_started_with() {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let dir = temp_dir("inflight");
    let path = dir.join("proxy.yaml");
    let base = config_text(upstream, "");
    write_config(&path, &base).unwrap();
    let p = start_watching(&path).await;
    let s = Arc::new(Session::open(common::client(), format!("http://{}/mcp", p.mcp_addr), "2025-06-18").await);
    let s2 = s.clone();
    let http = common::client();
    let served = common::upstream_requests(&http, upstream).await;
    let call = tokio::spawn(async move { s2.envelope("slow", json!({"ms": 250})).await });
    common::wait_upstream_received(&http, upstream, served).await;
    // The new generation no longer has the tool at all.
    let without_slow = base.replace("  - name: slow\n", "  - name: slow_renamed\n");
    write_config(&path, without_slow).unwrap();
    wait_for_generation(&p, 2).await;
    let (env, is_error) = call.await.unwrap();
    assert!(!is_error, "{env}");
    assert_eq!(env["data"]["slept"], 250);
    assert_eq!(s.call("slow", json!({})).await["error"]["code"], -32602);
    p.shutdown().await;
}

#[tokio::test]
async fn reload_under_load_loses_no_call() {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let dir = temp_dir("load");
    let path = dir.join("proxy.yaml");
    let base = config_text(upstream, "");
    write_config(&path, &base).unwrap();
    let p = start_watching(&path).await;
    let url = format!("http://{}/mcp", p.mcp_addr);
    let ok = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (url, ok, stop) = (url.clone(), ok.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let s = Session::open(common::client(), url, "2025-06-18").await;
            while !stop.load(Ordering::Relaxed) {
                let (env, is_error) = s.envelope("get_customer", json!({"customerId": "42"})).await;
                assert!(!is_error, "a call failed during reload: {env}");
                ok.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for i in 0..20u64 {
        let text = if i % 2 == 0 {
            format!("{base}{EXTRA_TOOL}")
        } else {
            base.replace("Returns one customer.", &format!("Returns one customer (v{i})."))
        };
        write_config(&path, text).unwrap();
        wait_for_generation(&p, i + 2).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(p.shared.runtime.load().generation, 21);
    assert!(
        ok.load(Ordering::Relaxed) > 100,
        "only {} calls completed",
        ok.load(Ordering::Relaxed)
    );
    p.shutdown().await;
}
