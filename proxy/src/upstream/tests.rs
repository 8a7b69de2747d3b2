//! The upstream client against raw TCP servers on loopback, which record exactly what reached
//! them: connection reuse, the request as written, and what happens when a pooled connection
//! closes or an upstream stops answering.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use toolgate_config::UpstreamConfig;

use super::{CallError, Upstream};

/// What the test server does once it has read a request.
#[derive(Clone, Copy, PartialEq)]
enum After {
    /// Answers and waits for the next request on the same connection.
    KeepAlive,
    /// Answers (without `Connection: close`), then closes the connection when the test says so
    /// ([`Server::close`]).
    AnswerThenCloseWhenTold,
    /// Closes the connection without answering.
    CloseUnanswered,
}

/// A raw HTTP/1.1 server: counts connections, keeps every request head it read, and tells when a
/// connection's client closed it.
struct Server {
    addr: std::net::SocketAddr,
    accepted: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
    client_closed: Arc<tokio::sync::Notify>,
    /// Tells the server to close the connection it answered (`AnswerThenCloseWhenTold`).
    close: Arc<tokio::sync::Notify>,
    /// Notified when the server closed a connection after answering (`AnswerThenCloseWhenTold`).
    server_closed: Arc<tokio::sync::Notify>,
}

impl Server {
    async fn start(after: After, delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = Server {
            addr: listener.local_addr().unwrap(),
            accepted: Arc::default(),
            heads: Arc::default(),
            client_closed: Arc::default(),
            close: Arc::default(),
            server_closed: Arc::default(),
        };
        let (accepted, heads, closed) = (
            server.accepted.clone(),
            server.heads.clone(),
            Signals {
                client_closed: server.client_closed.clone(),
                close: server.close.clone(),
                server_closed: server.server_closed.clone(),
            },
        );
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, after, delay, heads.clone(), closed.clone()));
            }
        });
        server
    }

    fn upstream(&self, tweak: impl FnOnce(&mut UpstreamConfig)) -> Upstream {
        let mut cfg: UpstreamConfig =
            serde_json::from_value(serde_json::json!({"baseUrl": format!("http://{}/api", self.addr)})).unwrap();
        tweak(&mut cfg);
        Upstream::new(&cfg).unwrap()
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// How a connection's server task and the test signal each other.
#[derive(Clone)]
struct Signals {
    client_closed: Arc<tokio::sync::Notify>,
    close: Arc<tokio::sync::Notify>,
    server_closed: Arc<tokio::sync::Notify>,
}

async fn serve(mut stream: TcpStream, after: After, delay: Duration, heads: Arc<Mutex<Vec<String>>>, signals: Signals) {
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            signals.client_closed.notify_one();
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        heads
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(&buf[..end]).into_owned());
        buf.drain(..end + 4);
        // Waiting to answer, the server still sees a client that gives up and closes.
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            n = stream.read(&mut chunk) => if n.unwrap_or(0) == 0 {
                signals.client_closed.notify_one();
                return;
            }
        }
        if after == After::CloseUnanswered {
            return;
        }
        let body = r#"{"ok":true}"#;
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        if after == After::AnswerThenCloseWhenTold {
            signals.close.notified().await;
            // On loopback the close reaches the client's socket before this returns.
            drop(stream);
            signals.server_closed.notify_one();
            return;
        }
    }
}

fn get(upstream: &Upstream, path_and_query: &str) -> Request<Full<Bytes>> {
    Request::get(upstream.uri(path_and_query).unwrap())
        .body(Full::new(Bytes::new()))
        .unwrap()
}

const TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn calls_share_one_connection_and_send_the_path_with_a_host_header() {
    let server = Server::start(After::KeepAlive, Duration::ZERO).await;
    let upstream = server.upstream(|_| {});
    for i in 0..5 {
        let resp = upstream
            .send(get(&upstream, &format!("/c/{i}?q=1")), TIMEOUT)
            .await
            .unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(&resp.body[..], br#"{"ok":true}"#);
        assert_eq!(resp.content_type.unwrap(), "application/json");
    }
    assert_eq!(server.accepted(), 1, "every call after the first reuses the connection");
    let heads = server.heads();
    assert_eq!(heads.len(), 5);
    for (i, head) in heads.iter().enumerate() {
        let mut lines = head.lines();
        assert_eq!(
            lines.next(),
            Some(format!("GET /api/c/{i}?q=1 HTTP/1.1").as_str()),
            "{head}"
        );
        let host = format!("host: {}", server.addr);
        assert!(lines.any(|l| l.eq_ignore_ascii_case(&host)), "{head}");
    }
    assert_eq!(upstream.pool.idle_count(), 1);
}

#[tokio::test]
async fn a_pooled_connection_the_upstream_closed_is_left_for_a_new_one() {
    let server = Server::start(After::AnswerThenCloseWhenTold, Duration::ZERO).await;
    let upstream = server.upstream(|_| {});
    for i in 0..3 {
        let resp = upstream.send(get(&upstream, "/x"), TIMEOUT).await.unwrap();
        assert_eq!(resp.status, 200, "call {i}");
        assert_eq!(upstream.pool.idle_count(), 1, "call {i}: its connection is pooled");
        // The upstream closes the idle connection before the next call takes it.
        server.close.notify_one();
        tokio::time::timeout(TIMEOUT, server.server_closed.notified())
            .await
            .unwrap();
    }
    assert_eq!(server.accepted(), 3, "a closed connection is never written to");
    assert_eq!(server.heads().len(), 3, "and no request was sent twice");
}

#[tokio::test]
async fn a_request_queued_on_a_connection_that_then_closes_comes_back_unsent() {
    // The race a busy proxy meets with upstreams that close idle connections: the connection
    // was ready when taken, and its close arrives before the request is written.
    let server = Server::start(After::AnswerThenCloseWhenTold, Duration::ZERO).await;
    let upstream = server.upstream(|_| {});
    upstream.send(get(&upstream, "/x"), TIMEOUT).await.unwrap();
    let mut conn = upstream.pool.checkout().expect("the first call's connection is pooled");
    assert!(conn.ready().await);
    server.close.notify_one();
    tokio::time::timeout(TIMEOUT, server.server_closed.notified())
        .await
        .unwrap();
    let sent = conn.sender().try_send_request(get(&upstream, "/y"));
    let outcome = tokio::time::timeout(Duration::from_secs(2), conn.drive(sent))
        .await
        .expect("the request comes back at once, not after the call's timeout");
    let mut refused = outcome.expect_err("the connection was closed");
    assert!(
        refused.take_message().is_some(),
        "it was never written, so it may go out again"
    );
    assert_eq!(server.heads().len(), 1);
    // Through the client, the same request goes out on a new connection.
    let resp = upstream.send(get(&upstream, "/y"), TIMEOUT).await.unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(server.heads().len(), 2);
}

#[tokio::test]
async fn a_request_the_upstream_may_have_read_is_not_sent_again() {
    let server = Server::start(After::CloseUnanswered, Duration::ZERO).await;
    let upstream = server.upstream(|_| {});
    let err = upstream.send(get(&upstream, "/x"), TIMEOUT).await.unwrap_err();
    assert_eq!(err, CallError::Transport);
    assert_eq!(server.heads().len(), 1, "a write must never run twice");
    assert_eq!(upstream.pool.idle_count(), 0);
}

#[tokio::test]
async fn an_upstream_that_does_not_answer_in_time_is_a_timeout_and_its_connection_closes() {
    let server = Server::start(After::KeepAlive, Duration::from_secs(30)).await;
    let upstream = server.upstream(|_| {});
    let closed = server.client_closed.notified();
    let err = upstream
        .send(get(&upstream, "/x"), Duration::from_millis(200))
        .await
        .unwrap_err();
    assert_eq!(err, CallError::Timeout(Duration::from_millis(200)));
    assert_eq!(
        upstream.pool.idle_count(),
        0,
        "a connection with an answer pending is never reused"
    );
    tokio::time::timeout(TIMEOUT, closed)
        .await
        .expect("the abandoned connection is closed");
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error() {
    // A port bound but not listening refuses connections, and stays this test's for its length.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = socket.local_addr().unwrap().port();
    let cfg: UpstreamConfig =
        serde_json::from_value(serde_json::json!({"baseUrl": format!("http://127.0.0.1:{port}")})).unwrap();
    let upstream = Upstream::new(&cfg).unwrap();
    let err = upstream.send(get(&upstream, "/x"), TIMEOUT).await.unwrap_err();
    assert_eq!(err, CallError::Connect);
    drop(socket);
}

#[tokio::test]
async fn idle_connections_close_after_the_idle_timeout() {
    let server = Server::start(After::KeepAlive, Duration::ZERO).await;
    let upstream = server.upstream(|c| c.pool_idle_timeout_ms = 100);
    let closed = server.client_closed.notified();
    upstream.send(get(&upstream, "/x"), TIMEOUT).await.unwrap();
    assert_eq!(upstream.pool.idle_count(), 1);
    tokio::time::timeout(TIMEOUT, closed)
        .await
        .expect("the idle connection is closed by the sweep, with no call to trigger it");
    assert_eq!(upstream.pool.idle_count(), 0);
}

#[tokio::test]
async fn at_most_pool_max_idle_connections_stay_open() {
    let server = Server::start(After::KeepAlive, Duration::from_millis(100)).await;
    let upstream = Arc::new(server.upstream(|c| c.pool_max_idle = 2));
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let u = upstream.clone();
            tokio::spawn(async move { u.send(get(&u, "/x"), TIMEOUT).await })
        })
        .collect();
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap().status, 200);
    }
    assert_eq!(server.accepted(), 4, "four calls at once need four connections");
    assert_eq!(upstream.pool.idle_count(), 2);
}
