//! The move from `serde_yaml` (unmaintained) to `serde-saphyr`: every YAML document the project
//! ships (examples, manifests, the chart's rule files, the operator's snapshot, the CRDs, and
//! every YAML block in the docs) reads to the same JSON as before, and the edge cases a config
//! may hit are pinned.

use serde_json::Value;
use toolgate_config::parse_yaml_value;

/// What the previous parser made of `text` (its YAML → JSON rules: keys as strings, tags dropped).
fn old(text: &str) -> Result<Value, String> {
    fn conv(v: serde_yaml::Value) -> Result<Value, String> {
        use serde_yaml::Value as Y;
        Ok(match v {
            Y::Null => Value::Null,
            Y::Bool(b) => Value::Bool(b),
            Y::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Value::from(i),
                (_, Some(u)) => Value::from(u),
                _ => serde_json::Number::from_f64(n.as_f64().unwrap_or(f64::NAN))
                    .map(Value::Number)
                    .ok_or("numbers must be finite")?,
            },
            Y::String(s) => Value::String(s),
            Y::Sequence(items) => Value::Array(items.into_iter().map(conv).collect::<Result<_, _>>()?),
            Y::Mapping(m) => {
                let mut out = serde_json::Map::new();
                for (k, v) in m {
                    let k = match k {
                        Y::String(s) => s,
                        Y::Number(n) => n.to_string(),
                        Y::Bool(b) => b.to_string(),
                        other => return Err(format!("key {other:?}")),
                    };
                    out.insert(k, conv(v)?);
                }
                Value::Object(out)
            }
            Y::Tagged(t) => conv(t.value)?,
        })
    }
    conv(serde_yaml::from_str(text).map_err(|e| e.to_string())?)
}

/// What serde-saphyr's deserializer (the reader between serde_yaml and `toolgate_config::yaml`)
/// made of `text`, with the options the config used.
fn saphyr(text: &str) -> Result<Value, String> {
    let options = serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        merge_keys: serde_saphyr::options::MergeKeyPolicy::AsOrdinary,
    };
    serde_saphyr::from_str_with_options(text, options).map_err(|e| e.to_string())
}

/// Every YAML file the project ships that holds plain YAML (no templates).
const SHIPPED: [&str; 8] = [
    "example/proxy.yaml",
    "example/architecture-example.yaml",
    "example/k8s/shop.yaml",
    "example/k8s/tools.yaml",
    "charts/toolgate/files/alerts-proxy.yaml",
    "charts/toolgate/files/alerts-operator.yaml",
    "charts/toolgate/tests/alerts_test.yaml",
    "crds/toolgate.yaml",
];

fn repo(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// The documents of a file (`---`-separated), without the empty ones.
fn documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else {
            let last = docs.last_mut().unwrap();
            last.push_str(line);
            last.push('\n');
        }
    }
    docs.into_iter()
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .collect()
}

