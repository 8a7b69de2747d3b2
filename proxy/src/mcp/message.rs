//! A request body read as one JSON-RPC message in a single pass: the members the endpoint acts
//! on (`jsonrpc`, `id`, `method`, `params`, whether it is a response), with `method` borrowed from
//! the body and every other member skipped unbuilt. Only `params` becomes a JSON tree, because
//! the methods read it. Reading the message itself into a `serde_json::Value` built a map of it
//! (its keys hashed and allocated, `"2.0"` and the method copied) only to look five members up
//! again.
//!
//! The answers are those of the tree: a repeated member counts its last value, as `Map::insert`
//! does; anything the tree refuses (bad grammar, invalid UTF-8, a lone surrogate, nesting past
//! serde_json's limit, in any member, read or skipped) is the same parse error, with serde_json's
//! message.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// What a request body holds.
pub(crate) enum Parsed<'a> {
    /// A JSON object: one message.
    Message(Message<'a>),
    /// A JSON array: a batch (refused; each `tools/call` in it still leaves its record).
    Batch(Vec<Value>),
    /// Any other JSON value.
    Scalar,
}

/// The members of a JSON-RPC message that the endpoint reads.
#[derive(Default)]
pub(crate) struct Message<'a> {
    /// Whether `jsonrpc` is the string `"2.0"`.
    pub jsonrpc_2: bool,
    /// `id` as sent (`None` when absent: a notification, or a response without one).
    pub id: Option<Value>,
    /// `method` (`None` when absent).
    pub method: Option<Text<'a>>,
    /// `params` as sent (`None` when absent).
    pub params: Option<Value>,
    /// Whether it carries `result` or `error`: a response the client sent.
    pub is_response: bool,
}

/// A member that should be a string.
#[derive(Debug, PartialEq)]
pub(crate) enum Text<'a> {
    /// A string; borrowed from the body unless it had escapes.
    Str(Cow<'a, str>),
    /// Any other JSON value.
    NotString,
}

impl Message<'_> {
    /// `method` when it is a string.
    pub fn method_str(&self) -> Option<&str> {
        match &self.method {
            Some(Text::Str(m)) => Some(m),
            _ => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Parsed<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ParsedVisitor(std::marker::PhantomData))
    }
}

struct ParsedVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for ParsedVisitor<'a> {
    type Value = Parsed<'a>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut m = Message::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Jsonrpc => m.jsonrpc_2 = map.next_value::<Text>()? == Text::Str(Cow::Borrowed("2.0")),
                Key::Id => m.id = Some(map.next_value()?),
                Key::Method => m.method = Some(map.next_value()?),
                Key::Params => m.params = Some(map.next_value()?),
                Key::Response => {
                    map.next_value::<Skip>()?;
                    m.is_response = true;
                }
                Key::Other => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        // With serde_json's `arbitrary_precision` feature (off in this workspace) a top-level
        // number would arrive here as a one-member map; `batches_and_scalars_are_told_apart`
        // fails then.
        Ok(Parsed::Message(m))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element()? {
            items.push(v);
        }
        Ok(Parsed::Batch(items))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Parsed::Scalar)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Parsed::Scalar)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Parsed::Scalar)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Parsed::Scalar)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Parsed::Scalar)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Parsed::Scalar)
    }
}

/// A member's name, told apart without copying it (serde's `Cow<str>` would always copy). A
/// name with escapes (`"\u0069d"`) is decoded by serde_json first and counts as what it spells.
enum Key {
    Jsonrpc,
    Id,
    Method,
    Params,
    /// `result` or `error`.
    Response,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member name")
    }

    // A borrowed or an owned name comes here too (serde's defaults forward both).
    fn visit_str<E: de::Error>(self, name: &str) -> Result<Self::Value, E> {
        Ok(match name {
            "jsonrpc" => Key::Jsonrpc,
            "id" => Key::Id,
            "method" => Key::Method,
            "params" => Key::Params,
            "result" | "error" => Key::Response,
            _ => Key::Other,
        })
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextVisitor(std::marker::PhantomData))
    }
}

struct TextVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for TextVisitor<'a> {
    type Value = Text<'a>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Text::Str(Cow::Borrowed(s)))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Text::Str(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
        Ok(Text::Str(Cow::Owned(s)))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Text::NotString)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Text::NotString)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Text::NotString)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Text::NotString)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Text::NotString)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Skip::rest_of_map(map)?;
        Ok(Text::NotString)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Skip::rest_of_seq(seq)?;
        Ok(Text::NotString)
    }
}

