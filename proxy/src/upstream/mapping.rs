//! Arguments → HTTP request. Path values fill exactly one percent-encoded segment each, so no
//! argument can climb out of the upstream (`..`, `/`, absolute URLs); header values never
//! carry CR/LF.

use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::Full;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::{Map, Value};
use toolgate_config::{Segment, Template};

use crate::envelope::ErrorEntry;
use crate::runtime::{BodyPlan, CompiledTool};
use crate::upstream::Upstream;

/// Everything but RFC 3986 unreserved characters is encoded.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// The user agent the proxy sends upstream.
pub const USER_AGENT: &str = concat!("toolgate-proxy/", env!("CARGO_PKG_VERSION"));

fn arg_error(field: &str, message: String, message_es: String) -> ErrorEntry {
    ErrorEntry::new("invalid_argument", message, message_es, false).with_field(field)
}

/// Text of a scalar argument; `None` for objects and arrays.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// Text used in query and header values: scalars as-is, structures as compact JSON.
fn value_text(v: &Value) -> String {
    scalar_text(v).unwrap_or_else(|| v.to_string())
}

fn render_path(t: &Template, args: &Map<String, Value>) -> Result<String, ErrorEntry> {
    let mut out = String::with_capacity(64);
    for seg in &t.segments {
        match seg {
            Segment::Literal(l) => out.push_str(l),
            Segment::Var(name) => {
                let v = args.get(name).filter(|v| !v.is_null()).ok_or_else(|| {
                    arg_error(
                        name,
                        format!("`{name}` is required to build the request path"),
                        format!("Falta `{name}` para construir la ruta"),
                    )
                })?;
                let text = scalar_text(v).ok_or_else(|| {
                    arg_error(
                        name,
                        format!("`{name}` must be a string or number (it is part of the URL path)"),
                        format!("`{name}` debe ser texto o número (forma parte de la ruta)"),
                    )
                })?;
                // `/` is sent encoded, but an upstream that decodes `%2F` before it resolves dot
                // segments (nginx does) would read `a/../..` as climbing: no part of the value
                // between slashes or backslashes may be `.` or `..`.
                if text.is_empty() || text.split(['/', '\\']).any(|s| s == "." || s == "..") {
                    return Err(arg_error(
                        name,
                        format!("`{name}` must not be empty, nor be or contain `.` or `..` between slashes"),
                        format!("`{name}` no puede estar vacío, ni ser o contener `.` o `..` entre barras"),
                    ));
                }
                out.extend(utf8_percent_encode(&text, COMPONENT));
            }
        }
    }
    Ok(out)
}

/// Renders a template; `None` when any argument it names is absent or null.
fn render_value(t: &Template, args: &Map<String, Value>) -> Option<String> {
    let mut out = String::new();
    for seg in &t.segments {
        match seg {
            Segment::Literal(l) => out.push_str(l),
            Segment::Var(name) => out.push_str(&value_text(args.get(name).filter(|v| !v.is_null())?)),
        }
    }
    Some(out)
}

/// The path and query (encoded) for `args`.
pub fn path_and_query(tool: &CompiledTool, args: &Map<String, Value>) -> Result<String, ErrorEntry> {
    let mut pq = render_path(&tool.path, args)?;
    let mut first = true;
    let mut push = |pq: &mut String, name: &str, value: &str| {
        pq.push(if first { '?' } else { '&' });
        first = false;
        pq.extend(utf8_percent_encode(name, COMPONENT));
        pq.push('=');
        pq.extend(utf8_percent_encode(value, COMPONENT));
    };
    for (name, tpl) in &tool.query {
        if let Some(Value::Array(items)) = tpl.single_var().and_then(|v| args.get(v)) {
            for item in items {
                push(&mut pq, name, &value_text(item));
            }
        } else if let Some(v) = render_value(tpl, args) {
            push(&mut pq, name, &v);
        }
    }
    Ok(pq)
}

