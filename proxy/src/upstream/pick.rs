//! `response.pick` compiled for the hot path. Pointers without a `*` (most allowlists name
//! plain members: `/id`, `/customer/name`) are merged into one tree, and a response body is
//! read straight into the members the tree keeps: the members a tool drops are skipped as
//! they are parsed, never built as values, hashed into a map, copied out and freed. They are
//! still checked to be well-formed JSON text (syntax, UTF-8, no control characters in strings);
//! only what no value can hold (nesting deeper than 128, a number beyond a double, an unpaired
//! surrogate escape such as `\udc00`) no longer fails a call when it is in a member the tool
//! drops.
//! Pointers with a `*` keep the general path: parse the body, then copy pointer by pointer
//! ([`super::shape::pick`]).
//!
//! The tree picks exactly what the pointers do one by one (`pick_value` is the reference, and
//! the tests check both against [`super::shape::pick`]): a member is kept under its own name,
//! in the order the pointers first name it; a pointer through an array picks an element by
//! its index (kept under the index as an object key); a member a pointer goes through that
//! holds neither an object nor an array is kept as `{}`; a member one pointer keeps whole is
//! kept whole whatever a longer pointer adds.

use std::fmt;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use toolgate_config::pointer::Pointer;

/// A compiled `response.pick`.
#[derive(Debug, Default)]
pub enum Pick {
    /// No allowlist: the whole body is the data.
    #[default]
    All,
    /// Member paths without `*`, merged.
    Tree(Members),
    /// Pointers with a `*`: picked one by one from the parsed body.
    Pointers(Vec<Pointer>),
}

/// The members kept at one level, in the order the pointers first name them.
pub type Members = Box<[(Box<str>, Node)]>;

/// What is kept of one member.
#[derive(Debug)]
pub enum Node {
    /// The whole value.
    All,
    /// Only these of its members (or elements, by index).
    Some(Members),
}

impl Pick {
    /// Compiles `pointers` (an empty list keeps everything).
    pub fn new(pointers: Vec<Pointer>) -> Self {
        if pointers.is_empty() {
            return Self::All;
        }
        if pointers.iter().any(|p| p.tokens.iter().any(Option::is_none)) {
            return Self::Pointers(pointers);
        }
        let mut root = Building::Some(Vec::new());
        for p in &pointers {
            root.add(&p.tokens);
        }
        match root.finish() {
            // A `""` pointer (the whole document) keeps everything.
            Node::All => Self::All,
            Node::Some(members) => Self::Tree(members),
        }
    }
}

/// A tree while pointers are added.
enum Building {
    All,
    Some(Vec<(Box<str>, Building)>),
}

impl Building {
    fn add(&mut self, tokens: &[Option<String>]) {
        let Self::Some(members) = self else { return };
        let Some((first, rest)) = tokens.split_first() else {
            *self = Self::All;
            return;
        };
        let key = first.as_deref().unwrap_or_default();
        let i = match members.iter().position(|(k, _)| &**k == key) {
            Some(i) => i,
            None => {
                members.push((key.into(), Self::Some(Vec::new())));
                members.len() - 1
            }
        };
        members[i].1.add(rest);
    }

    fn finish(self) -> Node {
        match self {
            Self::All => Node::All,
            Self::Some(members) => Node::Some(members.into_iter().map(|(k, b)| (k, b.finish())).collect()),
        }
    }
}

/// What `members` keep of `src`, an already parsed value.
pub fn pick_value(src: &Value, members: &[(Box<str>, Node)]) -> Value {
    let keep = |v: &Value, node: &Node| match node {
        Node::All => v.clone(),
        Node::Some(sub) => pick_value(v, sub),
    };
    let mut out = Map::new();
    match src {
        Value::Object(m) => {
            for (k, node) in members {
                if let Some(v) = m.get(&**k) {
                    out.insert(String::from(&**k), keep(v, node));
                }
            }
        }
        Value::Array(items) => {
            for (k, node) in members {
                if let Some(v) = k.parse::<usize>().ok().and_then(|i| items.get(i)) {
                    out.insert(String::from(&**k), keep(v, node));
                }
            }
        }
        _ => {}
    }
    Value::Object(out)
}

