//! YAML text → JSON value, composed straight from the event stream of `granit-parser` (the
//! maintained, pure-Rust YAML 1.2 parser that serde-saphyr is built on).
//!
//! A config only ever needs a `serde_json::Value`. Going through serde-saphyr's deserializer
//! to get one cost twice the parse itself (a 1,000-tool config: 125 ms against 50 ms for the
//! events), since every event passes through Serde's visitors, key buffering for duplicate
//! detection, budget accounting and redaction scopes. Composing the value here keeps the parser
//! (the part the field has solved) and adds only the small, fixed YAML 1.2 core schema:
//!
//! - plain scalars resolve by the core schema's rules: `null`/`~`/empty, `true`/`false` (in the
//!   three spellings), base-10, `0o`, `0x` (and `0b`) integers, floats; anything else is a string.
//!   Quoted and block scalars are strings. As `serde_yaml` read configs, `yes`/`on`, `0755` and
//!   `1_000` stay strings (an `enum: [yes, no]` must not turn into booleans);
//! - the core tags `!!str`, `!!int`, `!!float`, `!!bool`, `!!null` (and `!` for a string) force a
//!   type; other tags are ignored;
//! - mapping keys become strings (`404:` and `"404":` are the same key); a duplicate key, a
//!   null key or a collection as a key is an error; `<<` is an ordinary key;
//! - aliases copy their anchor's value. The copies, and the copy each anchor keeps of its node,
//!   count against [`MAX_NODES`] and their scalar text against [`MAX_COPIED_BYTES`], which bound
//!   an alias bomb of many small nodes or of one long string; nesting past [`MAX_DEPTH`] is
//!   refused, through aliases too;
//! - `.inf`, `.nan` and literals that overflow to infinity are refused (JSON has no such numbers);
//! - a file holds one document.

use std::collections::HashMap;

use granit_parser::{Event, Marker, Parser, ScalarStyle, Tag};
use serde_json::{map::Entry, Map, Number, Value};

/// Deepest nesting of sequences and mappings (the limit serde-saphyr applied by default).
pub const MAX_DEPTH: usize = 64;

/// Most nodes (scalars, sequences, mappings) in a document, alias copies included: a 1,000-tool
/// config has about 40,000, and the cap keeps a document of aliases of aliases from growing to
/// gigabytes.
pub const MAX_NODES: usize = 1_000_000;

/// Most scalar text (keys included) that aliases copy and anchors keep, on top of the document's
/// own text: a long string aliased many times cannot grow past it.
pub const MAX_COPIED_BYTES: usize = 64 * 1024 * 1024;

/// Parses one YAML document into a JSON value; an empty document is `null`. The error names the
/// line and column.
pub fn to_value(text: &str) -> Result<Value, String> {
    let mut c = Composer::default();
    for item in Parser::new_from_str(text) {
        let (event, span) = item.map_err(|e| e.to_string())?;
        c.event(event, span.start)?;
    }
    Ok(c.root.unwrap_or(Value::Null))
}

/// An open sequence or mapping.
struct Frame {
    items: Items,
    /// The anchor it defines (0: none).
    anchor: usize,
    /// The size counts before it opened (to size the anchor).
    start: Size,
    /// Levels of collections under it (0 until one is added).
    below: usize,
    /// Where it begins.
    at: Marker,
}

enum Items {
    Seq(Vec<Value>),
    /// The entries, and the key waiting for its value with where that key was written.
    Map(Map<String, Value>, Option<(String, Marker)>),
}

/// What a node costs: nodes and scalar bytes composed so far, or held by one anchored node.
#[derive(Clone, Copy, Default)]
struct Size {
    nodes: usize,
    bytes: usize,
}

/// An anchored node: its value, its size and its levels of collections (a scalar has none).
struct Anchor {
    value: Value,
    size: Size,
    levels: usize,
}

#[derive(Default)]
struct Composer {
    stack: Vec<Frame>,
    anchors: HashMap<usize, Anchor>,
    /// The document's nodes composed so far, alias copies included.
    total: Size,
    /// The nodes the anchors' own copies hold.
    kept: usize,
    /// The scalar bytes that aliases copied and anchors keep.
    copied: usize,
    documents: usize,
    root: Option<Value>,
}

fn at(m: Marker, what: impl std::fmt::Display) -> String {
    format!("{what} at line {} column {}", m.line(), m.col() + 1)
}

