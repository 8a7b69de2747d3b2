//! Agent provenance audit: exactly one JSON line per `tools/call`, whatever its outcome, written
//! by a background task from a bounded buffer. A full buffer or a failed write is counted and,
//! under `failurePolicy: failClosed`, stops write-tier calls until records can be written again.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::sync::mpsc;
use toolgate_config::pointer::Pointer;
use toolgate_config::{AuditConfig, AuditSink, FailurePolicy};

use crate::policy::time::format_rfc3339;

/// The MCP client named at initialize.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClientInfo {
    /// `clientInfo.name`.
    pub name: Option<String>,
    /// `clientInfo.version`.
    pub version: Option<String>,
}

/// One audit record. Written by [`line`]: its own `Serialize` leaves the arguments out.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// When the call arrived (RFC 3339 UTC).
    pub time: String,
    /// The proxy's id for the HTTP request.
    pub request_id: String,
    /// The JSON-RPC id.
    pub jsonrpc_id: Value,
    /// The MCP session (2025 revisions; none on 2026-07-28).
    pub session_id: Option<String>,
    /// The protocol version the call was served under (`null` when refused before it was known).
    pub protocol_version: Option<&'static str>,
    /// The MCP client (from initialize, or the request's `_meta` on 2026-07-28).
    pub client: ClientInfo,
    /// Authenticated subject (key id, JWT `sub`, `anonymous`), if authentication got that far.
    pub subject: Option<String>,
    /// Role of the subject.
    pub role: Option<String>,
    /// Acting agent, when known.
    pub agent: Option<String>,
    /// Client IP (after trusted-proxy resolution).
    pub client_ip: String,
    /// Tool name as requested.
    pub tool: Option<String>,
    /// Tool tier, when the tool exists.
    pub tier: Option<&'static str>,
    /// Tool safety class, when the tool exists.
    pub safety: Option<&'static str>,
    /// `sha256:<hex>` of the canonical arguments (sorted keys, no whitespace), before redaction.
    pub arguments_digest: Option<String>,
    /// Size of the arguments as received (compact JSON), in bytes.
    pub arguments_bytes: Option<usize>,
    /// `allowed`, `denied`, `invalid`, `rate_limited` or `cancelled`.
    pub decision: &'static str,
    /// Why (a stable label).
    pub reason: &'static str,
    /// Business status of the result, when there is one.
    pub status: Option<&'static str>,
    /// Upstream HTTP status, when the upstream answered.
    pub upstream_status: Option<u16>,
    /// Time spent in the proxy for this call.
    pub duration_ms: u64,
    /// W3C trace id.
    pub trace_id: String,
    /// The arguments with `policy.audit.redactArguments` replaced by `"[REDACTED]"` (only for
    /// authenticated callers; larger than 16 KiB: `{"omitted": "too_large", "bytes": n}`), as
    /// JSON text ([`redacted_json`]): the line's last member, written by [`line`] (`null` when
    /// `None`).
    #[serde(skip)]
    pub arguments: Option<String>,
}

/// `rec` as one line of JSON, `arguments` its last member (`null` when none are recorded).
pub fn line(rec: &AuditRecord) -> Vec<u8> {
    // A record is a few hundred bytes: one allocation rather than a doubling series.
    let mut line = Vec::with_capacity(768 + rec.arguments.as_ref().map_or(0, String::len));
    if serde_json::to_writer(&mut line, rec).is_err() {
        line.clear();
    } else {
        // The arguments are already JSON text, written from the request's own tree; serde_json
        // has no way to take text as a value without its `raw_value` feature (see Cargo.toml),
        // so it goes in after the other members, in place of the object's closing brace.
        line.pop();
        line.extend_from_slice(b",\"arguments\":");
        line.extend_from_slice(rec.arguments.as_deref().unwrap_or("null").as_bytes());
        line.push(b'}');
    }
    line.push(b'\n');
    line
}

