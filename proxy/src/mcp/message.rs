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

mod reading;
#[doc(hidden)]
pub use reading::{reading, tree_reading};

#[cfg(test)]
mod tests;