impl Composer {
    fn event(&mut self, event: Event<'_>, m: Marker) -> Result<(), String> {
        match event {
            Event::DocumentStart(..) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(at(m, "a second YAML document (`---`): a config file holds one"));
                }
            }
            Event::Scalar(text, style, anchor, tag) => {
                let start = self.total;
                self.count(
                    Size {
                        nodes: 1,
                        bytes: text.len(),
                    },
                    m,
                )?;
                let value = scalar(&text, style, tag.as_deref()).map_err(|e| at(m, e))?;
                self.define(anchor, &value, start, 0, m)?;
                self.add(value, 0, m)?;
            }
            Event::SequenceStart(_, anchor, _) => self.open(Items::Seq(Vec::new()), anchor, m)?,
            Event::MappingStart(_, anchor, _) => self.open(Items::Map(Map::new(), None), anchor, m)?,
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(frame) = self.stack.pop() else {
                    return Err(at(m, "a collection ends that never began"));
                };
                let value = match frame.items {
                    Items::Seq(items) => Value::Array(items),
                    Items::Map(map, None) => Value::Object(map),
                    Items::Map(_, Some((key, km))) => return Err(at(km, format!("key `{key}` has no value"))),
                };
                let levels = frame.below + 1;
                self.define(frame.anchor, &value, frame.start, levels, m)?;
                self.add(value, levels, frame.at)?;
            }
            Event::Alias(id) => {
                let Some(anchor) = self.anchors.get(&id) else {
                    return Err(at(
                        m,
                        "an alias to an anchor not defined before it (or to a node that contains it)",
                    ));
                };
                let (size, levels) = (anchor.size, anchor.levels);
                // Everything is checked before the value is copied.
                if self.stack.len() + levels > MAX_DEPTH {
                    return Err(at(
                        m,
                        format!("nested more than {MAX_DEPTH} levels deep (through an alias)"),
                    ));
                }
                self.copy(size, true, m)?;
                let value = self.anchors[&id].value.clone();
                self.add(value, levels, m)?;
            }
            // Stream and document boundaries, and presentation metadata.
            _ => {}
        }
        Ok(())
    }

    fn count(&mut self, n: Size, m: Marker) -> Result<(), String> {
        self.total.nodes = self.total.nodes.saturating_add(n.nodes);
        self.total.bytes = self.total.bytes.saturating_add(n.bytes);
        if self.total.nodes.saturating_add(self.kept) > MAX_NODES {
            return Err(at(m, format!("more than {MAX_NODES} nodes (aliases count each copy)")));
        }
        Ok(())
    }

    /// Counts a copy of `n`: an alias's (`into_document`), or the one an anchor keeps.
    fn copy(&mut self, n: Size, into_document: bool, m: Marker) -> Result<(), String> {
        if into_document {
            self.count(n, m)?;
        } else {
            self.kept = self.kept.saturating_add(n.nodes);
            self.count(Size::default(), m)?;
        }
        self.copied = self.copied.saturating_add(n.bytes);
        if self.copied > MAX_COPIED_BYTES {
            return Err(at(
                m,
                format!(
                    "aliases copy more than {} MiB of text",
                    MAX_COPIED_BYTES / (1024 * 1024)
                ),
            ));
        }
        Ok(())
    }

    fn open(&mut self, items: Items, anchor: usize, m: Marker) -> Result<(), String> {
        let start = self.total;
        self.count(Size { nodes: 1, bytes: 0 }, m)?;
        if self.stack.len() >= MAX_DEPTH {
            return Err(at(m, format!("nested more than {MAX_DEPTH} levels deep")));
        }
        self.stack.push(Frame {
            items,
            anchor,
            start,
            below: 0,
            at: m,
        });
        Ok(())
    }

    /// Records the value of an anchored node (counted since `start`, `levels` of collections):
    /// the copy it keeps counts like an alias's.
    fn define(&mut self, anchor: usize, value: &Value, start: Size, levels: usize, m: Marker) -> Result<(), String> {
        if anchor != 0 {
            let size = Size {
                nodes: self.total.nodes - start.nodes,
                bytes: self.total.bytes - start.bytes,
            };
            self.copy(size, false, m)?;
            self.anchors.insert(
                anchor,
                Anchor {
                    value: value.clone(),
                    size,
                    levels,
                },
            );
        }
        Ok(())
    }

    /// Places a finished node of `levels` collections: the document's root, a sequence item, a
    /// key or a key's value.
    fn add(&mut self, value: Value, levels: usize, m: Marker) -> Result<(), String> {
        let Some(frame) = self.stack.last_mut() else {
            self.root = Some(value);
            return Ok(());
        };
        frame.below = frame.below.max(levels);
        match &mut frame.items {
            Items::Seq(items) => items.push(value),
            Items::Map(map, pending) => match pending.take() {
                None => *pending = Some((key(value).map_err(|e| at(m, e))?, m)),
                Some((k, km)) => match map.entry(k) {
                    Entry::Vacant(e) => {
                        e.insert(value);
                    }
                    Entry::Occupied(e) => return Err(at(km, format!("duplicate mapping key `{}`", e.key()))),
                },
            },
        }
        Ok(())
    }
}

