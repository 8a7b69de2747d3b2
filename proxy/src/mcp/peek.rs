//! What a refused request's body says about itself, read without trusting it to be complete or
//! well formed: the bounded body reader, and a scan of a JSON-RPC message that records `id`,
//! `method` and `params.name` as it meets them and stops at the first byte it cannot read.
//!
//! A request refused before its body is parsed (over the per-IP limit, too large, too slow, not
//! JSON, the wrong media type or protocol version) may still be a `tools/call`, and every
//! `tools/call` leaves one audit record: this is how the refusal learns what to record.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

/// How a body read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// Every byte arrived, within the limit.
    Complete,
    /// More than the limit was sent; the bytes read are the first `limit`.
    TooLarge,
    /// The body did not finish arriving in time; the bytes read are what came.
    TimedOut,
    /// The connection failed mid-body.
    Failed,
}

/// Reads at most `limit` bytes of `body` within `timeout`, keeping what arrived whatever the end.
pub async fn read<B>(body: B, limit: usize, timeout: Duration) -> (Bytes, BodyEnd)
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    let mut body = body;
    let deadline = tokio::time::Instant::now() + timeout;
    // One frame (the common case) is kept as it came; only a second one costs a copy.
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    let mut len = 0usize;
    let end = loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => break BodyEnd::TimedOut,
            Ok(None) => break BodyEnd::Complete,
            Ok(Some(Err(_))) => break BodyEnd::Failed,
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else { continue };
        let take = data.len().min(limit - len);
        let over = take < data.len();
        len += take;
        match first.take() {
            None if rest.is_empty() => first = Some(data.slice(..take)),
            Some(f) => {
                rest.extend_from_slice(&f);
                rest.extend_from_slice(&data[..take]);
            }
            None => rest.extend_from_slice(&data[..take]),
        }
        if over {
            break BodyEnd::TooLarge;
        }
    };
    let bytes = match first {
        Some(f) => f,
        None => rest.freeze(),
    };
    (bytes, end)
}

/// What a scan of a possibly truncated or malformed JSON-RPC message found.
#[derive(Debug, Default, PartialEq)]
pub struct Peeked {
    /// `method`, when it is a string.
    pub method: Option<String>,
    /// `id`, when it is a string or a number.
    pub id: Option<Value>,
    /// `params.name`, when it is a string.
    pub tool: Option<String>,
}

/// Scans `bytes` as far as they read as a JSON object, recording the fields it passes.
pub fn scan(bytes: &[u8]) -> Peeked {
    let mut found = Peeked::default();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    // The error is where the scan stopped (truncation, bad syntax); what came before is kept.
    let _ = Message(&mut found).deserialize(&mut de);
    found
}

struct Message<'a>(&'a mut Peeked);

impl<'de> DeserializeSeed<'de> for Message<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Message<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON-RPC message object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "method" => self.0.method = map.next_value::<Value>()?.as_str().map(short),
                "id" => {
                    let id = map.next_value::<Value>()?;
                    self.0.id = (id.is_string() || id.is_number()).then_some(id);
                }
                "params" => map.next_value_seed(Params(&mut self.0.tool))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

struct Params<'a>(&'a mut Option<String>);

impl<'de> DeserializeSeed<'de> for Params<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Params<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a params object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == "name" {
                *self.0 = map.next_value::<Value>()?.as_str().map(short);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// At most 128 characters of a client-chosen string.
fn short(s: &str) -> String {
    super::prefix(s, 128).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    use http_body_util::Full;
    use serde_json::json;
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    #[test]
    fn a_prefix_counts_characters_and_never_splits_one() {
        assert_eq!(crate::mcp::prefix("abc", 5), "abc");
        assert_eq!(crate::mcp::prefix("abcdef", 3), "abc");
        assert_eq!(crate::mcp::prefix("", 0), "");
        // Two bytes each: a cut at 4 bytes would keep only two of them.
        assert_eq!(crate::mcp::prefix("ñññññ", 4), "ññññ");
        assert_eq!(crate::mcp::prefix("ññ", 2), "ññ");
        for (s, n) in [("añb€c😀d", 4), ("añb€c😀d", 6), ("😀😀", 1)] {
            assert_eq!(crate::mcp::prefix(s, n), s.chars().take(n).collect::<String>());
        }
    }

    /// A body that arrives in the given chunks.
    struct Chunks(VecDeque<&'static [u8]>);

    impl hyper::body::Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
            Poll::Ready(
                self.0
                    .pop_front()
                    .map(|c| Ok(hyper::body::Frame::data(Bytes::from_static(c)))),
            )
        }
    }

    #[test]
    fn a_whole_message_gives_its_id_method_and_tool() {
        let p = scan(
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":{"a":[1,2]},"name":"get_x"}}"#,
        );
        assert_eq!(
            p,
            Peeked {
                method: Some("tools/call".into()),
                id: Some(json!(7)),
                tool: Some("get_x".into())
            }
        );
    }

    #[test]
    fn a_truncated_message_gives_what_came_before_the_cut() {
        let p = scan(br#"{"id":"a-1","method":"tools/call","params":{"name":"big","arguments":{"blob":"xxxxxxx"#);
        assert_eq!(p.method.as_deref(), Some("tools/call"));
        assert_eq!(p.id, Some(json!("a-1")));
        assert_eq!(p.tool.as_deref(), Some("big"));
    }

    #[test]
    fn garbage_and_odd_types_give_nothing_false() {
        assert_eq!(scan(b"{not json"), Peeked::default());
        assert_eq!(scan(b"[1,2]"), Peeked::default());
        let p = scan(br#"{"id":{"x":1},"method":5,"params":{"name":3}}"#);
        assert_eq!(p, Peeked::default());
    }

    #[tokio::test]
    async fn the_reader_keeps_the_prefix_of_a_body_over_its_limit() {
        let body = Chunks(VecDeque::from([&b"abc"[..], b"defgh"]));
        let (bytes, end) = read(body, 5, Duration::from_secs(1)).await;
        assert_eq!((&bytes[..], end), (&b"abcde"[..], BodyEnd::TooLarge));
        let body = Chunks(VecDeque::from([&b"ab"[..], b"cd"]));
        let (bytes, end) = read(body, 5, Duration::from_secs(1)).await;
        assert_eq!((&bytes[..], end), (&b"abcd"[..], BodyEnd::Complete));
        let (bytes, end) = read(Full::new(Bytes::from_static(b"{}")), 5, Duration::from_secs(1)).await;
        assert_eq!((&bytes[..], end), (&b"{}"[..], BodyEnd::Complete));
    }
}