/// SHA-256 of the canonical form of `v` (object keys sorted, no insignificant whitespace).
pub fn canonical_digest(v: &Value) -> String {
    canonical_digest_and_len(v).0
}

/// [`canonical_digest`] and the length of the canonical form in bytes.
pub fn canonical_digest_and_len(v: &Value) -> (String, usize) {
    fn write(v: &Value, out: &mut Vec<u8>) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push(b'{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    let _ = serde_json::to_writer(&mut *out, k);
                    out.push(b':');
                    write(&m[k], out);
                }
                out.push(b'}');
            }
            Value::Array(a) => {
                out.push(b'[');
                for (i, item) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write(item, out);
                }
                out.push(b']');
            }
            scalar => {
                let _ = serde_json::to_writer(&mut *out, scalar);
            }
        }
    }
    let mut buf = Vec::with_capacity(256);
    write(v, &mut buf);
    let d = Sha256::digest(&buf);
    let mut text = String::with_capacity(7 + 2 * d.len());
    text.push_str("sha256:");
    crate::trace::push_hex(&mut text, &d);
    (text, buf.len())
}

/// `v` as JSON text with every value at `pointers` replaced by `"[REDACTED]"`, written straight
/// from `v`: an audit record's arguments are this text, not a copy of their tree (which cost a
/// deep copy and its drop on every audited call).
pub fn redacted_json(v: &Value, pointers: &[Pointer]) -> String {
    let paths: Vec<&[Option<String>]> = pointers.iter().map(|p| p.tokens.as_slice()).collect();
    // A Value (string keys only) always serializes.
    serde_json::to_string(&Redacting { v, paths }).unwrap_or_else(|_| "null".into())
}

/// A value being written, and what is left of each pointer that reached it: an empty one
/// redacts it; `Some(k)` goes on into member `k` (or the element `k` names), `None` into each.
struct Redacting<'a> {
    v: &'a Value,
    paths: Vec<&'a [Option<String>]>,
}

impl Redacting<'_> {
    /// The pointers that go on into the member named `key` (`index`: the element at that index),
    /// as [`redacted`] follows them.
    fn paths_into(&self, key: &str, index: Option<usize>) -> Vec<&[Option<String>]> {
        self.paths
            .iter()
            .filter_map(|p| {
                let (first, rest) = p.split_first()?;
                let hit = match (first, index) {
                    (None, _) => true,
                    (Some(k), None) => k == key,
                    (Some(k), Some(i)) => k.parse::<usize>().ok() == Some(i),
                };
                hit.then_some(rest)
            })
            .collect()
    }
}

impl Serialize for Redacting<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        if self.paths.is_empty() {
            return self.v.serialize(s);
        }
        if self.paths.iter().any(|p| p.is_empty()) {
            return s.serialize_str("[REDACTED]");
        }
        match self.v {
            Value::Object(m) => {
                let mut out = s.serialize_map(Some(m.len()))?;
                for (k, v) in m {
                    let paths = self.paths_into(k, None);
                    out.serialize_entry(k, &Redacting { v, paths })?;
                }
                out.end()
            }
            Value::Array(a) => {
                let mut out = s.serialize_seq(Some(a.len()))?;
                for (i, v) in a.iter().enumerate() {
                    let paths = self.paths_into("", Some(i));
                    out.serialize_element(&Redacting { v, paths })?;
                }
                out.end()
            }
            other => other.serialize(s),
        }
    }
}

/// `v` with every value at `pointers` replaced by `"[REDACTED]"`, as a tree: the reference the
/// tests and the fuzzer check [`redacted_json`] against.
pub fn redacted(v: &Value, pointers: &[Pointer]) -> Value {
    fn mark(v: &mut Value, tokens: &[Option<String>]) {
        let Some((first, rest)) = tokens.split_first() else {
            *v = Value::String("[REDACTED]".into());
            return;
        };
        match (first, v) {
            (Some(k), Value::Object(m)) => {
                if let Some(c) = m.get_mut(k) {
                    mark(c, rest);
                }
            }
            (Some(k), Value::Array(a)) => {
                if let Some(c) = k.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                    mark(c, rest);
                }
            }
            (None, Value::Object(m)) => m.values_mut().for_each(|c| mark(c, rest)),
            (None, Value::Array(a)) => a.iter_mut().for_each(|c| mark(c, rest)),
            _ => {}
        }
    }
    let mut out = v.clone();
    for p in pointers {
        mark(&mut out, &p.tokens);
    }
    out
}