/// A mapping key as a string: `404:`, `'404':` and `"404":` are the same key.
fn key(value: Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Null => Err("mapping keys must be strings, found null".into()),
        Value::Array(_) => Err("mapping keys must be strings, found a sequence".into()),
        Value::Object(_) => Err("mapping keys must be strings, found a mapping".into()),
    }
}

/// A scalar's value by its tag and style: the core schema for untagged plain scalars.
fn scalar(text: &str, style: ScalarStyle, tag: Option<&Tag>) -> Result<Value, String> {
    let string = || Ok(Value::String(text.to_string()));
    let Some(tag) = tag else {
        return if style == ScalarStyle::Plain {
            Ok(plain(text)?)
        } else {
            string()
        };
    };
    let wrong = |ty: &str| format!("`{text}` is not {ty}, as its tag `{}` says", tag.original());
    match tag.core_suffix() {
        Some("str") => string(),
        Some("null") => Ok(Value::Null),
        Some("bool") => boolean(text).map(Value::Bool).ok_or_else(|| wrong("a boolean")),
        Some("int") => match integer(text) {
            Some(Int::Number(n)) => Ok(Value::Number(n)),
            _ => Err(wrong("an integer")),
        },
        Some("float") => match integer(text) {
            Some(Int::Number(n)) => n
                .as_f64()
                .and_then(Number::from_f64)
                .map(Value::Number)
                .ok_or_else(|| wrong("a number")),
            _ => float(text)?.map(Value::Number).ok_or_else(|| wrong("a number")),
        },
        // `!` is the non-specific tag of a string; other tags carry no meaning for a config.
        _ if tag.handle().is_empty() && tag.suffix() == "!" => string(),
        _ if style == ScalarStyle::Plain => plain(text),
        _ => string(),
    }
}

/// An untagged plain scalar by the YAML 1.2 core schema.
fn plain(text: &str) -> Result<Value, String> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Ok(Value::Null),
        _ => {}
    }
    if let Some(b) = boolean(text) {
        return Ok(Value::Bool(b));
    }
    match integer(text) {
        Some(Int::Number(n)) => return Ok(Value::Number(n)),
        Some(Int::KeptAsText) => return Ok(Value::String(text.to_string())),
        Some(Int::TooLarge) | None => {}
    }
    Ok(float(text)?.map_or_else(|| Value::String(text.to_string()), Value::Number))
}

fn boolean(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

enum Int {
    Number(Number),
    /// `0755`: an octal mode in YAML 1.1, a decimal in 1.2; kept as the text the author wrote.
    KeptAsText,
    /// Beyond 64 bits: read as a float, as serde-saphyr did.
    TooLarge,
}

fn is_digits(s: &str, radix: u32) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_digit(radix))
}

/// `[-+]?[0-9]+`, `0o[0-7]+`, `0x[0-9a-fA-F]+` or `0b[01]+` (not in the core schema, but
/// both readers before this one took it).
fn integer(text: &str) -> Option<Int> {
    for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(digits) = text.strip_prefix(prefix) {
            return is_digits(digits, radix)
                .then(|| u64::from_str_radix(digits, radix).map_or(Int::TooLarge, |n| Int::Number(n.into())));
        }
    }
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !is_digits(unsigned, 10) {
        return None;
    }
    if unsigned.len() > 1 && unsigned.starts_with('0') {
        return Some(Int::KeptAsText);
    }
    let n = if text.starts_with('-') {
        text.parse::<i64>().ok().map(Number::from)
    } else {
        unsigned.parse::<u64>().ok().map(Number::from)
    };
    Some(n.map_or(Int::TooLarge, Int::Number))
}

