//! `subscriptions/listen` (2026-07-28): a long-lived SSE response that first acknowledges the
//! notification types it will honour, then sends `notifications/tools/list_changed` whenever a
//! config reload changes the tools this caller may see. Every message carries the listen
//! request's id as `_meta` subscriptionId. The stream sends `:` keep-alive comments, checks the
//! caller's credentials again at each one and at each reload (a revoked or expired credential
//! ends it with an error), and ends with a final result when the proxy drains.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderMap, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use super::modern::{self, META_SUBSCRIPTION_ID};
use super::{rpc_error, visible, Body, Caller, Shared};
use crate::policy::Identity;
use crate::runtime::Runtime;

/// The open streams and what wakes them.
pub struct Subscriptions {
    generation: watch::Sender<u64>,
    closing: watch::Sender<bool>,
    total: AtomicUsize,
    per_identity: Mutex<HashMap<String, usize>>,
}

impl Default for Subscriptions {
    fn default() -> Self {
        Self {
            generation: watch::channel(0).0,
            closing: watch::channel(false).0,
            total: AtomicUsize::new(0),
            per_identity: Mutex::default(),
        }
    }
}

/// A stream's place in the bounds, given back when the stream ends.
struct Slot {
    subs: Arc<Shared>,
    subject: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let s = &self.subs.subscriptions;
        s.total.fetch_sub(1, Ordering::SeqCst);
        let mut m = s.per_identity.lock().expect("lock");
        if let Some(n) = m.get_mut(&self.subject) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.subject);
            }
        }
        crate::metrics::METRICS.listeners.dec();
    }
}

impl Subscriptions {
    /// Wakes every stream: config generation `generation` is serving.
    pub fn reloaded(&self, generation: u64) {
        self.generation.send_replace(generation);
    }

    /// Ends every stream (the proxy drains) with a final result.
    pub fn close_all(&self) {
        self.closing.send_replace(true);
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }

    fn admit(shared: &Arc<Shared>, subject: &str, max_total: usize, max_per: usize) -> Option<Slot> {
        let s = &shared.subscriptions;
        let mut m = s.per_identity.lock().expect("lock");
        let mine = m.get(subject).copied().unwrap_or(0);
        if mine >= max_per || s.total.load(Ordering::SeqCst) >= max_total {
            return None;
        }
        m.insert(subject.to_string(), mine + 1);
        s.total.fetch_add(1, Ordering::SeqCst);
        crate::metrics::METRICS.listeners.inc();
        Some(Slot {
            subs: Arc::clone(shared),
            subject: subject.to_string(),
        })
    }
}

fn event(message: &Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {message}\n\n"))
}

/// The tools `who` may see, as a fingerprint of their listings.
fn fingerprint(rt: &Runtime, who: &Identity) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for t in visible(rt, who) {
        t.listing.hash(&mut h);
    }
    h.finish()
}

/// Answers a `subscriptions/listen` request.
pub(crate) fn listen(
    shared: &Arc<Shared>,
    rt: &Arc<Runtime>,
    caller: &Caller,
    headers: &HeaderMap,
    id: &Value,
    params: Option<&Value>,
) -> Response<Body> {
    let wanted = params.and_then(|p| p.get("notifications"));
    if !wanted.is_none_or(Value::is_object) {
        return rpc_error(
            StatusCode::OK,
            Some(id),
            super::code::INVALID_PARAMS,
            "Invalid params: `notifications` must be an object",
            None,
        );
    }
    let tools = wanted
        .and_then(|w| w.get("toolsListChanged"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let server = &rt.config.server;
    let who = caller.identity.clone();
    let Some(slot) = Subscriptions::admit(
        shared,
        &who.subject,
        server.max_listeners,
        server.max_listeners_per_identity,
    ) else {
        let mut r = rpc_error(
            StatusCode::TOO_MANY_REQUESTS,
            Some(id),
            super::code::RATE_LIMITED,
            format!(
                "Too many open subscriptions/listen streams (at most {} per caller, {} in all); close one first",
                server.max_listeners_per_identity, server.max_listeners
            ),
            Some(json!({"scope": "listeners"})),
        );
        r.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from_static("5"));
        return r;
    };
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let sub_id = id.clone();
    let honored = if tools {
        json!({"toolsListChanged": true})
    } else {
        json!({})
    };
    let ack = json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
        "params": {"_meta": {META_SUBSCRIPTION_ID: sub_id}, "notifications": honored}});
    let shared = Arc::clone(shared);
    let headers = headers.clone();
    let keep_alive = Duration::from_secs(server.listen_keep_alive_seconds.max(1));
    let mut seen = fingerprint(rt, &who);
    tokio::spawn(async move {
        let _slot = slot;
        if tx.send(event(&ack)).await.is_err() {
            return;
        }
        let mut generation = shared.subscriptions.generation.subscribe();
        let mut closing = shared.subscriptions.closing.subscribe();
        let final_result = |shared: &Shared| {
            let rt = shared.runtime.load_full();
            let mut result = json!({"_meta": {META_SUBSCRIPTION_ID: sub_id}});
            modern::complete(&mut result, &rt);
            event(&json!({"jsonrpc": "2.0", "id": sub_id, "result": result}))
        };
        if *closing.borrow_and_update() {
            let _ = tx.send(final_result(&shared)).await;
            return;
        }
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + keep_alive, keep_alive);
        let ended = |reason: &str| {
            json!({"jsonrpc": "2.0", "id": sub_id, "error": {"code": super::code::UNAUTHORIZED,
                "message": format!("Unauthorized: {reason}; the subscription has ended"),
                "data": {"reason": "credentials_rejected"}}})
        };
        loop {
            tokio::select! {
                _ = tx.closed() => return,
                closed = closing.changed() => {
                    if closed.is_err() || *closing.borrow_and_update() {
                        let _ = tx.send(final_result(&shared)).await;
                        return;
                    }
                }
                changed = generation.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let rt = shared.runtime.load_full();
                    let who = match rt.auth.authenticate(&headers).await {
                        Ok(i) => i,
                        Err(e) => {
                            let _ = tx.send(event(&ended(&e.to_string()))).await;
                            return;
                        }
                    };
                    let now = fingerprint(&rt, &who);
                    if now != seen {
                        seen = now;
                        if tools {
                            let note = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
                                "params": {"_meta": {META_SUBSCRIPTION_ID: sub_id}}});
                            if tx.send(event(&note)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                _ = tick.tick() => {
                    let rt = shared.runtime.load_full();
                    if let Err(e) = rt.auth.authenticate(&headers).await {
                        let _ = tx.send(event(&ended(&e.to_string()))).await;
                        return;
                    }
                    if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut resp = Response::new(Body::stream(rx));
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, no-transform"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
