//! OAuth end to end: tokens signed in the test, verified by the proxy against keys given inline
//! or fetched from a JWKS endpoint on loopback (rotation, an issuer that is down or stalls,
//! unknown key ids), and the refusals' pointers to the resource metadata.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::policy::*;
use common::{base_headers, send, Session};
use http::StatusCode;
use serde_json::{json, Value};
use toolgate_proxy::policy::jwt::testing::{unsigned, EcKey};

fn claims(resource: &str) -> Value {
    let now = toolgate_proxy::policy::time::now_unix();
    json!({"iss": "https://issuer.test", "aud": resource, "sub": "user-1", "exp": now + 300, "iat": now,
           "scope": "mcp:write", "azp": "whaapy-agent"})
}

fn oauth_policy(jwks: &str) -> String {
    format!(
        "  readOnly: false\n  audit: {{enabled: false}}\n  auth:\n    mode: oauth\n    oauth:\n      issuer: https://issuer.test\n      resource: RESOURCE\n      {jwks}\n      algorithms: [ES256]\n      jwksRefreshSeconds: 1\n      scopeRoles: {{'mcp:read': viewer, 'mcp:write': operator}}\n"
    )
}

#[tokio::test]
async fn oauth_tokens_are_verified_and_refusals_point_to_the_resource_metadata() {
    let key = EcKey::generate("k1");
    let dir = temp_dir("oauth-keys");
    std::fs::write(dir.join("jwks.json"), json!({"keys": [key.jwk()]}).to_string()).unwrap();
    let policy = oauth_policy(&format!("jwksFile: '{}/jwks.json'", dir.to_str().unwrap()));
    let (s, resource) = setup_resource("oauth", &policy).await;
    let metadata_url = format!("http://{}/.well-known/oauth-protected-resource/mcp", s.proxy.mcp_addr);

    let (status, headers, _) = s.raw(&[], INIT).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        headers["www-authenticate"],
        format!("Bearer resource_metadata=\"{metadata_url}\"").as_str()
    );
    let (status, _, body) = send(&common::client(), "GET", &metadata_url, &[], Bytes::new()).await;
    assert_eq!(status, StatusCode::OK);
    let meta: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(meta["resource"], resource.as_str());
    assert_eq!(meta["authorization_servers"], json!(["https://issuer.test"]));

    let good = key.sign(&claims(&resource));
    let bearer = format!("Bearer {good}");
    let session = Session::open_with(
        common::client(),
        s.url.clone(),
        "2025-06-18",
        &[("authorization", &bearer)],
    )
    .await;
    let (env, is_error) = session.envelope("echo_read", json!({"id": "1"})).await;
    assert!(!is_error, "{env}");
    assert_eq!(env["data"]["headers"]["x-toolgate-subject"], "user-1");
    assert_eq!(env["data"]["headers"]["x-toolgate-agent"], "whaapy-agent");
    assert!(env["data"]["headers"]
        .get("authorization")
        .is_none_or(|a| !a.as_str().unwrap().contains(&good)));

    let mut bad: Vec<(&str, String)> = Vec::new();
    let mut c = claims(&resource);
    c["exp"] = json!(toolgate_proxy::policy::time::now_unix() - 3600);
    bad.push(("expired_token", key.sign(&c)));
    let mut c = claims(&resource);
    c["aud"] = json!("http://127.0.0.1:1/other");
    bad.push(("wrong_audience", key.sign(&c)));
    let mut c = claims(&resource);
    c["iss"] = json!("https://evil.test");
    bad.push(("wrong_issuer", key.sign(&c)));
    bad.push(("bad_algorithm", unsigned(&claims(&resource))));
    let (h, rest) = good.split_once('.').unwrap();
    let (_, sig) = rest.split_once('.').unwrap();
    let mut c = claims(&resource);
    c["scope"] = json!("mcp:write mcp:admin");
    c["sub"] = json!("admin");
    use base64::Engine;
    bad.push((
        "bad_signature",
        format!(
            "{h}.{}.{sig}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(c.to_string())
        ),
    ));
    bad.push(("bad_signature", EcKey::generate("k1").sign(&claims(&resource))));
    for (reason, token) in bad {
        let auth = format!("Bearer {token}");
        let (status, headers, body) = s.raw(&[("authorization", &auth)], INIT).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{reason}");
        assert_eq!(body["error"]["data"]["reason"], reason);
        let challenge = headers["www-authenticate"].to_str().unwrap();
        assert!(
            challenge.contains(&format!("resource_metadata=\"{metadata_url}\"")) && challenge.contains("invalid_token"),
            "{challenge}"
        );
    }
    let mut c = claims(&resource);
    c["scope"] = json!("profile");
    let auth = format!("Bearer {}", key.sign(&c));
    let (status, headers, _) = s.raw(&[("authorization", &auth)], INIT).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(headers["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("insufficient_scope"));
}

/// A JWKS endpoint on loopback whose document can be swapped.
async fn jwks_server(doc: Arc<Mutex<String>>) -> SocketAddr {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let doc = doc.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req| {
                    let body = doc.lock().unwrap().clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(Bytes::from(
                            body,
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn keys_from_a_jwks_url_are_fetched_and_rotated() {
    let (k1, k2) = (EcKey::generate("k1"), EcKey::generate("k2"));
    let doc = Arc::new(Mutex::new(json!({"keys": [k1.jwk()]}).to_string()));
    let jwks = jwks_server(doc.clone()).await;
    let policy = oauth_policy(&format!("jwksUrl: 'http://{jwks}/jwks.json'"));
    let (s, resource) = setup_resource("jwks-url", &policy).await;
    let with = |t: String| format!("Bearer {t}");
    assert_eq!(
        s.raw(&[("authorization", &with(k1.sign(&claims(&resource))))], INIT)
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        s.raw(&[("authorization", &with(k2.sign(&claims(&resource))))], INIT)
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    *doc.lock().unwrap() = json!({"keys": [k1.jwk(), k2.jwk()]}).to_string();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        s.raw(&[("authorization", &with(k2.sign(&claims(&resource))))], INIT)
            .await
            .0,
        StatusCode::OK,
        "rotated key"
    );
}

#[tokio::test]
async fn a_reload_keeps_the_fetched_keys_while_the_issuer_is_down() {
    let key = EcKey::generate("k1");
    let doc = Arc::new(Mutex::new(json!({"keys": [key.jwk()]}).to_string()));
    let jwks = jwks_server(doc.clone()).await;
    // A refresh interval far longer than the test: only a reload could make the proxy refetch.
    let policy = oauth_policy(&format!("jwksUrl: 'http://{jwks}/jwks.json'"))
        .replace("jwksRefreshSeconds: 1", "jwksRefreshSeconds: 3600");
    let (s, resource) = setup_resource("jwks-reload", &policy).await;
    let bearer = format!("Bearer {}", key.sign(&claims(&resource)));
    assert_eq!(s.raw(&[("authorization", &bearer)], INIT).await.0, StatusCode::OK);
    // The issuer now serves garbage, and a tool edit reloads the config.
    *doc.lock().unwrap() = "not a JWKS".into();
    let path = s.dir.join("proxy.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("ms: \"600\"", "ms: \"601\"")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.proxy.shared.runtime.load().generation < 2 {
        assert!(Instant::now() < deadline, "the edit was never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        s.raw(&[("authorization", &bearer)], INIT).await.0,
        StatusCode::OK,
        "the keys fetched before the reload still verify tokens"
    );
}

/// A JWKS endpoint on loopback speaking HTTP/1.1 by hand. It serves `doc` until `stall` is
/// set; then it answers with headers promising a body far longer than what it sends and goes
/// silent, keeping the connection open. It counts the requests it receives.
struct JwksStub {
    addr: SocketAddr,
    doc: Arc<Mutex<String>>,
    stall: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
    stalled: Arc<AtomicUsize>,
}

impl JwksStub {
    async fn start(doc: String) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stub = Self {
            addr: listener.local_addr().unwrap(),
            doc: Arc::new(Mutex::new(doc)),
            stall: Arc::new(AtomicBool::new(false)),
            requests: Arc::new(AtomicUsize::new(0)),
            stalled: Arc::new(AtomicUsize::new(0)),
        };
        let (doc, stall, requests, stalled) = (
            stub.doc.clone(),
            stub.stall.clone(),
            stub.requests.clone(),
            stub.stalled.clone(),
        );
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (doc, stall, requests, stalled) = (doc.clone(), stall.clone(), requests.clone(), stalled.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    requests.fetch_add(1, Ordering::SeqCst);
                    if stall.load(Ordering::SeqCst) {
                        stalled.fetch_add(1, Ordering::SeqCst);
                        let _ = stream
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{\"keys\": [")
                            .await;
                        let _ = stream.flush().await;
                        tokio::time::sleep(Duration::from_secs(120)).await;
                        drop(stream);
                    } else {
                        let body = doc.lock().unwrap().clone();
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = stream.write_all(reply.as_bytes()).await;
                    }
                });
            }
        });
        stub
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn jwks_status(s: &Setup) -> toolgate_proxy::policy::jwks::JwksStatus {
    s.proxy
        .shared
        .runtime
        .load()
        .auth
        .jwks_status()
        .expect("keys come from a URL")
}

#[tokio::test]
async fn a_stalled_jwks_response_holds_up_no_token_whose_key_is_cached() {
    let k1 = EcKey::generate("k1");
    let jwks = JwksStub::start(json!({"keys": [k1.jwk()]}).to_string()).await;
    // jwksRefreshSeconds: 1, so the cached keys are soon due for a (background) refresh.
    let policy = oauth_policy(&format!("jwksUrl: 'http://{}/jwks.json'", jwks.addr));
    let (s, resource) = setup_resource("jwks-stall", &policy).await;
    let good = format!("Bearer {}", k1.sign(&claims(&resource)));
    assert_eq!(s.raw(&[("authorization", &good)], INIT).await.0, StatusCode::OK);
    assert_eq!(jwks.requests(), 1);
    let status = jwks_status(&s);
    assert_eq!((status.keys, status.last_error, status.refreshing), (1, None, false));
    assert!(status.last_success_unix.is_some());
    assert!(toolgate_proxy::metrics::METRICS.jwks_last_success.get() > 0);

    // From now on the JWKS server sends headers, then nothing.
    jwks.stall.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // (a) The refresh these requests start stalls; each is answered from the cached keys,
    // without waiting for it (the fetch deadline is 5 s; each request gets 3 s).
    for i in 0..5 {
        let (status, _, body) = tokio::time::timeout(Duration::from_secs(3), s.raw(&[("authorization", &good)], INIT))
            .await
            .unwrap_or_else(|_| panic!("request {i} with a cached kid waited for the stalled JWKS fetch"));
        assert_eq!(status, StatusCode::OK, "request {i}: {body}");
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while jwks.stalled.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no refresh was attempted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(jwks.requests(), 2, "one refresh at a time");
    assert!(jwks_status(&s).refreshing);

    // (b) A token naming a kid the cache lacks waits for the one fetch in flight, bounded by
    // its deadline, and is refused clearly.
    let k9 = EcKey::generate("k9");
    let unknown = format!("Bearer {}", k9.sign(&claims(&resource)));
    let bound = toolgate_proxy::policy::jwks::JWKS_FETCH_DEADLINE + Duration::from_secs(2);
    let (status, headers, body) = tokio::time::timeout(bound, s.raw(&[("authorization", &unknown)], INIT))
        .await
        .expect("an unknown kid waited beyond the JWKS fetch deadline");
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["data"]["reason"], "invalid_token");
    let challenge = headers["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.contains("error=\"invalid_token\"") && challenge.contains("no key of the issuer matches"),
        "{challenge}"
    );
    assert_eq!(jwks.requests(), 2, "the unknown kid joined the fetch in flight");
    let status = jwks_status(&s);
    assert_eq!(
        (
            status.keys,
            status.last_error,
            status.consecutive_failures,
            status.refreshing
        ),
        (1, Some("timeout"), 1, false)
    );
    assert!(
        toolgate_proxy::metrics::METRICS
            .jwks_fetch_failures
            .with_label_values(&["timeout"])
            .get()
            >= 1
    );
    // After the failure: the cached key still works at once, and the unknown kid is refused at
    // once (backoff) instead of starting another fetch.
    for auth in [&good, &unknown] {
        let (status, _, _) = tokio::time::timeout(Duration::from_secs(2), s.raw(&[("authorization", auth)], INIT))
            .await
            .expect("answered without waiting");
        let want = if auth == &good {
            StatusCode::OK
        } else {
            StatusCode::UNAUTHORIZED
        };
        assert_eq!(status, want);
    }
    assert_eq!(jwks.requests(), 2);
}

#[tokio::test]
async fn unknown_kids_cause_at_most_one_jwks_fetch_per_interval() {
    let k1 = EcKey::generate("k1");
    let jwks = JwksStub::start(json!({"keys": [k1.jwk()]}).to_string()).await;
    let policy = oauth_policy(&format!("jwksUrl: 'http://{}/jwks.json'", jwks.addr))
        .replace("jwksRefreshSeconds: 1", "jwksRefreshSeconds: 60");
    let (s, resource) = setup_resource("jwks-kids", &policy).await;
    let good = format!("Bearer {}", k1.sign(&claims(&resource)));
    assert_eq!(s.raw(&[("authorization", &good)], INIT).await.0, StatusCode::OK);
    assert_eq!(jwks.requests(), 1);

    let k9 = EcKey::generate("k9");
    let unknown = format!("Bearer {}", k9.sign(&claims(&resource)));
    // Ten at once: the first starts a refetch, the others join it.
    let burst: Vec<_> = (0..10)
        .map(|_| {
            let (url, auth) = (s.url.clone(), unknown.clone());
            tokio::spawn(async move {
                let mut hs = base_headers();
                hs.push(("authorization", &auth));
                send(&common::client(), "POST", &url, &hs, Bytes::from(INIT)).await.0
            })
        })
        .collect();
    for r in burst {
        assert_eq!(r.await.unwrap(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(jwks.requests(), 2, "one refetch for the burst");
    // The same kid again, and other unknown kids: nothing more within the interval.
    for i in 0..10 {
        assert_eq!(
            s.raw(&[("authorization", &unknown)], INIT).await.0,
            StatusCode::UNAUTHORIZED
        );
        let other = format!(
            "Bearer {}",
            EcKey::generate(&format!("other-{i}")).sign(&claims(&resource))
        );
        assert_eq!(
            s.raw(&[("authorization", &other)], INIT).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(jwks.requests(), 2, "unknown kids refetch at most once per interval");
    assert_eq!(s.raw(&[("authorization", &good)], INIT).await.0, StatusCode::OK);
    assert_eq!(jwks.requests(), 2);
}

#[tokio::test]
async fn access_tokens_must_have_an_accepted_typ_and_no_crit() {
    let key = EcKey::generate("k1");
    let dir = temp_dir("oauth-typ");
    std::fs::write(dir.join("jwks.json"), json!({"keys": [key.jwk()]}).to_string()).unwrap();
    let jwks = format!("jwksFile: '{}/jwks.json'", dir.to_str().unwrap());
    let cases = [
        (
            "",
            [
                (Some("at+jwt"), true),
                (Some("application/AT+JWT"), true),
                (Some("JWT"), false),
                (None, false),
            ],
        ),
        (
            "      tokenTypes: [at+jwt, JWT]\n",
            [
                (Some("at+jwt"), true),
                (Some("application/AT+JWT"), true),
                (Some("JWT"), true),
                (None, false),
            ],
        ),
        (
            "      tokenTypes: [JWT, '']\n",
            [
                (Some("at+jwt"), false),
                (Some("jwt"), true),
                (Some("JWT"), true),
                (None, true),
            ],
        ),
    ];
    for (i, (extra, expect)) in cases.into_iter().enumerate() {
        let policy = format!("{}{extra}", oauth_policy(&jwks));
        let (s, resource) = setup_resource(&format!("oauth-typ-{i}"), &policy).await;
        let bearer = |header: Value| format!("Bearer {}", key.sign_with_header(&header, &claims(&resource)));
        for (typ, ok) in expect {
            let mut h = json!({"alg": "ES256", "kid": "k1"});
            if let Some(t) = typ {
                h["typ"] = json!(t);
            }
            let (status, headers, body) = s.raw(&[("authorization", &bearer(h))], INIT).await;
            if ok {
                assert_eq!(status, StatusCode::OK, "tokenTypes {extra:?}, typ {typ:?}: {body}");
            } else {
                assert_eq!(
                    status,
                    StatusCode::UNAUTHORIZED,
                    "tokenTypes {extra:?}, typ {typ:?}: {body}"
                );
                let challenge = headers["www-authenticate"].to_str().unwrap();
                assert!(
                    challenge.contains("typ is not an accepted access token type"),
                    "{challenge}"
                );
            }
        }
        let crit = bearer(json!({"alg": "ES256", "kid": "k1", "typ": "JWT", "crit": ["exp"]}));
        let (status, headers, _) = s.raw(&[("authorization", &crit)], INIT).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let challenge = headers["www-authenticate"].to_str().unwrap();
        assert!(challenge.contains("critical header parameters"), "{challenge}");
        s.proxy.shutdown().await;
    }
}

#[test]
fn a_jwks_url_over_plain_http_to_another_host_is_refused_when_the_config_loads() {
    let policy =
        oauth_policy("jwksUrl: 'http://issuer.example.com/jwks.json'").replace("RESOURCE", "http://127.0.0.1:1/mcp");
    let text = format!(
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nserver: {{listen: '127.0.0.1:0', adminListen: '127.0.0.1:0'}}\nupstream:\n  baseUrl: http://127.0.0.1:1\npolicy:\n{policy}{TOOLS}"
    );
    // Refused by validation, so `toolgate-proxy check`, a reload and the start all agree.
    let err = toolgate_config::parse_yaml(&text).unwrap_err().to_string();
    assert!(
        err.contains("policy.auth.oauth.jwksUrl") && err.contains("https://"),
        "{err}"
    );
}