/// `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`; `.inf` and `.nan` (and a literal
/// that overflows to infinity) are errors, since JSON cannot hold them.
fn float(text: &str) -> Result<Option<Number>, String> {
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") || matches!(text, ".nan" | ".NaN" | ".NAN") {
        return Err(format!("numbers must be finite, found `{text}`"));
    }
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (unsigned, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => is_digits(frac, 10),
        Some((int, frac)) => is_digits(int, 10) && (frac.is_empty() || is_digits(frac, 10)),
        None => is_digits(mantissa, 10),
    };
    let exponent_ok = exponent.is_none_or(|e| is_digits(e.strip_prefix(['-', '+']).unwrap_or(e), 10));
    if !(mantissa_ok && exponent_ok) {
        return Ok(None);
    }
    let v: f64 = text.parse().map_err(|e| format!("`{text}`: {e}"))?;
    Number::from_f64(v)
        .map(Some)
        .ok_or_else(|| format!("numbers must be finite, found `{text}`"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(text: &str) -> Value {
        to_value(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn err(text: &str) -> String {
        to_value(text).expect_err(text)
    }

    #[test]
    fn plain_scalars_resolve_by_the_core_schema() {
        let doc = ok(
            "[~, null, Null, NULL, true, True, FALSE, yes, on, 0, -0, +7, 12, -3, 0x1F, 0o17, 0b101, \
                      0755, -01, 1_000, 0.5, .5, 1., -1.5e3, 2E-2, 18446744073709551615, \
                      18446744073709551616, -9223372036854775809, 0X1F, 0b12, 1e, .e1, inf, nan, x1, '5', \"true\"]",
        );
        let want = json!([
            null,
            null,
            null,
            null,
            true,
            true,
            false,
            "yes",
            "on",
            0,
            0,
            7,
            12,
            -3,
            31,
            15,
            5,
            "0755",
            "-01",
            "1_000",
            0.5,
            0.5,
            1.0,
            -1500.0,
            0.02,
            18446744073709551615u64,
            18446744073709551616.0,
            -9223372036854775809.0,
            "0X1F",
            "0b12",
            "1e",
            ".e1",
            "inf",
            "nan",
            "x1",
            "5",
            "true"
        ]);
        assert_eq!(doc, want);
    }

    #[test]
    fn core_tags_force_a_type_and_others_are_ignored() {
        let doc = ok("[!!str 12, !!str true, ! 7, !!int '12', !!float 3, !!float '2.5', !!bool 'true', !!null x, !custom 5, !!str ~]");
        assert_eq!(doc, json!(["12", "true", "7", 12, 3.0, 2.5, true, null, 5, "~"]));
        assert_eq!(
            err("a: !!int x"),
            "`x` is not an integer, as its tag `!!int` says at line 1 column 10"
        );
        assert!(err("a: !!bool yes").contains("is not a boolean"));
    }

    #[test]
    fn non_finite_numbers_are_refused_with_the_spelling() {
        for bad in ["a: .inf", "a: -.Inf", "a: .nan", "a: 1e999", "a: !!float .inf"] {
            assert!(err(bad).contains("numbers must be finite"), "{bad}: {}", err(bad));
        }
        // Signed NaN is not a core-schema float: a string.
        assert_eq!(ok("a: -.nan"), json!({"a": "-.nan"}));
    }

    #[test]
    fn keys_are_strings_and_must_be_unique() {
        assert_eq!(
            ok("{404: a, true: b, 1.5: c, '<<': d}"),
            json!({"404": "a", "true": "b", "1.5": "c", "<<": "d"})
        );
        let e = err("statuses:\n  404: a\n  '404': b\n");
        assert_eq!(e, "duplicate mapping key `404` at line 3 column 3");
        assert!(err("~: x").contains("mapping keys must be strings, found null"));
        assert_eq!(
            err("? [1, 2]\n: x"),
            "mapping keys must be strings, found a sequence at line 1 column 3"
        );
        assert!(err("? {a: 1}\n: x").contains("found a mapping"));
    }

    #[test]
    fn aliases_copy_their_anchor_and_count_against_the_node_cap() {
        assert_eq!(
            ok("base: &b {k: [1, 2]}\ncopy: *b\nname: &n hello\nagain: *n\n"),
            json!({"base": {"k": [1, 2]}, "copy": {"k": [1, 2]}, "name": "hello", "again": "hello"})
        );
        // Nine levels of nine-fold aliases would be 387 million nodes.
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
        for (i, name) in ["b", "c", "d", "e", "f", "g", "h", "i"].iter().enumerate() {
            let prev = ["a", "b", "c", "d", "e", "f", "g", "h"][i];
            bomb += &format!(
                "{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            );
        }
        assert!(
            err(&bomb).contains(&format!("more than {MAX_NODES} nodes")),
            "{}",
            err(&bomb)
        );
        assert!(err("a: *nowhere").contains("line 1"), "{}", err("a: *nowhere"));
    }

    #[test]
    fn aliases_cannot_nest_past_the_depth_limit() {
        // Each line is 8 levels deep holding the previous line's alias: 8 lines would be 64
        // levels inside a top-level mapping, 65 in all, with no line itself deep.
        let mut doc = String::new();
        let mut prev = "x".to_string();
        for i in 0..8 {
            doc += &format!("a{i}: &a{i} [[[[[[[[{prev}]]]]]]]]\n");
            prev = format!("*a{i}");
        }
        let e = err(&doc);
        assert!(
            e.contains("levels deep (through an alias)") && e.contains("line 8"),
            "{e}"
        );
        // Seven such lines are 57 levels: within the limit, and the copies are whole.
        let seven: String = doc.lines().take(7).map(|l| format!("{l}\n")).collect();
        let v = ok(&seven);
        let mut node = &v["a6"];
        for _ in 0..56 {
            node = &node[0];
        }
        assert_eq!(node, &json!("x"));
    }

    #[test]
    fn long_strings_aliased_many_times_are_refused_by_their_bytes() {
        // 1 MiB aliased 100 times: few nodes, 100 MiB of copies.
        let doc = format!("s: &s {}\nall: [{}]\n", "x".repeat(1 << 20), ["*s"; 100].join(", "));
        let e = err(&doc);
        assert!(e.contains("aliases copy more than 64 MiB of text"), "{e}");
        // Ten copies are fine.
        let doc = format!("s: &s {}\nall: [{}]\n", "x".repeat(1 << 20), ["*s"; 10].join(", "));
        assert_eq!(ok(&doc)["all"].as_array().unwrap().len(), 10);
    }

    #[test]
    fn the_copies_nested_anchors_keep_count_against_the_node_cap() {
        // 40 nested anchors around 30,000 scalars keep 40 copies of them: 1.2 million nodes,
        // with no alias at all.
        let items = vec!["1"; 30_000].join(", ");
        let open: String = (0..40).map(|i| format!("&n{i} [")).collect();
        let doc = format!("v: {open}{items}{}\n", "]".repeat(40));
        let e = err(&doc);
        assert!(e.contains(&format!("more than {MAX_NODES} nodes")), "{e}");
        // Anchors nested three deep keep three copies: well within the cap.
        let doc = format!("v: &a [&b [&c [{items}]]]\nw: *c\n");
        assert_eq!(ok(&doc)["w"].as_array().unwrap().len(), 30_000);
    }

    #[test]
    fn depth_documents_and_syntax_errors_are_refused_with_a_place() {
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(
            err(&deep).contains("levels deep") || err(&deep).contains("nest"),
            "{}",
            err(&deep)
        );
        let ok_depth = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(to_value(&ok_depth).is_ok());
        assert!(err("a: 1\n---\nb: 2\n").contains("a second YAML document (`---`): a config file holds one at line 2"));
        assert!(err("a: [1, 2").contains("line"));
        assert_eq!(ok(""), Value::Null);
        assert_eq!(ok("a:\nb: ~\n"), json!({"a": null, "b": null}));
        assert_eq!(ok("# only a comment\n"), Value::Null);
        assert_eq!(ok("---\na: 1\n...\n"), json!({"a": 1}));
    }

    #[test]
    fn block_and_quoted_scalars_are_strings() {
        assert_eq!(
            ok("l: |\n  two\n  lines\nf: >\n  folded\n  text\nq: '12'\nd: \"a\\tb\"\nm: multi\n  word\n"),
            json!({"l": "two\nlines\n", "f": "folded text\n", "q": "12", "d": "a\tb", "m": "multi word"})
        );
    }
}
