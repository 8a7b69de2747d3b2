//! A request body read as one JSON-RPC message in a single pass: the members the endpoint acts
//! on (`jsonrpc`, `id`, `method`, `params`, whether it is a response), with `method` borrowed from
//! the body and every other member skipped unbuilt. Only `params` becomes a JSON tree, because
//! the methods read it. Reading the message itself into a `serde_json::Value` built a map of it
//! (its keys hashed and allocated, `"2.0"` and the method copied) only to look five members up
//! again.
//!
//! `params._meta` is read the same way, into [`RequestMeta`], and left out of the `params` tree:
//! on 2026-07-28 every request carries it, with 40-byte member names
//! (`io.modelcontextprotocol/clientCapabilities`) that the tree allocated and hashed, and with
//! values (the capabilities, the client's identity) that only the protocol ladder reads, once.
//! Building that tree was most of the 2026-07-28 path's cost over a 2025 call: reading `_meta`
//! this way took callgrind's 2026-07-28 call from 98-99 k to 94-95 k instructions.
//!
//! The answers are those of the tree: a repeated member counts its last value, as `Map::insert`
//! does; anything the tree refuses (bad grammar, invalid UTF-8, a lone surrogate, nesting past
//! serde_json's limit, in any member, read or skipped) is the same parse error, with serde_json's
//! message.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::modern::{META_CAPABILITIES, META_CLIENT_INFO, META_VERSION};

/// `$ty<'a>` is read by `deserialize_any` with `$visitor`, declared here (its `Visitor` impl is
/// written beside it).
macro_rules! read_with {
    ($ty:ident, $visitor:ident) => {
        impl<'de: 'a, 'a> Deserialize<'de> for $ty<'a> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any($visitor(std::marker::PhantomData))
            }
        }

        struct $visitor<'a>(std::marker::PhantomData<&'a ()>);
    };
}

/// A visitor's answer to every JSON scalar but a string: `$value`.
macro_rules! non_string_scalars {
    ($value:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

/// A visitor's answer to an array (read through and checked by [`Skip`]): `$value`.
macro_rules! skipped_seq {
    ($de:lifetime, $value:expr) => {
        fn visit_seq<A: SeqAccess<$de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            Skip::rest_of_seq(seq)?;
            Ok($value)
        }
    };
}

/// A visitor's answer to an object (read through and checked by [`Skip`]): `$value`.
macro_rules! skipped_map {
    ($de:lifetime, $value:expr) => {
        fn visit_map<A: MapAccess<$de>>(self, map: A) -> Result<Self::Value, A::Error> {
            Skip::rest_of_map(map)?;
            Ok($value)
        }
    };
}

/// What a request body holds.
// A `Parsed` lives on the stack of the request that read it, and is taken apart at once: boxing
// the message would cost an allocation a request to save a few hundred bytes of stack.
#[allow(clippy::large_enum_variant)]
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
    /// `params` as sent (`None` when absent), without its `_meta` member.
    pub params: Option<Value>,
    /// What `params._meta` says, when `params` is an object whose `_meta` is an object.
    pub meta: Option<RequestMeta<'a>>,
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

/// The members of a request's `params._meta` that the endpoint reads; the others are checked and
/// dropped. A repeated member counts its last value, as in a tree.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct RequestMeta<'a> {
    /// `io.modelcontextprotocol/protocolVersion`.
    pub version: Option<Text<'a>>,
    /// `io.modelcontextprotocol/clientCapabilities`: whether it is an object.
    pub capabilities: Option<bool>,
    /// `io.modelcontextprotocol/clientInfo`'s name and version (none of either unless it is an
    /// object).
    pub client_info: NameVersion<'a>,
    /// W3C `traceparent`.
    pub traceparent: Option<Text<'a>>,
    /// W3C `tracestate`.
    pub tracestate: Option<Text<'a>>,
}

/// An object's `name` and `version` members (`clientInfo`).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct NameVersion<'a> {
    pub name: Option<Text<'a>>,
    pub version: Option<Text<'a>>,
}

impl<'a> Text<'a> {
    /// The string, when it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Text::Str(s) => Some(s),
            Text::NotString => None,
        }
    }
}

impl Message<'_> {
    /// `method` when it is a string.
    pub fn method_str(&self) -> Option<&str> {
        self.method.as_ref().and_then(Text::as_str)
    }
}

