//! Compiling tool schemas: the one place where `inputSchema` and `outputSchema` become
//! validators, for config validation (`toolgate-proxy check`, the operator's `Accepted`
//! condition) and for serving alike, so a schema refused in one is refused in the other.
//!
//! `pattern` and `patternProperties` run on the `regex` crate, whose matching time is linear in
//! the input. The validator's default engine falls back to backtracking for backreferences and
//! lookaround, and a pattern such as `^(a*)*\1b` then costs exponential time on a few kilobytes of
//! arguments that any caller can send. A pattern that needs backtracking is refused when the
//! config is loaded, with the pattern and the reason in the message.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use jsonschema::{PatternCache, PatternOptions, Validator};
use serde_json::Value;

/// Largest compiled program of one `pattern` (the `regex` crate's `size_limit`). A realistic
/// pattern compiles to a few kilobytes; this refuses ones like `\w{500}{500}` whose program would
/// cost megabytes per tool and time per matched byte.
pub const MAX_PATTERN_PROGRAM_BYTES: usize = 512 * 1024;

/// Compiled patterns shared by the tools of one config generation (the same `pattern` in many
/// tools is compiled and held once).
pub type Patterns = PatternCache;

/// Checks the schemas of one config: each distinct schema (by JSON text; tools imported from one
/// OpenAPI spec often share an `{id}` lookup or a response) is compiled once, with patterns of
/// its own, and its validator dropped at once. Only the outcome is kept, so checking 1,000
/// distinct schemas holds one validator at a time, not 1,000 of 5-12 KiB each: the load's
/// transient peak, which the allocator would otherwise keep partly resident, stays small.
#[derive(Default)]
pub struct Checker {
    checked: HashMap<String, Result<(), String>>,
}

impl Checker {
    /// Whether `schema` compiles ([`compile`]); the outcome of an identical schema checked
    /// before is not computed again.
    pub fn check(&mut self, schema: &Value) -> Result<(), String> {
        self.checked
            .entry(schema.to_string())
            .or_insert_with(|| compile(schema, &Patterns::default()).map(drop))
            .clone()
    }

    /// How many distinct schemas were compiled.
    #[cfg(test)]
    fn compiled(&self) -> usize {
        self.checked.len()
    }
}

/// A schema that loading has already checked (it compiled), kept as its JSON text and compiled
/// again for serving on its first use. A compiled validator and its patterns cost 2-6 KiB for a
/// small schema, and a config of 1,000 tools of which agents call a few dozen should not hold
/// the other validators: memory follows the tools in use, not the tools configured. The first
/// call of a tool pays the compile (about 0.1 ms for a small schema).
pub struct LazyValidator {
    text: Box<str>,
    patterns: Patterns,
    validator: OnceLock<Result<Validator, String>>,
}

impl LazyValidator {
    /// `schema`, to be compiled with the generation's shared `patterns` when first used.
    pub fn new(schema: &Value, patterns: &Patterns) -> Self {
        Self {
            text: schema.to_string().into_boxed_str(),
            patterns: patterns.clone(),
            validator: OnceLock::new(),
        }
    }