/// Builds the upstream request for a validated argument object. `extra` headers (provenance,
/// `traceparent`, the upstream credential) are set last and win over tool headers.
pub fn build(
    tool: &CompiledTool,
    args: &Map<String, Value>,
    upstream: &Upstream,
    extra: &[(http::HeaderName, HeaderValue)],
) -> Result<Request<Full<Bytes>>, ErrorEntry> {
    let pq = path_and_query(tool, args)?;
    let uri = upstream.uri(&pq).map_err(|_| {
        arg_error(
            "",
            "the arguments do not form a valid request URL".into(),
            "los argumentos no forman una URL válida".into(),
        )
    })?;
    let mut req = Request::builder().method(tool.config.http.method.as_str()).uri(uri);
    let headers = req.headers_mut().expect("builder is valid until build()");
    headers.insert(http::header::ACCEPT, HeaderValue::from_static("application/json"));
    headers.insert(http::header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
    for (name, tpl) in &tool.headers {
        let Some(text) = render_value(tpl, args) else {
            continue;
        };
        let field = tpl.vars().next().unwrap_or("");
        let value = HeaderValue::from_str(&text).map_err(|_| {
            arg_error(
                field,
                format!("`{field}` cannot be sent in the `{name}` header: it contains line breaks or control characters"),
                format!("`{field}` no puede enviarse en el encabezado `{name}`: contiene saltos de línea o caracteres de control"),
            )
        })?;
        headers.insert(name.clone(), value);
    }
    for (name, value) in extra {
        headers.insert(name.clone(), value.clone());
    }
    // The body is serialized straight from the arguments: no copy of them as a new tree first,
    // which for a 1 KiB argument object cost more than writing it out.
    let body = match &tool.body {
        BodyPlan::None => None,
        BodyPlan::AllExcept { used, only } => Some(serde_json::to_vec(&Members(
            args.iter()
                .filter(|(k, _)| !used.contains(*k) && only.as_ref().is_none_or(|o| o.contains(*k)))
                .map(|(k, v)| (k.as_str(), v))
                .collect(),
        ))),
        BodyPlan::Argument(name) => args.get(name).map(serde_json::to_vec),
        BodyPlan::Fields(fields) => Some(serde_json::to_vec(&Members(
            fields
                .iter()
                .filter_map(|f| args.get(f).map(|v| (f.as_str(), v)))
                .collect(),
        ))),
    };
    let body = match body {
        Some(bytes) => {
            headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            // A Value always serializes; an empty body is what a failure would have sent before.
            Full::new(Bytes::from(bytes.unwrap_or_default()))
        }
        None => Full::new(Bytes::new()),
    };
    req.body(body).map_err(|_| {
        arg_error(
            "",
            "the request could not be built".into(),
            "no se pudo construir la solicitud".into(),
        )
    })
}

/// Some of the arguments, in order, written as one JSON object.
struct Members<'a>(Vec<(&'a str, &'a Value)>);

impl serde::Serialize for Members<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Runtime;
    use serde_json::json;
    use toolgate_config::parse_yaml;

    fn runtime(http: &str, props: &str) -> Runtime {
        let text = format!(
            "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {{baseUrl: 'http://127.0.0.1:9/api/'}}\ntools:\n  - name: t\n    inputSchema: {{type: object, required: [id], properties: {props}}}\n    http: {http}\n"
        );
        Runtime::compile(parse_yaml(&text).unwrap(), 1).unwrap()
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn path_values_are_one_encoded_segment() {
        let rt = runtime("{method: GET, path: '/c/{id}/x'}", "{id: {type: string}}");
        let t = rt.tool("t").unwrap();
        assert_eq!(path_and_query(t, &args(json!({"id": "a/b"}))).unwrap(), "/c/a%2Fb/x");
        assert_eq!(
            path_and_query(t, &args(json!({"id": "http://evil/"}))).unwrap(),
            "/c/http%3A%2F%2Fevil%2F/x"
        );
        assert_eq!(
            path_and_query(t, &args(json!({"id": "%2e%2e"}))).unwrap(),
            "/c/%252e%252e/x"
        );
        assert_eq!(
            path_and_query(t, &args(json!({"id": "José 7"}))).unwrap(),
            "/c/Jos%C3%A9%207/x"
        );
        // Dot segments inside a value too: an upstream that decodes `%2F` first would climb.
        for bad in ["..", ".", "", "a/../../..", "../x", "x/.", "a\\..\\b"] {
            let e = path_and_query(t, &args(json!({"id": bad}))).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("id"), "{bad}");
        }
        assert_eq!(
            path_and_query(t, &args(json!({"id": "a/b...c"}))).unwrap(),
            "/c/a%2Fb...c/x"
        );
        let req = build(t, &args(json!({"id": "42"})), &rt.upstream, &[]).unwrap();
        assert_eq!(req.uri().to_string(), "http://127.0.0.1:9/api/c/42/x");
    }

    #[test]
    fn query_skips_absent_repeats_arrays_and_encodes() {
        let rt = runtime(
            "{method: GET, path: '/s/{id}', query: {q: '{q}', tag: '{tags}', fixed: 'v 1', limit: '{limit}'}}",
            "{id: {type: string}, q: {type: string}, tags: {type: array}, limit: {type: integer}}",
        );
        let t = rt.tool("t").unwrap();
        let pq = path_and_query(t, &args(json!({"id": "1", "q": "a&b=c", "tags": ["x", "y"]}))).unwrap();
        assert_eq!(pq, "/s/1?fixed=v%201&q=a%26b%3Dc&tag=x&tag=y");
    }

    #[test]
    fn body_all_excludes_arguments_used_elsewhere() {
        let rt = runtime(
            "{method: POST, path: '/c/{id}', headers: {X-Trace: '{trace}'}}",
            "{id: {type: string}, trace: {type: string}, note: {type: object}}",
        );
        let t = rt.tool("t").unwrap();
        let req = build(
            t,
            &args(json!({"id": "1", "trace": "abc", "note": {"a": 1}})),
            &rt.upstream,
            &[],
        )
        .unwrap();
        assert_eq!(req.headers()["x-trace"], "abc");
        assert_eq!(req.headers()["content-type"], "application/json");
        let body = futures_body(req);
        assert_eq!(body, json!({"note": {"a": 1}}));
    }

    #[test]
    fn header_values_with_newlines_are_refused() {
        let rt = runtime(
            "{method: GET, path: '/c/{id}', headers: {X-Trace: '{trace}'}}",
            "{id: {type: string}, trace: {type: string}}",
        );
        let e = build(
            rt.tool("t").unwrap(),
            &args(json!({"id": "1", "trace": "a\r\nX-Evil: 1"})),
            &rt.upstream,
            &[],
        )
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("trace"));
        assert!(e.message.contains("line breaks"));
    }

    #[test]
    fn undeclared_arguments_do_not_reach_the_body_unless_the_schema_admits_them() {
        let rt = runtime(
            "{method: POST, path: '/c/{id}'}",
            "{id: {type: string}, a: {type: string}}",
        );
        let req = build(
            rt.tool("t").unwrap(),
            &args(json!({"id": "1", "a": "x", "role": "admin"})),
            &rt.upstream,
            &[],
        )
        .unwrap();
        assert_eq!(futures_body(req), json!({"a": "x"}));
        let text = "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {baseUrl: 'http://127.0.0.1:9'}\ntools:\n  - name: t\n    inputSchema: {type: object, additionalProperties: true, properties: {a: {type: string}}}\n    http: {method: POST, path: /x}\n";
        let rt = Runtime::compile(parse_yaml(text).unwrap(), 1).unwrap();
        let req = build(
            rt.tool("t").unwrap(),
            &args(json!({"a": "x", "extra": 1})),
            &rt.upstream,
            &[],
        )
        .unwrap();
        assert_eq!(futures_body(req), json!({"a": "x", "extra": 1}));
    }

    #[test]
    fn named_body_fields_only() {
        let rt = runtime(
            "{method: PUT, path: '/c/{id}', body: [a]}",
            "{id: {type: string}, a: {type: string}, b: {type: string}}",
        );
        let req = build(
            rt.tool("t").unwrap(),
            &args(json!({"id": "1", "a": "x", "b": "y"})),
            &rt.upstream,
            &[],
        )
        .unwrap();
        assert_eq!(futures_body(req), json!({"a": "x"}));
    }

    fn body_text(req: Request<Full<Bytes>>) -> String {
        use http_body_util::BodyExt;
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        String::from_utf8(rt.block_on(req.into_body().collect()).unwrap().to_bytes().to_vec()).unwrap()
    }

    #[test]
    fn the_body_is_written_in_argument_order_as_a_tree_of_it_would_be() {
        let a = args(json!({
            "z": {"nested": [1, "q\"uote", null, {"b": true, "a": -0.5, "k\"\u{1}\u{2028}": "é"}]},
            "id": "1",
            "a": "x",
            "m": 2.5,
            "b": "y",
        }));
        let props = "{id: {type: string}, z: {type: object}, a: {type: string}, m: {type: number}, b: {type: string}, missing: {type: string}}";
        // Every argument not in the path, in the order the client sent them.
        let rt = runtime("{method: POST, path: '/c/{id}'}", props);
        let req = build(rt.tool("t").unwrap(), &a, &rt.upstream, &[]).unwrap();
        let want = json!({"z": a["z"], "a": "x", "m": 2.5, "b": "y"});
        assert_eq!(body_text(req), want.to_string());
        // Named fields in the configured order; one named twice travels once, where first named.
        let rt = runtime("{method: PUT, path: '/c/{id}', body: [b, z, missing, b]}", props);
        let req = build(rt.tool("t").unwrap(), &a, &rt.upstream, &[]).unwrap();
        let want = json!({"b": "y", "z": a["z"]});
        assert_eq!(body_text(req), want.to_string());
        // Named fields none of which was sent: an empty object, still JSON.
        let rt = runtime("{method: PUT, path: '/c/{id}', body: [missing]}", props);
        let req = build(rt.tool("t").unwrap(), &a, &rt.upstream, &[]).unwrap();
        assert_eq!(req.headers()["content-type"], "application/json");
        assert_eq!(body_text(req), "{}");
        // One argument as the whole body, verbatim.
        let rt = runtime("{method: POST, path: '/c/{id}', body: {argument: z}}", props);
        let req = build(rt.tool("t").unwrap(), &a, &rt.upstream, &[]).unwrap();
        assert_eq!(body_text(req), a["z"].to_string());
    }

    /// A tiny deterministic generator (xorshift64*), so the property test needs no new crate
    /// and every failure reproduces.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[(self.next() % items.len() as u64) as usize]
        }

        fn concat(&mut self, items: &[&str], max: u64) -> String {
            let n = 1 + self.next() % max;
            (0..n).map(|_| self.pick(items)).collect()
        }
    }

    /// Pieces of hostile paths, hosts and values: separators, dot segments, authorities,
    /// encodings, control and non-ASCII characters.
    const HOSTILE: [&str; 30] = [
        "/",
        "//",
        ".",
        "..",
        "@",
        ":",
        "?",
        "#",
        "%",
        "%2e",
        "%2F",
        "%40",
        "\\",
        "evil.example",
        "http://evil.example",
        "//evil.example:1",
        "@evil.example",
        "127.0.0.1:38080",
        "[::1]",
        "a",
        "x",
        "~",
        "-",
        "_",
        " ",
        "\r\n",
        "\t",
        "\u{0}",
        "é",
        ";",
    ];

    #[test]
    fn no_path_template_or_value_changes_the_scheme_or_authority() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let bases = [
            ("http://127.0.0.1:9", "127.0.0.1:9", ""),
            ("http://127.0.0.1:9/api/", "127.0.0.1:9", "/api"),
            ("http://shop-api.demo.svc:8080/v1/x", "shop-api.demo.svc:8080", "/v1/x"),
            ("http://[::1]:7", "[::1]:7", ""),
        ];
        let (mut served, mut built) = (0, 0);
        for case in 0..3000 {
            let (base, authority, prefix) = bases[case % bases.len()];
            let mut path = String::from("/");
            for _ in 0..1 + rng.next() % 5 {
                if rng.next() % 3 == 0 {
                    path.push_str("{id}");
                } else {
                    path.push_str(&rng.concat(&HOSTILE, 3));
                }
            }
            if !path.contains("{id}") {
                path.push_str("/{id}");
            }
            let text = format!(
                "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {{baseUrl: '{base}'}}\ntools:\n  - name: t\n    inputSchema: {{type: object, required: [id], properties: {{id: {{type: string}}, q: {{type: string}}}}}}\n    http: {{method: GET, path: {}, query: {{q: '{{q}}'}}}}\n",
                serde_json::to_string(&path).unwrap()
            );
            // A template the config refuses is never served; that is a pass too.
            let Ok(cfg) = parse_yaml(&text) else { continue };
            let rt = Runtime::compile(cfg, 1).unwrap();
            assert_eq!(rt.upstream.authority().as_str(), authority, "{base}");
            assert_eq!(rt.upstream.prefix(), prefix, "{base}");
            served += 1;
            let t = rt.tool("t").unwrap();
            for _ in 0..8 {
                let a = args(json!({"id": rng.concat(&HOSTILE, 4), "q": rng.concat(&HOSTILE, 4)}));
                let Ok(req) = build(t, &a, &rt.upstream, &[]) else {
                    continue;
                };
                built += 1;
                let uri = req.uri();
                assert_eq!(uri.scheme_str(), Some("http"), "{path} {a:?} -> {uri}");
                assert_eq!(
                    uri.authority().map(|a| a.as_str()),
                    Some(authority),
                    "{path} {a:?} -> {uri}"
                );
                assert!(uri.path().starts_with(&format!("{prefix}/")), "{path} {a:?} -> {uri}");
                assert!(!uri.path()[prefix.len()..].starts_with("//"), "{path} {a:?} -> {uri}");
                // What the client sends is what we checked: reparsing the URI gives the same
                // authority.
                let again: http::Uri = uri.to_string().parse().unwrap();
                assert_eq!(again.authority(), uri.authority(), "{uri}");
            }
        }
        assert!(
            served > 300 && built > 2000,
            "the generator exercised too little: {served} configs, {built} requests"
        );
    }

    #[test]
    fn the_upstream_join_never_leaves_the_base_url() {
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        let rt = runtime("{method: GET, path: '/c/{id}'}", "{id: {type: string}}");
        let up = &rt.upstream;
        for pq in [
            "//evil.example/x",
            "@evil.example/x",
            "evil.example",
            "",
            "http://evil.example/",
        ] {
            assert!(up.uri(pq).is_err(), "{pq}");
        }
        let mut joined = 0;
        for _ in 0..20_000 {
            let tail = rng.concat(&HOSTILE, 8);
            let pq = if rng.next() % 4 == 0 { tail } else { format!("/{tail}") };
            if let Ok(uri) = up.uri(&pq) {
                joined += 1;
                assert_eq!(uri.scheme_str(), Some("http"), "{pq:?} -> {uri}");
                assert_eq!(uri.authority().unwrap().as_str(), "127.0.0.1:9", "{pq:?} -> {uri}");
                assert!(uri.path().starts_with("/api/"), "{pq:?} -> {uri}");
                let again: http::Uri = uri.to_string().parse().unwrap();
                assert_eq!(again.authority(), uri.authority(), "{uri}");
            }
        }
        assert!(joined > 2000, "only {joined} joins succeeded");
    }

    fn futures_body(req: Request<Full<Bytes>>) -> Value {
        use http_body_util::BodyExt;
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let bytes = rt.block_on(req.into_body().collect()).unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }
}