read_with!(Parsed, ParsedVisitor);

impl<'de: 'a, 'a> Visitor<'de> for ParsedVisitor<'a> {
    type Value = Parsed<'a>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut m = Message::default();
        while let Some(Name(key)) = map.next_key()? {
            match key {
                Key::Jsonrpc => m.jsonrpc_2 = map.next_value::<Text>()? == Text::Str(Cow::Borrowed("2.0")),
                Key::Id => m.id = Some(map.next_value()?),
                Key::Method => m.method = Some(map.next_value()?),
                Key::Params => {
                    let Params { value, meta } = map.next_value()?;
                    m.params = Some(value);
                    m.meta = meta;
                }
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

    non_string_scalars!(Parsed::Scalar);

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Parsed::Scalar)
    }
}

/// The members of a message that are read.
enum Key {
    Jsonrpc,
    Id,
    Method,
    Params,
    /// `result` or `error`.
    Response,
    Other,
}

impl MemberName for Key {
    fn of(name: &str) -> Self {
        match name {
            "jsonrpc" => Key::Jsonrpc,
            "id" => Key::Id,
            "method" => Key::Method,
            "params" => Key::Params,
            "result" | "error" => Key::Response,
            _ => Key::Other,
        }
    }
}

/// The members an object's reader tells apart, by name.
trait MemberName: Sized {
    fn of(name: &str) -> Self;
}

/// A member's name, classified as `K` without copying it (serde's `Cow<str>` would always copy).
/// A name with escapes (`"\u0069d"`) is decoded by serde_json first and counts as what it spells.
struct Name<K>(K);

impl<'de, K: MemberName> Deserialize<'de> for Name<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NameVisitor(std::marker::PhantomData))
    }
}

struct NameVisitor<K>(std::marker::PhantomData<K>);

impl<K: MemberName> Visitor<'_> for NameVisitor<K> {
    type Value = Name<K>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member name")
    }

    // A borrowed or an owned name comes here too (serde's defaults forward both).
    fn visit_str<E: de::Error>(self, name: &str) -> Result<Self::Value, E> {
        Ok(Name(K::of(name)))
    }
}

read_with!(Text, TextVisitor);

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

    non_string_scalars!(Text::NotString);
    skipped_map!('de, Text::NotString);
    skipped_seq!('de, Text::NotString);
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

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Skip)
    }

    non_string_scalars!(Skip);
    skipped_map!('de, Skip);
    skipped_seq!('de, Skip);
}

/// `params`: the tree the methods read, except `_meta`, which is read into [`RequestMeta`].
struct Params<'a> {
    value: Value,
    meta: Option<RequestMeta<'a>>,
}

read_with!(Params, ParamsVisitor);

impl<'a> ParamsVisitor<'a> {
    fn tree(value: Value) -> Params<'a> {
        Params { value, meta: None }
    }
}