/// Counters of the audit pipeline.
#[derive(Debug, Default)]
pub struct AuditStats {
    /// Records handed to the sink.
    pub written: AtomicU64,
    /// Records dropped because the buffer was full.
    pub dropped: AtomicU64,
    /// Records lost to failed writes.
    pub write_failures: AtomicU64,
}

/// The audit pipeline of one audit configuration.
pub struct Auditor {
    tx: Option<mpsc::SyncSender<Msg>>,
    /// Counters.
    pub stats: Arc<AuditStats>,
    healthy: Arc<AtomicBool>,
    fail_closed: bool,
    /// Argument pointers redacted in records.
    pub redact: Vec<Pointer>,
    /// The configuration this auditor was built from.
    pub config: AuditConfig,
}

impl Auditor {
    /// Starts the writer task (must be called inside a Tokio runtime).
    pub fn start(cfg: &AuditConfig) -> Self {
        let stats = Arc::new(AuditStats::default());
        let healthy = Arc::new(AtomicBool::new(true));
        let redact = cfg
            .redact_arguments
            .iter()
            .filter_map(|p| Pointer::parse(p).ok())
            .collect();
        let tx = if cfg.enabled {
            let (tx, rx) = mpsc::sync_channel(cfg.buffer_size.max(1));
            let sink = Sink {
                kind: cfg.sink,
                path: cfg.path.clone().unwrap_or_default(),
                file: None,
            };
            let (stats, healthy) = (stats.clone(), healthy.clone());
            // A plain thread with blocking writes: cheaper per record than async file I/O, and
            // it never competes with request handling for the runtime's workers.
            let spawned = std::thread::Builder::new()
                .name("toolgate-audit".into())
                .spawn(move || writer(&rx, sink, &stats, &healthy));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start the audit writer");
            }
            Some(tx)
        } else {
            None
        };
        Self {
            tx,
            stats,
            healthy,
            fail_closed: cfg.failure_policy == FailurePolicy::FailClosed,
            redact,
            config: cfg.clone(),
        }
    }

    /// Queues a record; a full buffer drops it (counted) and marks the pipeline unhealthy.
    pub fn record(&self, rec: &AuditRecord) {
        self.record_with(rec, true);
    }

    /// Queues a record of a request refused before authentication: dropped records are counted,
    /// but cannot mark the pipeline unhealthy (an anonymous flood must not trip failClosed for
    /// everyone else).
    pub fn record_unauthenticated(&self, rec: &AuditRecord) {
        self.record_with(rec, false);
    }

    fn record_with(&self, rec: &AuditRecord, counts_for_health: bool) {
        let Some(tx) = &self.tx else { return };
        if tx.try_send(Msg::Line(line(rec))).is_err() {
            let m = &crate::metrics::METRICS;
            if counts_for_health {
                m.audit_dropped.inc();
            } else {
                m.audit_dropped_unauthenticated.inc();
            }
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            if counts_for_health {
                self.healthy.store(false, Ordering::Relaxed);
            }
        } else {
            crate::metrics::METRICS
                .audit_records
                .with_label_values(&[rec.decision])
                .inc();
        }
    }

    /// Waits (up to `timeout`) until every record queued so far has been written: on shutdown,
    /// after the last call finished, so no record is lost to the exit.
    pub async fn flush(&self, timeout: std::time::Duration) -> bool {
        let Some(tx) = self.tx.clone() else { return true };
        let (done, wait) = tokio::sync::oneshot::channel();
        // `send` blocks while the buffer is full: keep it off the runtime's workers.
        let sent = tokio::task::spawn_blocking(move || tx.send(Msg::Flush(done)).is_ok());
        matches!(tokio::time::timeout(timeout, sent).await, Ok(Ok(true)))
            && tokio::time::timeout(timeout, wait).await.is_ok_and(|r| r.is_ok())
    }

    /// Whether write-tier calls must be refused now (failClosed and records are being lost).
    pub fn refuses_writes(&self) -> bool {
        self.fail_closed && !self.healthy.load(Ordering::Relaxed)
    }

    /// Whether records are written at all.
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Whether the last attempt to write a record succeeded.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }
}