/// The ```yaml blocks of a Markdown file.
fn yaml_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let t = line.trim_start();
        match &mut current {
            None if t.starts_with("```yaml") || t.starts_with("```yml") => current = Some(String::new()),
            Some(block) if t.starts_with("```") => {
                out.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    out
}

#[test]
fn every_shipped_yaml_document_reads_as_before() {
    let files = SHIPPED;
    let mut docs = 0;
    for f in files {
        let text = std::fs::read_to_string(repo(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        for (i, d) in documents(&text).iter().enumerate() {
            let new = parse_yaml_value(d).unwrap_or_else(|e| panic!("{f} document {i}: {e}"));
            assert_eq!(Ok(new), old(d), "{f} document {i} reads differently");
            docs += 1;
        }
    }
    for md in [
        "README.md",
        "docs/proxy-config.md",
        "docs/operator.md",
        "docs/observability.md",
    ] {
        let text = std::fs::read_to_string(repo(md)).unwrap();
        for (i, block) in yaml_blocks(&text).iter().enumerate() {
            // Both parsers must agree on every snippet, fragments included.
            let new = parse_yaml_value(block).map_err(|e| e.to_string());
            let was = old(block);
            assert_eq!(new.is_ok(), was.is_ok(), "{md} block {i}: {new:?} vs {was:?}");
            if let (Ok(a), Ok(b)) = (new, was) {
                assert_eq!(a, b, "{md} block {i} reads differently");
            }
            docs += 1;
        }
    }
    assert!(docs >= 15, "only {docs} documents found");
}

#[test]
fn the_event_composer_reads_what_serde_saphyr_read() {
    // Every shipped document, and a generated config of 200 tools in both styles.
    let mut docs = Vec::new();
    for f in SHIPPED {
        docs.extend(documents(&std::fs::read_to_string(repo(f)).unwrap()));
    }
    let mut big = String::from("tools:\n");
    for i in 0..200 {
        big += &format!(
            "  - name: lookup_{i:03}\n    description: \"Record {i}: a generated one\"\n    \
             inputSchema: {{type: object, required: [id], properties: {{id: {{type: string, pattern: '^[a-z]+$'}}, \
             n: {{type: integer, minimum: -{i}, maximum: {i}.5}}, f: {{type: array, items: {{enum: [a, b, yes, 0755]}}}}}}}}\n    \
             http: {{method: GET, path: '/r/{{id}}', timeoutMs: {i}000}}\n"
        );
    }
    docs.push(big);
    for (i, d) in docs.iter().enumerate() {
        let new = parse_yaml_value(d).unwrap_or_else(|e| panic!("document {i}: {e}"));
        assert_eq!(Ok(new), saphyr(d), "document {i} reads differently:\n{d}");
    }
    // Scalars of every kind, one per mapping value.
    let scalars = [
        "~",
        "null",
        "NULL",
        "",
        "true",
        "True",
        "FALSE",
        "yes",
        "on",
        "n",
        "0",
        "-0",
        "+7",
        "-3",
        "0x1F",
        "0XFF",
        "0o17",
        "0O17",
        "0b11",
        "0755",
        "-01",
        "1_000",
        "0.5",
        ".5",
        "1.",
        "-1.5e3",
        "2E-2",
        "1e5",
        "+.5",
        "01.5",
        "1.5.5",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775809",
        "1e",
        ".e1",
        "inf",
        "nan",
        "-.nan",
        "0x",
        "0o8",
        "12:30:00",
        "2001-12-14",
        "'5'",
        "\"5\"",
        "'true'",
        "!!str 5",
        "! 5",
        "!!int '5'",
        "!!float 5",
        "!!bool 'true'",
        "!!null ''",
        "!custom 5",
        "|\n  a\n",
    ];
    for sc in scalars {
        let text = format!("v: {sc}\n");
        assert_eq!(
            parse_yaml_value(&text).map_err(|_| ()),
            saphyr(&text).map_err(|_| ()),
            "{sc:?}"
        );
    }
}

#[test]
fn edge_cases_read_as_a_config_author_expects() {
    for (yaml, json) in [
        (
            "statuses: {404: {status: failed}, '500': x}",
            r#"{"statuses": {"404": {"status": "failed"}, "500": "x"}}"#,
        ),
        (
            "a: yes\nb: on\nc: 'true'\nd: true",
            r#"{"a": "yes", "b": "on", "c": "true", "d": true}"#,
        ),
        (
            "n: ~\nm: null\nz: 0.5\ni: -3\nbig: 18446744073709551615",
            r#"{"n": null, "m": null, "z": 0.5, "i": -3, "big": 18446744073709551615}"#,
        ),
        ("x: &a {k: 1}\ny: *a", r#"{"x": {"k": 1}, "y": {"k": 1}}"#),
        (
            "mode: 0755\ncount: 1_000\nenum: [yes, no, off]",
            r#"{"mode": "0755", "count": "1_000", "enum": ["yes", "no", "off"]}"#,
        ),
        ("<<: {a: 1}\nb: 2", r#"{"<<": {"a": 1}, "b": 2}"#),
        ("s: |\n  two\n  lines\n", r#"{"s": "two\nlines\n"}"#),
        (
            "{\"json\": [1, 2, {\"also\": \"yaml\"}]}",
            r#"{"json": [1, 2, {"also": "yaml"}]}"#,
        ),
    ] {
        let want: Value = serde_json::from_str(json).unwrap();
        assert_eq!(parse_yaml_value(yaml).unwrap(), want, "{yaml}");
        assert_eq!(old(yaml).unwrap(), want, "the old parser agreed: {yaml}");
    }
    for bad in ["a: .nan", "a: .inf", "a: 1\na: 2", "a: [1, 2", "? [1, 2]\n: x"] {
        let e = parse_yaml_value(bad).unwrap_err().to_string();
        assert!(
            e.contains("YAML") || e.contains("finite") || e.contains("keys"),
            "{bad}: {e}"
        );
        assert!(old(bad).is_err(), "the old parser refused it too: {bad}");
    }
}