/// A JSON value read and checked as the tree would read it, and dropped: unlike
/// `serde::de::IgnoredAny` (serde_json's fast skip), it checks what the tree checks (UTF-8 and
/// surrogates in strings, the nesting limit), so a member the endpoint does not read cannot make
/// a body the tree refuses acceptable.
struct Skip;

impl Skip {
    fn rest_of_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(())
    }

    fn rest_of_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(())
    }
}

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Skip)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = Skip;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, _: &'de str) -> Result<Self::Value, E> {
        Ok(Skip)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Skip)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Skip)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Skip)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Skip)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Skip)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Skip)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Skip::rest_of_map(map)?;
        Ok(Skip)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Skip::rest_of_seq(seq)?;
        Ok(Skip)
    }
}

/// Reads `body` as one JSON value (trailing whitespace only), as `serde_json::from_slice` does.
pub(crate) fn parse(body: &[u8]) -> serde_json::Result<Parsed<'_>> {
    serde_json::from_slice(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What the endpoint reads of a message: `jsonrpc` is "2.0", `id`, `method` (`None` inside
    /// when not a string), `params`, whether it is a response.
    type Reading = (bool, Option<Value>, Option<Option<String>>, Option<Value>, bool);

    /// The reading of `body` the endpoint made before: the message as a tree.
    fn oracle(body: &str) -> Option<Reading> {
        let v: Value = serde_json::from_str(body).ok()?;
        let m = v.as_object()?;
        Some((
            m.get("jsonrpc").and_then(Value::as_str) == Some("2.0"),
            m.get("id").cloned(),
            m.get("method").map(|x| x.as_str().map(str::to_string)),
            m.get("params").cloned(),
            m.contains_key("result") || m.contains_key("error"),
        ))
    }

    fn read(body: &str) -> Option<Reading> {
        match parse(body.as_bytes()).ok()? {
            Parsed::Message(m) => Some((
                m.jsonrpc_2,
                m.id.clone(),
                m.method.as_ref().map(|t| match t {
                    Text::Str(s) => Some(s.to_string()),
                    Text::NotString => None,
                }),
                m.params,
                m.is_response,
            )),
            _ => None,
        }
    }

    #[test]
    fn a_message_reads_as_its_tree_reads() {
        let bodies = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":[1,{"b":null}]}}}"#,
            r#"{"method":"tools/list","jsonrpc":"2.0","id":"abc"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":7}"#,
            r#"{"jsonrpc":"2.0","id":{"x":1},"method":["tools/call"],"params":[1,2]}"#,
            r#"{"jsonrpc":"2.0","id":true,"method":{"a":{"b":[]}},"params":"x"}"#,
            r#"{"jsonrpc":2.0,"id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0 ","id":1,"method":null}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"m"}}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":null,"method":"x"}"#,
            // Repeated members: the last counts, as in the tree.
            r#"{"jsonrpc":"1.0","jsonrpc":"2.0","id":1,"id":2,"method":"a","method":"tools/call","params":{"a":1},"params":{"b":2}}"#,
            r#"{"jsonrpc":"2.0","jsonrpc":"1.0","method":"x","method":5}"#,
            // Escapes in keys and in values.
            r#"{"\u006asonrpc":"2.\u0030","\u0069d":"\u00e9\"","method":"tools\/call","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"t\u00f6ols/call"}"#,
            // Unknown members of every kind, skipped.
            r#"{"extra":{"deep":[[[{"x":"y"}]]]},"jsonrpc":"2.0","n":-1e300,"id":1,"method":"ping","s":"\ud83d\ude00"}"#,
            "  {}  \n",
            "{\"params\":null}",
            // Numbers at the edges of what a tree holds.
            r#"{"id":-0,"method":"ping"}"#,
            r#"{"id":18446744073709551616,"x":-9223372036854775809,"method":"ping"}"#,
            r#"{"id":1.7976931348623157e308,"x":5e-324,"method":"ping"}"#,
        ];
        for body in bodies {
            let want = oracle(body).unwrap_or_else(|| panic!("the oracle reads {body}"));
            assert_eq!(read(body), Some(want), "{body}");
        }
    }

    #[test]
    fn a_method_without_escapes_is_borrowed_from_the_body() {
        let Parsed::Message(m) = parse(br#"{"method":"tools/call"}"#).unwrap() else {
            panic!()
        };
        assert!(matches!(m.method, Some(Text::Str(Cow::Borrowed("tools/call")))));
        assert_eq!(m.method_str(), Some("tools/call"));
        let Parsed::Message(m) = parse(br#"{"method":"tools\/call"}"#).unwrap() else {
            panic!()
        };
        assert_eq!(m.method_str(), Some("tools/call"));
        let Parsed::Message(m) = parse(br#"{"method":1}"#).unwrap() else {
            panic!()
        };
        assert_eq!(m.method_str(), None);
        assert_eq!(m.method, Some(Text::NotString));
    }

    #[test]
    fn batches_and_scalars_are_told_apart() {
        let Parsed::Batch(items) = parse(br#"[{"method":"tools/call","id":1},2,"x"]"#).unwrap() else {
            panic!("an array is a batch")
        };
        assert_eq!(
            items,
            vec![json!({"method": "tools/call", "id": 1}), json!(2), json!("x")]
        );
        assert!(matches!(parse(b"[]").unwrap(), Parsed::Batch(v) if v.is_empty()));
        for scalar in ["1", "-2", "1.5", "\"x\"", "true", "null"] {
            assert!(matches!(parse(scalar.as_bytes()).unwrap(), Parsed::Scalar), "{scalar}");
        }
    }

    #[test]
    fn what_the_tree_refuses_is_refused_with_the_same_message() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let deep_params = format!(r#"{{"params":{}{}}}"#, "[".repeat(200), "]".repeat(200));
        let deep_other = format!(r#"{{"x":{}{}}}"#, "[".repeat(200), "]".repeat(200));
        let deep_method = format!(r#"{{"method":{}1{}}}"#, "{\"a\":".repeat(200), "}".repeat(200));
        for body in [
            "",
            "{",
            "{\"id\":1,}",
            "{\"id\":1} x",
            "{\"id\":01}",
            "{\"method\":\"\\x\"}",
            "{\"a\":\"\u{1}\"}",
            "nul",
            "{\"id\":1}{}",
            deep.as_str(),
            deep_params.as_str(),
            "{\"method\":\"\\ud800\"}",
            // In members the endpoint does not read, too.
            "{\"x\":\"\\ud800\"}",
            "{\"result\":[\"\\udc00\"]}",
            "{\"x\":{\"y\":\"\\q\"}}",
            "{\"method\":{\"y\":\"\u{1}\"}}",
            deep_other.as_str(),
            deep_method.as_str(),
            // Numbers a tree cannot hold, read or skipped (serde's IgnoredAny skips `1e400`).
            "{\"id\":1e400}",
            "{\"x\":1e400}",
            "{\"x\":[-1e400]}",
            "{\"x\":1.}",
            "{\"x\":-}",
            // A byte-order mark, and a bad escape in a nested member's name.
            "\u{feff}{}",
            "{\"x\":{\"\\ud800\":1}}",
            "{\"x\":{\"\\u12\":1}}",
        ] {
            let tree = serde_json::from_str::<Value>(body).expect_err(body).to_string();
            let ours = parse(body.as_bytes())
                .err()
                .unwrap_or_else(|| panic!("{body} is refused"))
                .to_string();
            assert_eq!(ours, tree, "{body}");
        }
        // serde_json's nesting limit is 128 in every member, read or skipped, as in the tree.
        for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
            for depth in [126, 127, 128, 129] {
                let nested = format!("{}1{}", open.repeat(depth), close.repeat(depth));
                for (body, levels) in [
                    (nested.clone(), depth),
                    (format!(r#"{{"params":{nested}}}"#), depth + 1),
                    (format!(r#"{{"method":{nested}}}"#), depth + 1),
                    (format!(r#"{{"x":{nested}}}"#), depth + 1),
                    (format!(r#"{{"result":{nested}}}"#), depth + 1),
                ] {
                    let tree = serde_json::from_str::<Value>(&body).map_err(|e| e.to_string());
                    // The cases straddle the limit: 127 levels are read, 128 are not.
                    assert_eq!(tree.is_ok(), levels <= 127, "{levels} levels: {body:.40}");
                    let ours = parse(body.as_bytes()).map(|_| ()).map_err(|e| e.to_string());
                    assert_eq!(ours, tree.map(|_| ()), "{depth} levels of {open}: {body:.40}");
                }
            }
        }
        // Invalid UTF-8 in a string, read or skipped.
        for body in [
            &b"{\"method\":\"\xff\"}"[..],
            b"{\"x\":\"\xc3\"}",
            b"{\"id\":\"\xed\xa0\x80\"}",
        ] {
            let tree = serde_json::from_slice::<Value>(body)
                .expect_err("invalid UTF-8")
                .to_string();
            let ours = parse(body).err().expect("invalid UTF-8 is refused").to_string();
            assert_eq!(ours, tree);
        }
    }
}
