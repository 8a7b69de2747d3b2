//! W3C trace context: the client's `traceparent` is continued (same trace id; the proxy's
//! request span is a child of the client's span, and the upstream call a child of that); without
//! one a new trace starts.

/// A trace id, the client's span, the proxy's request span and its upstream call span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    /// 16-byte trace id.
    pub trace_id: [u8; 16],
    /// The proxy's span for the JSON-RPC request.
    pub span_id: [u8; 8],
    /// The client's span (from its `traceparent`), parent of `span_id`.
    pub parent_id: Option<[u8; 8]>,
    /// The span of the upstream HTTP call (child of `span_id`), sent upstream as the parent.
    pub upstream_span_id: [u8; 8],
    /// Trace flags (sampled = 1).
    pub flags: u8,
}

/// Exactly `2N` hex digits as `N` bytes. Every character is checked to be a digit first:
/// `u8::from_str_radix` alone takes a leading `+` (`"+2"` is 2), so a trace id with a `+` in it
/// was accepted and read as a different id (found by the `trace_context` fuzz target).
pub fn from_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != N * 2 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, c) in s.as_bytes().chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok()?;
    }
    Some(out)
}

use from_hex as hex;

/// Random bytes for an id, from the thread's CSPRNG (`rand::rng()`, seeded from the OS): a
/// call draws three ids, and a `getrandom(2)` syscall for each cost more than the rest of the
/// id handling (profiled at c=32: three syscalls per call, with a context switch behind some).
fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut b);
    b
}

/// Lower-case hex of `bytes` (no per-byte formatting machinery: this runs on every call).
pub fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    push_hex(&mut s, bytes);
    s
}

/// Appends the lower-case hex of `bytes` to `s`, a byte pair per input byte (a `char` pushed at a
/// time cost ten instructions a digit: a capacity check and UTF-8 encoding each).
pub fn push_hex(s: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 64];
    for chunk in bytes.chunks(32) {
        for (b, out) in chunk.iter().zip(buf.chunks_exact_mut(2)) {
            out[0] = DIGITS[usize::from(b >> 4)];
            out[1] = DIGITS[usize::from(b & 15)];
        }
        s.push_str(std::str::from_utf8(&buf[..chunk.len() * 2]).expect("hex digits are ASCII"));
    }
}

impl TraceContext {
    /// Continues `traceparent` when it is a valid W3C value; `None` otherwise.
    pub fn continuing(traceparent: &str) -> Option<Self> {
        let t = Self::from_header(Some(traceparent));
        t.parent_id.is_some().then_some(t)
    }

    /// Continues `traceparent` when it is valid, else starts a new sampled trace.
    pub fn from_header(traceparent: Option<&str>) -> Self {
        let parsed = traceparent.and_then(|t| {
            let mut parts = t.trim().split('-');
            let (v, tid, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
            if v != "00" || parts.next().is_some() {
                return None;
            }
            let trace_id = hex::<16>(tid)?;
            let parent = hex::<8>(parent)?;
            let flags = hex::<1>(flags)?[0];
            (trace_id != [0; 16] && parent != [0; 8]).then_some((trace_id, Some(parent), flags))
        });
        let (trace_id, parent_id, flags) = match parsed {
            Some((t, p, f)) => (
                t,
                p,
                (f & !1) | u8::from(crate::otel::sampled(&t, p.map(|p| (p, f & 1 == 1)))),
            ),
            None => {
                let t = random();
                (t, None, u8::from(crate::otel::sampled(&t, None)))
            }
        };
        Self {
            trace_id,
            span_id: random(),
            parent_id,
            upstream_span_id: random(),
            flags,
        }
    }

    /// The trace id as 32 hex digits.
    pub fn trace_id_hex(&self) -> String {
        to_hex(&self.trace_id)
    }

    /// The `traceparent` for the upstream request: the proxy's upstream call span as parent when
    /// that span is exported; otherwise the client's span, so the trace is not cut at a span
    /// nobody will ever see.
    pub fn traceparent(&self) -> String {
        let parent = if crate::otel::enabled() && self.sampled() {
            self.upstream_span_id
        } else {
            self.parent_id.unwrap_or(self.upstream_span_id)
        };
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        push_hex(&mut s, &self.trace_id);
        s.push('-');
        push_hex(&mut s, &parent);
        s.push('-');
        push_hex(&mut s, &[self.flags]);
        s
    }

    /// Whether the trace is sampled.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_a_valid_parent_and_replaces_an_invalid_one() {
        let t = TraceContext::from_header(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(t.traceparent().starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert_eq!(t.parent_id.map(|p| to_hex(&p)).as_deref(), Some("00f067aa0ba902b7"));
        assert_ne!(t.span_id, t.upstream_span_id);
        // No spans are exported here (no OTLP endpoint): the upstream continues the client's
        // span, so the trace is not cut at a span nobody sees. (With an exporter the proxy's
        // upstream call span is the parent: proxy/tests/otel.rs.)
        assert_eq!(
            t.traceparent(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        let n = TraceContext::from_header(Some("garbage"));
        assert_ne!(n.trace_id, [0; 16]);
        assert_eq!(n.traceparent().len(), 55);
    }

    #[test]
    fn new_ids_never_repeat_within_or_across_threads() {
        // Each thread draws from its own generator: seeded from the OS, so two workers (or a
        // fork) never hand out the same ids.
        let draw = || (0..2000).map(|_| TraceContext::from_header(None)).collect::<Vec<_>>();
        let (a, b) = std::thread::scope(|s| {
            let other = s.spawn(draw);
            (draw(), other.join().unwrap())
        });
        let (mut traces, mut spans) = (std::collections::HashSet::new(), std::collections::HashSet::new());
        for t in a.iter().chain(&b) {
            assert!(t.parent_id.is_none() && t.trace_id != [0; 16] && t.span_id != [0; 8]);
            assert!(traces.insert(t.trace_id), "trace id repeated: {}", t.trace_id_hex());
            assert!(
                spans.insert(t.span_id) && spans.insert(t.upstream_span_id),
                "span id repeated"
            );
        }
    }

    #[test]
    fn only_hex_digits_are_hex() {
        // Found by the trace_context fuzz target: `+2` passed as the byte 2.
        assert!(TraceContext::continuing("00-4bf92f3577b34da6a3ce+29d0e0e4736-00f067aa0ba902b7-01").is_none());
        assert!(TraceContext::continuing("00-4bf92f3577b34da6a3ce929d0e0e4736-+0f067aa0ba902b7-01").is_none());
        assert!(TraceContext::continuing("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1").is_none());
        assert_eq!(from_hex::<2>("0aFf"), Some([0x0a, 0xff]));
        assert_eq!(from_hex::<1>("+f"), None);
        assert_eq!(from_hex::<1>("é"), None);
    }

    #[test]
    fn hex_is_two_lower_case_digits_a_byte_at_any_length() {
        let bytes: Vec<u8> = (0..=255).collect();
        let want: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(to_hex(&bytes), want);
        assert_eq!(to_hex(&bytes[..31]), want[..62]);
        assert_eq!(to_hex(&[]), "");
        let mut s = String::from("sha256:");
        push_hex(&mut s, &[0xde, 0xad]);
        assert_eq!(s, "sha256:dead");
    }
}