/// Anything but an object becomes the value serde_json's own tree would hold.
impl<'de: 'a, 'a> Visitor<'de> for ParamsVisitor<'a> {
    type Value = Params<'a>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Self::Value, E> {
        Ok(Self::tree(Value::Bool(b)))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
        Ok(Self::tree(Value::Number(n.into())))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
        Ok(Self::tree(Value::Number(n.into())))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
        Ok(Self::tree(Number::from_f64(n).map_or(Value::Null, Value::Number)))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Self::tree(Value::String(s.to_owned())))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
        Ok(Self::tree(Value::String(s)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Self::tree(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element()? {
            items.push(v);
        }
        Ok(Self::tree(Value::Array(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Map::new();
        let mut meta = None;
        while let Some(name) = map.next_key::<String>()? {
            if name == "_meta" {
                meta = map.next_value::<Meta>()?.0;
            } else {
                members.insert(name, map.next_value()?);
            }
        }
        Ok(Params {
            value: Value::Object(members),
            meta,
        })
    }
}

/// `params._meta`: a [`RequestMeta`] when it is an object; anything else is checked and dropped
/// (to the protocol ladder it is no `_meta` at all).
struct Meta<'a>(Option<RequestMeta<'a>>);

read_with!(Meta, MetaVisitor);

impl<'de: 'a, 'a> Visitor<'de> for MetaVisitor<'a> {
    type Value = Meta<'a>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    non_string_scalars!(Meta(None));
    skipped_seq!('de, Meta(None));

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Meta(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut m = RequestMeta::default();
        while let Some(Name(key)) = map.next_key()? {
            match key {
                MetaKey::Version => m.version = Some(map.next_value()?),
                MetaKey::Capabilities => m.capabilities = Some(map.next_value::<IsObject>()?.0),
                MetaKey::ClientInfo => m.client_info = map.next_value()?,
                MetaKey::Traceparent => m.traceparent = Some(map.next_value()?),
                MetaKey::Tracestate => m.tracestate = Some(map.next_value()?),
                MetaKey::Other => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(Meta(Some(m)))
    }
}

/// The `_meta` members [`RequestMeta`] keeps.
enum MetaKey {
    Version,
    Capabilities,
    ClientInfo,
    Traceparent,
    Tracestate,
    Other,
}

impl MemberName for MetaKey {
    fn of(name: &str) -> Self {
        match name {
            META_VERSION => Self::Version,
            META_CAPABILITIES => Self::Capabilities,
            META_CLIENT_INFO => Self::ClientInfo,
            "traceparent" => Self::Traceparent,
            "tracestate" => Self::Tracestate,
            _ => Self::Other,
        }
    }
}

/// `clientInfo`'s members that are read.
enum InfoKey {
    Name,
    Version,
    Other,
}

impl MemberName for InfoKey {
    fn of(name: &str) -> Self {
        match name {
            "name" => Self::Name,
            "version" => Self::Version,
            _ => Self::Other,
        }
    }
}

read_with!(NameVersion, NameVersionVisitor);

impl<'de: 'a, 'a> Visitor<'de> for NameVersionVisitor<'a> {
    type Value = NameVersion<'a>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    non_string_scalars!(NameVersion::default());
    skipped_seq!('de, NameVersion::default());

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(NameVersion::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut nv = NameVersion::default();
        while let Some(Name(key)) = map.next_key()? {
            match key {
                InfoKey::Name => nv.name = Some(map.next_value()?),
                InfoKey::Version => nv.version = Some(map.next_value()?),
                InfoKey::Other => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(nv)
    }
}

/// Whether a value is an object (read through and checked by [`Skip`] either way).
struct IsObject(bool);

impl<'de> Deserialize<'de> for IsObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(IsObjectVisitor)
    }
}

struct IsObjectVisitor;

impl<'de> Visitor<'de> for IsObjectVisitor {
    type Value = IsObject;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    non_string_scalars!(IsObject(false));
    skipped_seq!('de, IsObject(false));
    skipped_map!('de, IsObject(true));

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(IsObject(false))
    }
}

/// Reads `body` as one JSON value (trailing whitespace only), as `serde_json::from_slice` does.
pub(crate) fn parse(body: &[u8]) -> serde_json::Result<Parsed<'_>> {
    serde_json::from_slice(body)
}

/// What the endpoint reads of `body`, written out as a JSON value, or the parse error's message:
/// for the tests and the fuzzer, which compare it with [`tree_reading`], byte for byte.
#[doc(hidden)]
pub fn reading(body: &[u8]) -> Result<String, String> {
    let text = |t: &Option<Text>| t.as_ref().map(|t| t.as_str().map_or(Value::Bool(false), Value::from));
    let r = match parse(body).map_err(|e| e.to_string())? {
        Parsed::Scalar => Reading::Scalar,
        Parsed::Batch(items) => Reading::Batch(items),
        Parsed::Message(m) => Reading::Message(Box::new(MessageReading {
            jsonrpc_2: m.jsonrpc_2,
            id: m.id,
            method: text(&m.method),
            params: m.params,
            is_response: m.is_response,
            meta: m.meta.map(|meta| {
                [
                    ("version", text(&meta.version)),
                    ("capabilitiesAreAnObject", meta.capabilities.map(Value::Bool)),
                    ("clientName", text(&meta.client_info.name)),
                    ("clientVersion", text(&meta.client_info.version)),
                    ("traceparent", text(&meta.traceparent)),
                    ("tracestate", text(&meta.tracestate)),
                ]
            }),
        })),
    };
    Ok(r.written())
}

/// [`reading`] as the endpoint made it before it read messages itself: `body` parsed whole into
/// a `serde_json::Value`, the members looked up in it, `params._meta` taken out of `params`.
#[doc(hidden)]
pub fn tree_reading(body: &[u8]) -> Result<String, String> {
    let text = |v: Option<&Value>| v.map(|v| v.as_str().map_or(Value::Bool(false), Value::from));
    let r = match serde_json::from_slice::<Value>(body).map_err(|e| e.to_string())? {
        Value::Array(items) => Reading::Batch(items),
        Value::Object(m) => {
            let mut params = m.get("params").cloned();
            let meta = params
                .as_mut()
                .and_then(Value::as_object_mut)
                .and_then(|p| p.shift_remove("_meta"));
            let meta = meta.as_ref().and_then(Value::as_object).map(|meta| {
                let info = |k: &str| {
                    text(
                        meta.get(META_CLIENT_INFO)
                            .and_then(Value::as_object)
                            .and_then(|i| i.get(k)),
                    )
                };
                [
                    ("version", text(meta.get(META_VERSION))),
                    (
                        "capabilitiesAreAnObject",
                        meta.get(META_CAPABILITIES).map(|c| Value::Bool(c.is_object())),
                    ),
                    ("clientName", info("name")),
                    ("clientVersion", info("version")),
                    ("traceparent", text(meta.get("traceparent"))),
                    ("tracestate", text(meta.get("tracestate"))),
                ]
            });
            Reading::Message(Box::new(MessageReading {
                jsonrpc_2: m.get("jsonrpc").and_then(Value::as_str) == Some("2.0"),
                id: m.get("id").cloned(),
                method: text(m.get("method")),
                params,
                is_response: m.contains_key("result") || m.contains_key("error"),
                meta,
            }))
        }
        _ => Reading::Scalar,
    };
    Ok(r.written())
}

/// What [`reading`] and [`tree_reading`] write out: a scalar as `"scalar"`, a batch as
/// `{"batch": [...]}`, a message's members as an object. A member that should be a string is
/// `false` when it is not one; one that is absent is left out.
enum Reading {
    Scalar,
    Batch(Vec<Value>),
    Message(Box<MessageReading>),
}

struct MessageReading {
    jsonrpc_2: bool,
    id: Option<Value>,
    method: Option<Value>,
    params: Option<Value>,
    is_response: bool,
    meta: Option<[(&'static str, Option<Value>); 6]>,
}

impl Reading {
    fn written(self) -> String {
        let present = |members: Vec<(&str, Option<Value>)>| {
            Value::Object(
                members
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.to_string(), v?)))
                    .collect(),
            )
        };
        let v = match self {
            Reading::Scalar => Value::from("scalar"),
            Reading::Batch(items) => present(vec![("batch", Some(Value::Array(items)))]),
            Reading::Message(m) => present(vec![
                ("jsonrpc2", Some(Value::Bool(m.jsonrpc_2))),
                ("id", m.id),
                ("method", m.method),
                ("params", m.params),
                ("isResponse", Some(Value::Bool(m.is_response))),
                ("meta", m.meta.map(|meta| present(meta.into()))),
            ]),
        };
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
            // `params` of every kind, read as the tree reads them.
            r#"{"params":-5}"#,
            r#"{"params":18446744073709551615}"#,
            r#"{"params":-1.5e-7}"#,
            r#"{"params":"\u00e9x"}"#,
            r#"{"params":true}"#,
            r#"{"params":[{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}},null,[]]}"#,
            r#"{"params":{"a":{"b":[1,-2,3.5,"x",null,true,{}]},"a":7}}"#,
            // `_meta` as a 2026-07-28 client sends it, unknown members and all.
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"sampling":{},"roots":{"listChanged":true}},"io.modelcontextprotocol/clientInfo":{"name":"c","version":"1.0","title":["t"]},"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"a=b","progressToken":5,"x":{"y":[1e300]}},"arguments":{"_meta":{"kept":"in the arguments"}}}}"#,
            r#"{"params":{"_meta":{}}}"#,
            // `_meta` that is not an object is no `_meta`.
            r#"{"params":{"_meta":"x","a":1}}"#,
            r#"{"params":{"_meta":null}}"#,
            r#"{"params":{"_meta":[{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}]}}"#,
            r#"{"params":{"_meta":5,"_meta":-1.5,"_meta":true}}"#,
            // A repeated `_meta`, or a repeated member in it: the last counts.
            r#"{"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"},"_meta":"x"}}"#,
            r#"{"params":{"_meta":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            r#"{"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"a"},"b":1,"_meta":{"traceparent":"t"}}}"#,
            r#"{"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"a","io.modelcontextprotocol/protocolVersion":"b","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientCapabilities":1}}}"#,
            r#"{"params":{"_meta":{"io.modelcontextprotocol/clientInfo":{"name":"a","name":"b","version":1},"io.modelcontextprotocol/clientInfo":{"version":"2"}}}}"#,
            r#"{"params":{"_meta":{"io.modelcontextprotocol/clientInfo":{"name":"a"},"io.modelcontextprotocol/clientInfo":"c"}}}"#,
            // Members of the wrong kind.
            r#"{"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":5,"io.modelcontextprotocol/clientCapabilities":"x","io.modelcontextprotocol/clientInfo":[{"name":"c"}],"traceparent":{},"tracestate":null}}}"#,
            r#"{"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":null,"io.modelcontextprotocol/clientCapabilities":[],"io.modelcontextprotocol/clientInfo":{"name":{"a":1},"version":[]}}}}"#,
            r#"{"params":{"_meta":{"io.modelcontextprotocol/clientCapabilities":null,"io.modelcontextprotocol/clientInfo":7}}}"#,
            // Escapes in the names.
            r#"{"params":{"\u005fmeta":{"io.modelcontextprotocol\/protocolVersion":"2026-07-\u0032\u0038","io.modelcontextprotocol/clientInfo":{"n\u0061me":"\u00e9"}}}}"#,
        ];
        for body in bodies {
            let want = tree_reading(body.as_bytes()).unwrap_or_else(|e| panic!("{body}: {e}"));
            assert_eq!(reading(body.as_bytes()), Ok(want), "{body}");
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
            // In `_meta`, read or skipped.
            "{\"params\":{\"_meta\":{\"x\":\"\\ud800\"}}}",
            "{\"params\":{\"_meta\":{\"traceparent\":\"\\udc00\"}}}",
            "{\"params\":{\"_meta\":{\"io.modelcontextprotocol/clientInfo\":{\"name\":\"\\q\"}}}}",
            "{\"params\":{\"_meta\":{\"io.modelcontextprotocol/clientInfo\":{\"x\":[1e400]}}}}",
            "{\"params\":{\"_meta\":{\"io.modelcontextprotocol/clientCapabilities\":{\"a\":1e400}}}}",
            "{\"params\":{\"_meta\":1e400}}",
            "{\"params\":{\"_meta\":[\"\u{1}\"]}}",
            "{\"params\":{\"_meta\":{\"\\ud800\":1}}}",
            "{\"params\":{\"_meta\":{},}}",
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
                    (format!(r#"{{"params":{{"_meta":{nested}}}}}"#), depth + 2),
                    (format!(r#"{{"params":{{"_meta":{{"x":{nested}}}}}}}"#), depth + 3),
                    (
                        format!(r#"{{"params":{{"_meta":{{"{META_CAPABILITIES}":{nested}}}}}}}"#),
                        depth + 3,
                    ),
                    (
                        format!(r#"{{"params":{{"_meta":{{"{META_CLIENT_INFO}":{nested}}}}}}}"#),
                        depth + 3,
                    ),
                    (
                        format!(r#"{{"params":{{"_meta":{{"{META_CLIENT_INFO}":{{"name":{nested}}}}}}}}}"#),
                        depth + 4,
                    ),
                ] {
                    let tree = tree_reading(body.as_bytes());
                    // The cases straddle the limit: 127 levels are read, 128 are not.
                    assert_eq!(tree.is_ok(), levels <= 127, "{levels} levels: {body:.40}");
                    assert_eq!(reading(body.as_bytes()), tree, "{depth} levels of {open}: {body:.40}");
                }
            }
        }
        // Invalid UTF-8 in a string, read or skipped.
        for body in [
            &b"{\"method\":\"\xff\"}"[..],
            b"{\"x\":\"\xc3\"}",
            b"{\"id\":\"\xed\xa0\x80\"}",
            b"{\"params\":{\"_meta\":{\"traceparent\":\"\xff\"}}}",
            b"{\"params\":{\"_meta\":{\"x\":\"\xc3\"}}}",
        ] {
            let tree = serde_json::from_slice::<Value>(body)
                .expect_err("invalid UTF-8")
                .to_string();
            let ours = parse(body).err().expect("invalid UTF-8 is refused").to_string();
            assert_eq!(ours, tree);
        }
    }
}