/// What `members` keep of the JSON object in `body`, read without building the rest; `None`
/// when `body` is not a JSON object (an array or a scalar at the top is wrapped before it is
/// picked, and invalid JSON is refused: the general path decides both).
pub fn read(body: &[u8], members: &[(Box<str>, Node)]) -> Option<Value> {
    // JSON text is UTF-8 (RFC 8259): checked whole, since skipping a member does not check it.
    let text = std::str::from_utf8(body).ok()?;
    let mut de = serde_json::Deserializer::from_str(text);
    let v = Level { members, top: true }.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(v)
}

/// One level of the tree, as a serde seed and visitor.
struct Level<'a> {
    members: &'a [(Box<str>, Node)],
    /// The body itself: only an object is read here.
    top: bool,
}

impl<'de> DeserializeSeed<'de> for Level<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl Level<'_> {
    /// A member that holds neither an object nor an array.
    fn scalar<E: serde::de::Error>(self) -> Result<Value, E> {
        if self.top {
            return Err(E::custom("not an object"));
        }
        Ok(Value::Object(Map::new()))
    }
}

impl<'de> Visitor<'de> for Level<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut kept: Vec<Option<Value>> = Vec::new();
        kept.resize_with(self.members.len(), || None);
        while let Some(i) = map.next_key_seed(KeyIndex(self.members))? {
            match i {
                // A repeated member: the last one counts, as when the body is parsed whole.
                Some(i) => {
                    kept[i] = Some(match &self.members[i].1 {
                        Node::All => map.next_value::<Value>()?,
                        Node::Some(sub) => map.next_value_seed(Level {
                            members: sub,
                            top: false,
                        })?,
                    });
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let mut out = Map::with_capacity(kept.iter().flatten().count());
        for ((k, _), v) in self.members.iter().zip(kept) {
            if let Some(v) = v {
                out.insert(String::from(&**k), v);
            }
        }
        Ok(Value::Object(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        if self.top {
            return Err(serde::de::Error::custom("not an object"));
        }
        // Elements picked by index: rare, so the array is read whole.
        let items = Vec::<Value>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))?;
        Ok(pick_value(&Value::Array(items), self.members))
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Value, E> {
        self.scalar()
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Value, E> {
        self.scalar()
    }

    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Value, E> {
        self.scalar()
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Value, E> {
        self.scalar()
    }

    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Value, E> {
        self.scalar()
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        self.scalar()
    }
}

/// A member name, read as the index of the kept member it names (`None`: not kept), without
/// allocating it.
struct KeyIndex<'a>(&'a [(Box<str>, Node)]);

impl<'de> DeserializeSeed<'de> for KeyIndex<'_> {
    type Value = Option<usize>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIndex<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|(k, _)| &**k == name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::shape::pick;
    use serde_json::json;

    fn tree(pointers: &[&str]) -> Pick {
        Pick::new(pointers.iter().map(|p| Pointer::parse(p).unwrap()).collect())
    }

    fn members(p: &Pick) -> &[(Box<str>, Node)] {
        match p {
            Pick::Tree(m) => m,
            other => panic!("not a tree: {other:?}"),
        }
    }

    #[test]
    fn plain_members_merge_into_a_tree_and_wildcards_keep_the_pointers() {
        assert!(matches!(tree(&[]), Pick::All));
        assert!(
            matches!(tree(&["/a", ""]), Pick::All),
            "the whole document keeps everything"
        );
        assert!(matches!(tree(&["/a", "/b/*/c"]), Pick::Pointers(p) if p.len() == 2));
        let t = tree(&["/a/x", "/b", "/a/y", "/a/x/deep", "/b/z"]);
        let m = members(&t);
        assert_eq!(m.iter().map(|(k, _)| &**k).collect::<Vec<_>>(), ["a", "b"]);
        match &m[0].1 {
            Node::Some(a) => {
                assert_eq!(a.iter().map(|(k, _)| &**k).collect::<Vec<_>>(), ["x", "y"]);
                assert!(a.iter().all(|(_, n)| matches!(n, Node::All)), "x is kept whole");
            }
            Node::All => panic!("only x and y of a"),
        }
        assert!(matches!(m[1].1, Node::All), "b is kept whole");
    }

    #[test]
    fn a_body_is_read_into_the_picked_members_in_pointer_order() {
        let body = br#"{"secret":"s","id":"1","nested":{"y":2,"x":{"deep":[1,{"k":null}]}},"list":[{"a":1},{"a":2,"b":3}],"id":"2"}"#;
        let t = tree(&["/nested/x", "/id", "/list/1/b", "/missing", "/id/not-an-object"]);
        assert_eq!(
            read(body, members(&t)),
            Some(json!({"nested": {"x": {"deep": [1, {"k": null}]}}, "id": "2", "list": {"1": {"b": 3}}})),
            "a repeated member counts once, the last time"
        );
        assert_eq!(
            read(br#"{"id":"1","nested":5}"#, members(&tree(&["/nested/x"]))),
            Some(json!({"nested": {}}))
        );
        for not_an_object in [
            &b"[1]"[..],
            b"3",
            b"\"s\"",
            b"null",
            b"{\"id\":1",
            b"{} {}",
            b"{\"id\":1,}",
        ] {
            assert_eq!(
                read(not_an_object, members(&t)),
                None,
                "{}",
                String::from_utf8_lossy(not_an_object)
            );
        }
        assert_eq!(read(b"{\"x\":\"\xff\",\"id\":1}", members(&t)), None, "not UTF-8");
        assert_eq!(
            read(b"{\"x\":\"a\nb\",\"id\":1}", members(&t)),
            None,
            "a raw control character"
        );
        assert_eq!(
            read(br#"{"x":"\udc00","deep":[[[1e400]]],"id":1}"#, members(&t)),
            Some(json!({"id": 1})),
            "what no value can hold, in a dropped member, is not built and so not refused"
        );
        // Escaped member names are compared unescaped, as pointers are.
        assert_eq!(
            read(br#"{"a\/b":1,"\u00e9":2}"#, members(&tree(&["/a~1b", "/é"]))),
            Some(json!({"a/b": 1, "é": 2}))
        );
    }

    /// A small deterministic generator (no dependency for a test).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    const KEYS: [&str; 6] = ["a", "b", "0", "1", "01", "c"];

    fn value(r: &mut Rng, depth: u32) -> Value {
        match if depth == 0 { r.next(4) } else { r.next(7) } {
            0 => Value::Null,
            1 => json!(r.next(100)),
            2 => json!("s"),
            3 => json!(true),
            4 | 5 => Value::Object(
                (0..r.next(4))
                    .map(|_| (KEYS[r.next(6) as usize].to_string(), value(r, depth - 1)))
                    .collect(),
            ),
            _ => Value::Array((0..r.next(4)).map(|_| value(r, depth - 1)).collect()),
        }
    }

    #[test]
    fn the_tree_picks_what_the_pointers_pick_one_by_one() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..20_000 {
            let Value::Object(doc) = value(&mut r, 4) else { continue };
            let mut text = Value::Object(doc).to_string();
            if text.len() > 2 && r.next(3) == 0 {
                // A member repeated in the text (the first one again): the last one counts.
                let first = serde_json::from_str::<Map<String, Value>>(&text)
                    .unwrap()
                    .keys()
                    .next()
                    .unwrap()
                    .clone();
                text = format!("{{{}:{},{}", Value::from(first), value(&mut r, 2), &text[1..]);
            }
            let doc: Value = serde_json::from_str(&text).unwrap();
            let pointers: Vec<String> = (0..1 + r.next(4))
                .map(|_| {
                    (0..1 + r.next(3))
                        .map(|_| format!("/{}", KEYS[r.next(6) as usize]))
                        .collect()
                })
                .collect();
            let parsed: Vec<Pointer> = pointers.iter().map(|p| Pointer::parse(p).unwrap()).collect();
            let by_pointer = pick(&doc, &parsed);
            let Pick::Tree(m) = Pick::new(parsed) else {
                panic!("plain pointers make a tree")
            };
            assert_eq!(pick_value(&doc, &m), by_pointer, "case {case}: {pointers:?} of {doc}");
            assert_eq!(
                read(text.as_bytes(), &m),
                Some(by_pointer),
                "case {case}: {pointers:?} of {text}"
            );
        }
    }
}
