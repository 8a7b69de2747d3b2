//! Three replicas of one server behind a real round-robin load balancer (nginx), sharing a
//! real Redis: a 2025-era session opened on one replica works on every replica, `DELETE`
//! through one ends it on all, a per-identity limit holds across the three, a replica can die
//! without losing a session, and a Redis outage follows the configured failure policy.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use common::services::{Balancer, Redis};
use common::{base_headers, client, send, Session};
use http::StatusCode;
use serde_json::{json, Value};
use toolgate_proxy::store::StoreError;
use toolgate_proxy::{start, Running, StartOptions};

const KEY: &str = "ops-secret-key-1";
/// Long enough to tell a hang from an answer; never a performance bound.
const HANG: Duration = Duration::from_secs(10);

struct Cluster {
    upstream: SocketAddr,
    replicas: Vec<Option<Running>>,
    lb: Balancer,
    redis: Redis,
    dir: std::path::PathBuf,
}

fn key_line(byte: u8) -> String {
    base64::engine::general_purpose::STANDARD.encode([byte; 32])
}

/// The config of every replica: sealed sessions with `key`, limits in `redis`. The store's
/// timeout is 500 ms, not the 50 ms default: debug builds on a loaded machine can stall that
/// long, and a store marked down would turn a shared limit local and a `DELETE` into a 503.
/// While Redis is stopped, an operation fails at once (its connection is refused).
fn config(
    upstream: SocketAddr,
    dir: &std::path::Path,
    redis: &Redis,
    policy_extra: &str,
    failure_policy: &str,
) -> String {
    std::fs::write(dir.join("credentials.yaml"), format!("credentials:\n  - {{id: ops, key: {KEY}, role: admin}}\n  - {{id: other, key: other-secret-key-2, role: admin}}\n")).unwrap();
    std::fs::write(dir.join("redis-password"), format!("{}\n", redis.password)).unwrap();
    let d = dir.display();
    let tools = common::config_text(upstream, "")
        .split_once("\ntools:\n")
        .map(|(_, t)| t.to_string())
        .unwrap();
    format!(
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nserver:\n  listen: 127.0.0.1:0\n  adminListen: 127.0.0.1:0\n  shutdownGraceSeconds: 1\n  sessionKeyFile: {d}/session-keys\n\
         upstream:\n  baseUrl: http://{upstream}\n  timeoutMs: 5000\n\
         policy:\n  readOnly: false\n  audit: {{enabled: false}}\n  auth: {{mode: apiKey, credentialsFile: {d}/credentials.yaml}}\n\
         \x20 rateLimit:\n    perIp: {{requests: 1000000}}\n{policy_extra}    store: {{redis: {{url: '{}', passwordFile: {d}/redis-password, timeoutMs: 500, failurePolicy: {}{}}}}}\n\
         tools:\n{tools}",
        redis.url(),
        failure_policy,
        match &redis.ca {
            Some(ca) => format!(", username: toolgate, caFile: {}", ca.display()),
            None => String::new(),
        },
    )
}

impl Cluster {
    async fn start(policy_extra: &str) -> Self {
        Self::start_with(policy_extra, "failOpen").await
    }

    async fn start_with(policy_extra: &str, failure_policy: &str) -> Self {
        Self::start_on(Redis::start().await, policy_extra, failure_policy).await
    }