    /// The validator, compiled on the first call (concurrent first calls wait for one compile).
    /// An error means the schema that compiled at load did not compile now, which is a bug.
    pub fn get(&self) -> Result<&Validator, &str> {
        self.validator
            .get_or_init(|| {
                let schema: Value = serde_json::from_str(&self.text).map_err(|e| e.to_string())?;
                compile_checked(&schema, &self.patterns)
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// Whether [`LazyValidator::get`] has compiled it.
    pub fn is_compiled(&self) -> bool {
        self.validator.get().is_some()
    }
}

/// Tools with identical schemas (the same JSON text) share one [`LazyValidator`], and every
/// schema of one config generation shares one pattern cache.
#[derive(Default)]
pub struct LazyValidators {
    patterns: Patterns,
    by_text: HashMap<String, Arc<LazyValidator>>,
}

impl LazyValidators {
    /// The lazy validator of `schema`, shared with identical schemas seen before.
    pub fn get(&mut self, schema: &Value) -> Arc<LazyValidator> {
        let patterns = &self.patterns;
        Arc::clone(
            self.by_text
                .entry(schema.to_string())
                .or_insert_with(|| Arc::new(LazyValidator::new(schema, patterns))),
        )
    }
}

/// Compiles `schema` with the linear-time pattern engine, sharing compiled patterns through
/// `patterns`, and refuses a pattern whose program is over [`MAX_PATTERN_PROGRAM_BYTES`]. The
/// error says which pattern could not be compiled and why.
pub fn compile(schema: &Value, patterns: &Patterns) -> Result<Validator, String> {
    jsonschema::options()
        .with_pattern_options(PatternOptions::regex().size_limit(MAX_PATTERN_PROGRAM_BYTES))
        .with_pattern_cache(patterns.clone())
        .build(schema)
        .map_err(|e| {
            let mut msg = e.to_string();
            if let Some(p) = needs_backtracking(schema) {
                msg = format!(
                    "`pattern` {p} needs a backtracking regex engine (backreferences or lookaround), \
                     whose matching time can grow exponentially with the input; Toolgate runs patterns \
                     in linear time only: rewrite it without `\\1`-style backreferences, `(?=`, `(?!`, \
                     `(?<=` or `(?<!` ({msg})"
                );
            }
            msg
        })
}

/// Compiles a schema that [`compile`] has already accepted, for serving: the same engine, but
/// without asking it to enforce the size limit again. The validator can then keep a simple pattern
/// (a literal, classes and repeats: most `pattern`s of real tools) as a small sequence matcher and
/// build its regex program only for an input the sequence cannot decide, where an enforced limit
/// makes it build that program with the validator: about 6 KiB for `^r1-[a-z0-9-]+$`, which a
/// 1,000-tool config pays 1,000 times. Every pattern here passed the limit at load; a program the
/// engine builds later is the same one, so the limit still holds.
fn compile_checked(schema: &Value, patterns: &Patterns) -> Result<Validator, String> {
    jsonschema::options()
        .with_pattern_options(PatternOptions::regex())
        .with_pattern_cache(patterns.clone())
        .build(schema)
        .map_err(|e| e.to_string())
}

/// Whether `schema` refers to other schemas (`$ref`, `$dynamicRef`, `$recursiveRef`) anywhere.
pub fn has_refs(schema: &Value) -> bool {
    match schema {
        Value::Object(m) => {
            ["$ref", "$dynamicRef", "$recursiveRef"]
                .iter()
                .any(|k| m.contains_key(*k))
                || m.values().any(has_refs)
        }
        Value::Array(a) => a.iter().any(has_refs),
        _ => false,
    }
}

/// The first `pattern` (or `patternProperties` key) in `schema` that uses a construct only a
/// backtracking engine runs, as a JSON string.
fn needs_backtracking(schema: &Value) -> Option<String> {
    fn backtracking(p: &str) -> bool {
        let b = p.as_bytes();
        b.windows(2).enumerate().any(|(i, w)| {
            let escaped = b[..i].iter().rev().take_while(|&&c| c == b'\\').count() % 2 == 1;
            !escaped
                && ((w[0] == b'\\' && w[1].is_ascii_digit() && w[1] != b'0')
                    || (w[0] == b'\\' && w[1] == b'k')
                    || (w[0] == b'(' && b[i + 1..].starts_with(b"?="))
                    || (w[0] == b'(' && b[i + 1..].starts_with(b"?!"))
                    || (w[0] == b'(' && b[i + 1..].starts_with(b"?<="))
                    || (w[0] == b'(' && b[i + 1..].starts_with(b"?<!")))
        })
    }
    match schema {
        Value::Object(m) => {
            if let Some(Value::String(p)) = m.get("pattern") {
                if backtracking(p) {
                    return Some(Value::String(p.clone()).to_string());
                }
            }
            if let Some(Value::Object(pp)) = m.get("patternProperties") {
                if let Some(k) = pp.keys().find(|k| backtracking(k)) {
                    return Some(Value::String(k.clone()).to_string());
                }
            }
            m.values().find_map(needs_backtracking)
        }
        Value::Array(a) => a.iter().find_map(needs_backtracking),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compile_one(schema: Value) -> Result<Validator, String> {
        compile(&schema, &Patterns::default())
    }

    #[test]
    fn lazy_validators_compile_on_first_use_and_identical_schemas_share_one() {
        let mut lazy = LazyValidators::default();
        let a = json!({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}});
        let b = json!({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[0-9]+$"}}});
        let (a1, a2, b1) = (lazy.get(&a), lazy.get(&a.clone()), lazy.get(&b));
        assert!(Arc::ptr_eq(&a1, &a2) && !Arc::ptr_eq(&a1, &b1));
        assert!(
            !a1.is_compiled() && !b1.is_compiled(),
            "nothing compiles before its first use"
        );
        let v = a1.get().unwrap();
        assert!(v.is_valid(&json!({"id": "abc"})) && !v.is_valid(&json!({"id": "123"})));
        assert!(a2.is_compiled() && !b1.is_compiled());
        assert!(std::ptr::eq(a1.get().unwrap(), v), "compiled once");
        assert!(b1.get().unwrap().is_valid(&json!({"id": "123"})));
    }

    #[test]
    fn a_served_validator_decides_every_input_as_the_checked_one_does() {
        // Served validators skip the size limit the load already enforced, so simple patterns
        // stay sequence matchers: they must still decide like the checked compile, also for the
        // inputs a sequence leaves to the regex engine, and stay linear on hostile input.
        let patterns = [
            "^r12-[a-z0-9-]+$",
            "^[A-Z]{2}\\d{6}$",
            "^\\+?[1-9]\\d{1,14}$",
            "^(foo|bar)-\\w+$",
            "^[^@\\s]+@[^@\\s]+\\.[a-z]{2,}$",
            "^(a*)*b$",
            "é+$",
            "",
        ];
        let inputs = [
            "r12-abc",
            "r12-",
            "R12-abc",
            "r12-abc\n",
            "xr12-abc",
            "AB123456",
            "AB12345",
            "+14155550123",
            "0123",
            "foo-x1",
            "baz-x",
            "a@b.io",
            "a@b",
            "ab",
            "b",
            "éé",
            "e",
            "",
            &"a".repeat(50_000),
        ];
        let served = LazyValidators::default();
        for p in patterns {
            let schema = json!({"type": "string", "pattern": p});
            let checked = compile_one(schema.clone()).unwrap();
            let lazy = LazyValidator::new(&schema, &served.patterns);
            let serving = lazy.get().unwrap();
            for i in inputs {
                assert_eq!(
                    serving.is_valid(&json!(i)),
                    checked.is_valid(&json!(i)),
                    "pattern {p:?} on {:?}",
                    &i[..i.len().min(20)]
                );
            }
        }
    }

    #[test]
    fn the_checker_compiles_each_distinct_schema_once_and_keeps_its_outcome() {
        let mut c = Checker::default();
        let a = json!({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}});
        let b = json!({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[0-9]+$"}}});
        let bad = json!({"type": "object", "properties": {"id": {"pattern": "(?=x)"}}});
        assert_eq!(c.check(&a), Ok(()));
        assert_eq!(c.check(&a.clone()), Ok(()));
        assert_eq!(c.check(&b), Ok(()));
        let refused = c.check(&bad).unwrap_err();
        assert!(refused.contains("needs a backtracking regex engine"), "{refused}");
        assert_eq!(c.check(&bad), Err(refused), "an identical schema gets the same answer");
        assert_eq!(c.compiled(), 3, "a, b and bad: the copy of a is not compiled again");
    }

    #[test]
    fn a_backreference_pattern_is_refused_with_the_reason() {
        let err = compile_one(json!({"type": "object", "properties": {"items": {"type": "array",
            "items": {"type": "string", "pattern": "^(a*)*\\1b"}}}}))
        .unwrap_err();
        assert!(
            err.contains(r#"`pattern` "^(a*)*\\1b" needs a backtracking regex engine"#),
            "{err}"
        );
    }

    #[test]
    fn lookaround_in_pattern_properties_is_refused() {
        let err = compile_one(json!({"type": "object", "patternProperties": {"^(?!x)a": {}}})).unwrap_err();
        assert!(err.contains("needs a backtracking regex engine"), "{err}");
    }

    #[test]
    fn linear_patterns_compile_and_match_with_ecma_classes() {
        let v = compile_one(json!({"type": "string", "pattern": "^\\d{3}-[A-Z]+$"})).unwrap();
        assert!(v.is_valid(&json!("123-ABC")));
        assert!(!v.is_valid(&json!("12-ABC")));
        // An escaped backslash before a digit is a literal, not a backreference.
        assert!(compile_one(json!({"type": "string", "pattern": "^a\\\\1$"})).is_ok());
    }

    #[test]
    fn a_pattern_whose_program_is_huge_is_refused() {
        let err = compile_one(json!({"type": "string", "pattern": "\\w{500}{500}"})).unwrap_err();
        assert!(!err.is_empty());
    }

    #[test]
    fn a_hostile_input_against_a_nested_quantifier_is_matched_in_linear_time() {
        // `(a*)*b` is the textbook catastrophic pattern for backtracking engines.
        let v = compile_one(json!({"type": "string", "pattern": "^(a*)*b$"})).unwrap();
        let input = json!("a".repeat(100_000));
        assert!(!v.is_valid(&input));
    }
}