/// What the writer receives.
enum Msg {
    /// One serialized record (with its newline).
    Line(Vec<u8>),
    /// Answer once everything before it is written.
    Flush(tokio::sync::oneshot::Sender<()>),
}

fn writer(rx: &mpsc::Receiver<Msg>, mut out: Sink, stats: &AuditStats, healthy: &AtomicBool) {
    let mut bytes = Vec::with_capacity(64 * 1024);
    while let Ok(first) = rx.recv() {
        // Let a few milliseconds of records gather: one wake-up and one write for all of them,
        // instead of one per call (records are at most this much later on disk).
        if !matches!(first, Msg::Flush(_)) {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let mut n = 0u64;
        let mut next = Some(first);
        // Everything already queued goes out in one write.
        while let Some(msg) = next.take().or_else(|| if n < 1024 { rx.try_recv().ok() } else { None }) {
            match msg {
                Msg::Line(line) => {
                    bytes.extend_from_slice(&line);
                    n += 1;
                }
                Msg::Flush(done) => {
                    out.write(&bytes, n, stats, healthy);
                    bytes.clear();
                    n = 0;
                    let _ = done.send(());
                }
            }
        }
        out.write(&bytes, n, stats, healthy);
        bytes.clear();
    }
}

struct Sink {
    kind: AuditSink,
    path: String,
    file: Option<std::fs::File>,
}

impl Sink {
    fn write(&mut self, bytes: &[u8], n: u64, stats: &AuditStats, healthy: &AtomicBool) {
        if n == 0 {
            return;
        }
        let result = match self.kind {
            AuditSink::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes).and_then(|()| out.flush())
            }
            AuditSink::File => {
                if self.file.is_none() {
                    self.file = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&self.path)
                        .ok();
                }
                match self.file.as_mut() {
                    Some(f) => {
                        let r = f.write_all(bytes);
                        if r.is_err() {
                            self.file = None;
                        }
                        r
                    }
                    None => Err(std::io::Error::other(format!("cannot open {}", self.path))),
                }
            }
        };
        match result {
            Ok(()) => {
                stats.written.fetch_add(n, Ordering::Relaxed);
                healthy.store(true, Ordering::Relaxed);
            }
            Err(e) => {
                stats.write_failures.fetch_add(n, Ordering::Relaxed);
                crate::metrics::METRICS.audit_dropped.inc_by(n);
                if healthy.swap(false, Ordering::Relaxed) {
                    tracing::error!(error = %e, "audit records cannot be written");
                }
            }
        }
    }
}