    async fn start_on(redis: Redis, policy_extra: &str, failure_policy: &str) -> Self {
        let upstream = toolgate_example_service::spawn().await.unwrap();
        let dir = std::env::temp_dir().join(format!(
            "toolgate-replicas-{}-{}",
            std::process::id(),
            common::services::unique()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("session-keys"), format!("{}\n", key_line(7))).unwrap();
        let text = config(upstream, &dir, &redis, policy_extra, failure_policy);
        let mut replicas = Vec::new();
        for _ in 0..3 {
            let cfg = toolgate_config::parse_yaml(&text).unwrap();
            replicas.push(Some(start(cfg, StartOptions::default()).await.unwrap()));
        }
        let addrs: Vec<SocketAddr> = replicas.iter().flatten().map(|r| r.mcp_addr).collect();
        let lb = Balancer::start(&addrs).await;
        Self {
            upstream,
            replicas,
            lb,
            redis,
            dir,
        }
    }

    /// Replica `i`'s shared store.
    fn store(&self, i: usize) -> std::sync::Arc<toolgate_proxy::store::Store> {
        self.replicas[i].as_ref().unwrap().shared.store.load_full().unwrap()
    }

    fn replica_url(&self, i: usize) -> String {
        format!("http://{}/mcp", self.replicas[i].as_ref().unwrap().mcp_addr)
    }

    async fn session(&self, url: String) -> Session {
        Session::open_with(client(), url, "2025-06-18", &[("x-api-key", KEY)]).await
    }

    async fn kill(&mut self, i: usize) {
        if let Some(r) = self.replicas[i].take() {
            r.shutdown().await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Posts `msg` in session `s` to `url`; status, headers (with nginx's `X-Upstream`) and body.
async fn post_to(s: &Session, url: &str, msg: &Value) -> (StatusCode, http::HeaderMap, Value) {
    let mut h = base_headers();
    h.push(("mcp-session-id", &s.id));
    h.push(("mcp-protocol-version", &s.version));
    h.extend(s.auth.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let (status, headers, body) =
        tokio::time::timeout(HANG, send(&s.http, "POST", url, &h, Bytes::from(msg.to_string())))
            .await
            .expect("an answer, not a hang");
    (status, headers, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn call(id: u64, tool: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_works_on_every_replica_and_delete_through_one_ends_it_on_all() {
    let c = Cluster::start("").await;
    let s = c.session(c.lb.url()).await;
    assert!(s.id.starts_with("tg1."), "a sealed id: {}", s.id);
    let mut served_by = BTreeSet::new();
    for i in 0..9u64 {
        let (status, headers, body) =
            post_to(&s, &c.lb.url(), &call(i, "get_customer", json!({"customerId": "42"}))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["result"]["isError"], false, "{body}");
        served_by.insert(headers["x-upstream"].to_str().unwrap().to_string());
    }
    assert_eq!(served_by.len(), 3, "round robin reached every replica: {served_by:?}");
    // Each replica accepts the id directly.
    for i in 0..3 {
        let (status, _, body) = post_to(
            &s,
            &c.replica_url(i),
            &json!({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/list"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "replica {i}: {body}");
    }
    // Another subject cannot use it anywhere.
    let mut thief = c.session(c.lb.url()).await;
    thief.id = s.id.clone();
    thief.auth = vec![("x-api-key".into(), "other-secret-key-2".into())];
    let (status, _, body) = post_to(
        &thief,
        &c.replica_url(1),
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (StatusCode::NOT_FOUND, Some(-32001)),
        "{body}"
    );

    // DELETE through replica 0 ends it on 1 and 2 as well, for every method.
    let mut h = base_headers();
    h.push(("mcp-session-id", &s.id));
    h.push(("x-api-key", KEY));
    let (status, _, _) = send(&s.http, "DELETE", &c.replica_url(0), &h, Bytes::new()).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    for i in 0..3 {
        let (status, _, body) = post_to(
            &s,
            &c.replica_url(i),
            &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}),
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].as_i64()),
            (StatusCode::NOT_FOUND, Some(-32001)),
            "replica {i}: {body}"
        );
        let (status, _, body) = post_to(
            &s,
            &c.replica_url(i),
            &call(8, "get_customer", json!({"customerId": "42"})),
        )
        .await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "replica {i} refuses a call in the ended session: {body}"
        );
        // Even a call refused before its limits (an unknown tool) learns the session is gone.
        let (status, _, body) = post_to(&s, &c.replica_url(i), &call(9, "no_such_tool", json!({}))).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "replica {i}: {body}");
    }
    let (status, _, _) = send(&s.http, "DELETE", &c.replica_url(2), &h, Bytes::new()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a second DELETE finds nothing");
    // The revocation lives in Redis under the subject's hash tag, only as long as the id could.
    let keys = c.redis.keys("toolgate:*:rev:*").await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(!keys[0].contains("ops"), "subjects are stored as digests: {keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_sealed_with_another_servers_key_is_refused() {
    let c = Cluster::start("").await;
    let s = c.session(c.lb.url()).await;
    // Another server: same upstream and credentials, its own key.
    let other_dir = c.dir.join("other");
    std::fs::create_dir_all(&other_dir).unwrap();
    std::fs::write(other_dir.join("session-keys"), format!("{}\n", key_line(8))).unwrap();
    let cfg = toolgate_config::parse_yaml(&config(c.upstream, &other_dir, &c.redis, "", "failOpen")).unwrap();
    let other = start(cfg, StartOptions::default()).await.unwrap();
    let (status, _, body) = post_to(
        &s,
        &format!("http://{}/mcp", other.mcp_addr),
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (StatusCode::NOT_FOUND, Some(-32001)),
        "{body}"
    );
    other.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_identity_limit_admits_exactly_n_across_three_replicas() {
    let c = Cluster::start("    perIdentity: {requests: 5, windowSeconds: 3600}\n").await;
    let s = c.session(c.lb.url()).await;
    let mut admitted = 0;
    let mut limited_by = BTreeSet::new();
    for i in 0..12u64 {
        let (status, headers, body) =
            post_to(&s, &c.lb.url(), &call(i, "get_customer", json!({"customerId": "42"}))).await;
        match status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(body["error"]["code"], -31029, "{body}");
                assert!(headers.contains_key("retry-after"));
                limited_by.insert(headers["x-upstream"].to_str().unwrap().to_string());
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(admitted, 5, "3 replicas at 5 per hour admit 5, not 15");
    assert_eq!(
        limited_by.len(),
        3,
        "every replica refuses once the shared budget is spent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_replica_mid_run_loses_no_session() {
    let mut c = Cluster::start("").await;
    let s = c.session(c.lb.url()).await;
    for i in 0..3u64 {
        let (status, _, body) = post_to(&s, &c.lb.url(), &call(i, "get_customer", json!({"customerId": "42"}))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    c.kill(1).await;
    for i in 3..12u64 {
        let (status, _, body) = post_to(
            &s,
            &c.lb.url(),
            &call(
                i,
                "create_ticket",
                json!({"customerId": "42", "subject": format!("t{i}")}),
            ),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "call {i} after the replica died: {body}");
        assert_eq!(body["result"]["isError"], false, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_falls_back_to_local_limits_without_hanging_and_recovers() {
    let mut c = Cluster::start("    perIdentity: {requests: 1000, windowSeconds: 60}\n").await;
    let s = c.session(c.lb.url()).await;
    let (status, _, _) = post_to(&s, &c.lb.url(), &call(1, "get_customer", json!({"customerId": "42"}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(c.redis.keys("toolgate:*:id").await.len(), 1, "counted in Redis");
    let m = &toolgate_proxy::metrics::METRICS;
    let local_before = m.store_fallbacks.with_label_values(&["local"]).get();

    c.redis.stop();
    for i in 2..12u64 {
        let (status, _, body) = post_to(
            &s,
            &c.lb.url(),
            &call(i, "create_ticket", json!({"customerId": "42", "subject": "x"})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "failOpen keeps serving: {body}");
        assert_eq!(body["result"]["isError"], false, "{body}");
    }
    assert!(m.store_fallbacks.with_label_values(&["local"]).get() >= local_before + 10);
    for r in c.replicas.iter().flatten() {
        let store = r.shared.store.load_full().unwrap();
        assert!(store.failing(), "every replica saw the store fail");
        // A refused connection fails the operation at once: the client does not keep retrying
        // its connection for the whole timeout.
        let why = store.last_error();
        assert!(
            matches!(&why, Some(StoreError::Failed(m)) if m.to_lowercase().contains("refused")),
            "the store's last failure is the refusal, not a timeout: {why:?}"
        );
        let (_, _, body) = send(
            &s.http,
            "GET",
            &format!("http://{}/readyz", r.admin_addr),
            &[],
            Bytes::new(),
        )
        .await;
        let ready: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(ready["ready"], true, "readiness does not fail with the store: {ready}");
        assert_eq!(ready["store"]["up"], false, "{ready}");
        assert!(
            ready["store"]["lastError"]
                .as_str()
                .is_some_and(|e| e.to_lowercase().contains("refused")),
            "/readyz says why: {ready}"
        );
    }

    c.redis.restart().await;
    // Marked down for at most 5 s of backoff; then calls are counted in Redis again.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut i = 100;
    loop {
        i += 1;
        let (status, _, _) = post_to(&s, &c.lb.url(), &call(i, "get_customer", json!({"customerId": "42"}))).await;
        assert_eq!(status, StatusCode::OK);
        if !c.redis.keys("toolgate:*:id").await.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the store never came back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The replica that counted it says so.
    let back = c.replicas.iter().flatten().any(|r| {
        let store = r.shared.store.load_full().unwrap();
        !store.failing() && store.last_error().is_none() && store.status()["up"] == true
    });
    assert!(back, "a replica reports the store up again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_under_fail_closed_refuses_writes_and_serves_reads() {
    let mut c = Cluster::start_with("", "failClosed").await;
    let s = c.session(c.lb.url()).await;
    c.redis.stop();
    for i in 0..6u64 {
        let (status, _, body) = post_to(
            &s,
            &c.lb.url(),
            &call(i, "create_ticket", json!({"customerId": "42", "subject": "x"})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let env: Value = serde_json::from_str(body["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(body["result"]["isError"], true, "{body}");
        assert_eq!(
            (env["status"].as_str(), env["errors"][0]["code"].as_str()),
            (Some("failed"), Some("rate_limit_unavailable")),
            "{env}"
        );
        assert_eq!(env["errors"][0]["retryable"], true);
        let (status, _, body) = post_to(
            &s,
            &c.lb.url(),
            &call(100 + i, "get_customer", json!({"customerId": "42"})),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["result"]["isError"], false, "reads go on: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_refuses_the_password_is_used_once_redis_accepts_it() {
    // The replicas have the next password before Redis does (its Secret was rotated first):
    // Redis refuses them, which is not a broken connection the client would reconnect by itself.
    let mut redis = Redis::start().await;
    let current = redis.password.clone();
    let next = format!("{current}-next");
    redis.password = next.clone();
    let mut c = Cluster::start_on(redis, "", "failClosed").await;
    c.redis.password = current;
    let s = c.session(c.lb.url()).await;
    let write = |i: u64| call(i, "create_ticket", json!({"customerId": "42", "subject": "x"}));
    // Each replica on its own (the balancer would spread the calls over replicas that have or
    // have not yet tried).
    for r in 0..3 {
        let (status, _, body) = post_to(&s, &c.replica_url(r), &write(r as u64)).await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body["result"]["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains("rate_limit_unavailable")),
            "failClosed refuses writes while Redis refuses the password: {body}"
        );
        let why = c.store(r).last_error();
        assert!(
            matches!(&why, Some(StoreError::Failed(m)) if m.contains("authentication failed")),
            "the refusal is what replica {r}'s store reports: {why:?}"
        );
    }

    c.redis.require_password(&next).await;
    // Each replica tries again after its backoff (at most 5 s), on a new connection.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    for r in 0..3 {
        for i in 10.. {
            let (status, _, body) = post_to(&s, &c.replica_url(r), &write(i)).await;
            assert_eq!(status, StatusCode::OK);
            if body["result"]["isError"] == false {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "replica {r} never used the store again: {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(!c.redis.keys("toolgate:*:id").await.is_empty(), "counted in Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_connects_and_loads_its_script_before_its_first_call() {
    // Not within the first call's timeoutMs: a TLS handshake alone can take longer than 50 ms.
    let c = Cluster::start("").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let clients = c.redis.client_list().await;
        let loaded = clients.lines().filter(|l| l.contains(" cmd=script")).count();
        if loaded == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every replica loaded the script before a call: {clients}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(c.redis.keys("toolgate:*").await.is_empty(), "no call was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_stops_answering_is_used_again_once_it_answers() {
    let c = Cluster::start("").await;
    let s = c.session(c.lb.url()).await;
    let read = |i: u64| call(i, "get_customer", json!({"customerId": "42"}));
    for r in 0..3 {
        let (status, _, _) = post_to(&s, &c.replica_url(r), &read(r as u64)).await;
        assert_eq!(status, StatusCode::OK);
    }
    // Connections older than their connect timeout (1 s): a timeout on them makes new ones.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let newest_before = client_ids(&c.redis.client_list().await).max().unwrap();
    c.redis.pause(true);
    for r in 0..3 {
        let (status, _, body) = post_to(&s, &c.replica_url(r), &read(10 + r as u64)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["result"]["isError"], false, "failOpen serves: {body}");
        let why = c.store(r).last_error();
        assert_eq!(why, Some(StoreError::Timeout), "replica {r}");
    }
    c.redis.pause(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    for r in 0..3 {
        let store = c.store(r);
        for i in 100.. {
            let (status, _, _) = post_to(&s, &c.replica_url(r), &read(i)).await;
            assert_eq!(status, StatusCode::OK);
            if !store.failing() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "replica {r} never used the store again: {:?}",
                store.last_error()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Each on a connection made since: a response timeout alone would have kept the old one,
    // which works again too, but one that no longer gets answers (dropped packets) would not.
    let clients = c.redis.client_list().await;
    let renewed = clients
        .lines()
        .filter(|l| l.contains(" cmd=evalsha") && client_ids(l).all(|id| id > newest_before))
        .count();
    assert!(renewed >= 3, "every replica renewed its connection: {clients}");
}

/// The `id=` of each line of `CLIENT LIST`.
fn client_ids(list: &str) -> impl Iterator<Item = u64> + '_ {
    list.lines().filter_map(|l| {
        l.split(' ')
            .find_map(|f| f.strip_prefix("id="))
            .and_then(|id| id.parse().ok())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_redis_with_an_acl_user_shares_the_limit_and_a_server_of_another_ca_is_refused() {
    let c = Cluster::start_on(
        Redis::start_tls().await,
        "    perIdentity: {requests: 2, windowSeconds: 3600}\n",
        "failClosed",
    )
    .await;
    let s = c.session(c.lb.url()).await;
    let mut statuses = Vec::new();
    for i in 0..3u64 {
        let (status, _, _) = post_to(&s, &c.lb.url(), &call(i, "get_customer", json!({"customerId": "42"}))).await;
        statuses.push(status);
    }
    // Counted locally (the TLS connection failing) each replica would admit 2 of its own.
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS],
        "the limit is shared over TLS"
    );

    // A proxy that trusts another CA does not talk to this server: under failClosed its write
    // calls are refused.
    let other = c.dir.join("other-ca");
    std::fs::create_dir_all(&other).unwrap();
    common::services::certificates(&other, "other");
    let text = config(c.upstream, &c.dir, &c.redis, "", "failClosed").replace(
        &c.redis.ca.as_ref().unwrap().display().to_string(),
        &other.join("other.crt").display().to_string(),
    );
    let proxy = start(toolgate_config::parse_yaml(&text).unwrap(), StartOptions::default())
        .await
        .unwrap();
    let s2 = c.session(format!("http://{}/mcp", proxy.mcp_addr)).await;
    let (status, _, body) = post_to(
        &s2,
        &s2.url,
        &call(1, "create_ticket", json!({"customerId": "42", "subject": "x"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["result"]["isError"], true, "{body}");
    assert!(
        body["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("rate_limit_unavailable"),
        "{body}"
    );
    assert!(proxy.shared.store.load().as_ref().unwrap().failing());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_refused_while_redis_is_down_reaches_every_replica_when_retried() {
    let mut c = Cluster::start("").await;
    let s = c.session(c.lb.url()).await;
    let mut h = base_headers();
    h.push(("mcp-session-id", &s.id));
    h.push(("x-api-key", KEY));
    c.redis.stop();
    let (status, _, _) = send(&s.http, "DELETE", &c.replica_url(0), &h, Bytes::new()).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "not a 204 the other replicas would contradict"
    );
    c.redis.restart().await;
    // The store is marked down for its backoff (at most 5 s); the client retries.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (status, _, _) = send(&s.http, "DELETE", &c.replica_url(0), &h, Bytes::new()).await;
        if status == StatusCode::NO_CONTENT {
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            std::time::Instant::now() < deadline,
            "the retried DELETE never reached the store"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for i in 1..3 {
        let (status, _, body) = post_to(
            &s,
            &c.replica_url(i),
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "replica {i}: {body}");
    }
}