/// Now, for records.
pub fn now() -> String {
    format_rfc3339(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_digest_ignores_key_order_and_whitespace() {
        let a: Value = serde_json::from_str(r#"{"b": [1, {"y": 2, "x": "é"}], "a": null}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":null,"b":[1,{"x":"é","y":2}]}"#).unwrap();
        assert_eq!(canonical_digest(&a), canonical_digest(&b));
        assert_ne!(canonical_digest(&a), canonical_digest(&json!({"a": 1})));
        assert!(canonical_digest(&a).starts_with("sha256:"));
    }

    #[test]
    fn redacted_json_writes_what_the_redacted_tree_serializes_to() {
        let v = json!({
            "card": {"number": "4111", "exp": "12/30", "01": "key"},
            "items": [{"ssn": 1, "n": [1, 2]}, {"ssn": 2}, 7, [{"ssn": 3}]],
            "a": {"b": {"c": [null, true, -1.5, "q\"\\"]}},
            "empty": {},
            "list": [],
        });
        let sets: &[&[&str]] = &[
            &[],
            &["/card/number", "/items/*/ssn"],
            &["/card/01", "/items/01/ssn"],
            &["/items/1/ssn", "/items/+1/ssn", "/items/ 2"],
            &["/card", "/card/number"],
            &["/card/number", "/card"],
            &["/*/*", "/a/b/c/3"],
            &["/a/b/c/*", "/a/b/c/9", "/nowhere/x", "/items/3/0/ssn"],
            &["/items/*", "/items/0/ssn"],
            &["/*"],
            &[""],
            &["/empty/x", "/list/0", "/list/*"],
            &["/items/-", "/items/2/x", "/a/b/c/1/deeper"],
        ];
        for set in sets {
            let p: Vec<Pointer> = set.iter().map(|p| Pointer::parse(p).unwrap()).collect();
            assert_eq!(redacted_json(&v, &p), redacted(&v, &p).to_string(), "{set:?}");
        }
        for scalar in [json!(null), json!("x"), json!(-2)] {
            let p = [Pointer::parse("/a").unwrap()];
            assert_eq!(redacted_json(&scalar, &p), scalar.to_string());
        }
    }

    fn record(arguments: Option<&str>) -> AuditRecord {
        AuditRecord {
            time: "2026-12-06T00:00:00.000Z".into(),
            request_id: "r-1".into(),
            jsonrpc_id: json!(7),
            session_id: None,
            protocol_version: Some("2026-07-28"),
            client: ClientInfo {
                name: Some("c \"1\"}".into()),
                version: None,
            },
            subject: Some("k".into()),
            role: Some("operator".into()),
            agent: None,
            client_ip: "127.0.0.1".into(),
            tool: Some("t}".into()),
            tier: Some("read"),
            safety: Some("read_only"),
            arguments_digest: Some("sha256:00".into()),
            arguments_bytes: Some(12),
            decision: "allowed",
            reason: "ok",
            status: Some("success"),
            upstream_status: Some(200),
            duration_ms: 3,
            trace_id: "t".into(),
            arguments: arguments.map(str::to_string),
        }
    }

    #[test]
    fn a_line_is_the_record_with_its_arguments_as_the_last_member() {
        let args = json!({"b": [1, {"c": "[REDACTED]"}], "a": "x\"}\n"});
        let text = line(&record(Some(&args.to_string())));
        assert_eq!(text.last(), Some(&b'\n'));
        assert_eq!(text.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        let v: Value = serde_json::from_slice(&text).unwrap();
        let mut want = serde_json::to_value(record(None)).unwrap();
        want.as_object_mut().unwrap().insert("arguments".into(), args.clone());
        assert_eq!(v, want);
        let members: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(members.first().map(|k| k.as_str()), Some("time"));
        assert_eq!(members.last().map(|k| k.as_str()), Some("arguments"));
        // Without arguments, `null` in their place, as every record had before they were text.
        let v: Value = serde_json::from_slice(&line(&record(None))).unwrap();
        want.as_object_mut().unwrap().insert("arguments".into(), Value::Null);
        assert_eq!(v, want);
        assert_eq!(
            v.as_object().unwrap().keys().next_back().map(|k| k.as_str()),
            Some("arguments")
        );
    }

    #[test]
    fn redaction_replaces_values_at_pointers() {
        let v = json!({"card": {"number": "4111", "exp": "12/30"}, "items": [{"ssn": 1}, {"ssn": 2}]});
        let p: Vec<Pointer> = ["/card/number", "/items/*/ssn"]
            .iter()
            .map(|p| Pointer::parse(p).unwrap())
            .collect();
        assert_eq!(
            redacted(&v, &p),
            json!({"card": {"number": "[REDACTED]", "exp": "12/30"}, "items": [{"ssn": "[REDACTED]"}, {"ssn": "[REDACTED]"}]})
        );
    }
}
