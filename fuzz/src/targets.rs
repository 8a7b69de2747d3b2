//! The targets that call one parser directly (the HTTP target is in [`crate::http`]).

use std::net::IpAddr;
use std::sync::OnceLock;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{json, Value};
use toolgate_config::pointer::Pointer;
use toolgate_config::{schema, Cidr};
use toolgate_proxy::mcp::{args, message, peek, sealed};
use toolgate_proxy::policy::{clientip, credentials::Credentials, jwt};
use toolgate_proxy::upstream::pick::{self, Pick};
use toolgate_proxy::upstream::{mapping, shape};
use toolgate_proxy::{audit, trace::TraceContext, Runtime};

use crate::{split_line, text};

/// `peek::scan` (what the proxy reads from a body it will not parse whole: too large, cut off,
/// malformed, for the refusal's audit record) never reports a method, id or tool other than the
/// full parse's when the body is a whole JSON object. It may report less: it stops where the
/// message stops reading as one (a `params` that is not an object). Keys given twice are left
/// out: the full parse keeps the last, the scan the last it reached.
/// And the endpoint's one-pass reading of a message (`message::reading`: the members it acts on,
/// `params` without `_meta`, `_meta` typed) is, byte for byte, what the same lookups in the
/// whole parse give, and a body it refuses is refused with serde_json's own message.
pub fn jsonrpc_scan(data: &[u8]) {
    assert_eq!(message::reading(data), message::tree_reading(data), "{}", text(data));
    let found = peek::scan(data);
    let Ok(Value::Object(msg)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let once = |key: &str| {
        data.windows(key.len() + 2)
            .filter(|w| w[1..w.len() - 1] == *key.as_bytes() && w[0] == b'"')
            .count()
            <= 1
    };
    let short = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .map(|s| s.chars().take(128).collect::<String>())
    };
    if found.method.is_some() && once("method") {
        assert_eq!(found.method, short(msg.get("method")), "method");
    }
    if found.id.is_some() && once("id") {
        assert_eq!(found.id.as_ref(), msg.get("id"), "id");
    }
    if found.tool.is_some() && once("params") && once("name") {
        assert_eq!(
            found.tool,
            short(msg.get("params").and_then(|p| p.get("name"))),
            "params.name"
        );
    }
}

/// A ProxyConfig in YAML or JSON: parsed, validated and compiled; one that compiles survives a
/// round trip through JSON (the operator renders configs that way) and compiles again.
pub fn config(data: &[u8]) {
    let text = text(data);
    let parsed = if text.trim_start().starts_with('{') {
        toolgate_config::parse_json(&text)
    } else {
        toolgate_config::parse_yaml(&text)
    };
    let Ok(cfg) = parsed else { return };
    let Ok(rt) = Runtime::compile(cfg, 1) else { return };
    let value = serde_json::to_value(&rt.config).expect("a loaded config serializes");
    let again = toolgate_config::from_value(value.clone())
        .unwrap_or_else(|e| panic!("a compiled config must load again from its own JSON: {e}\n{value}"));
    if let Err(e) = Runtime::compile(again, 2) {
        panic!("a compiled config must compile again from its own JSON: {e}\n{value}");
    }
}

/// A credentials file (keys, roles, expiry dates, custom headers).
pub fn credentials(data: &[u8]) {
    let roles = ["viewer".to_string(), "operator".to_string(), "admin".to_string()];
    let headers = ["x-tenant".to_string(), "x-signature".to_string()];
    let _ = Credentials::parse(&text(data), &roles, &headers);
}

fn mapping_runtime(path: &str, query: &str, header: &str) -> Option<Runtime> {
    let cfg = json!({
        "apiVersion": "toolgate.dev/v1alpha1",
        "kind": "ProxyConfig",
        "upstream": {"baseUrl": "http://127.0.0.1:9/api/"},
        "tools": [{
            "name": "t",
            "inputSchema": {"type": "object"},
            "http": {"method": "POST", "path": path, "query": {"q": query, "r": "{r}"}, "headers": {"X-A": header}},
        }],
    });
    Runtime::compile(toolgate_config::from_value(cfg).ok()?, 1).ok()
}

/// RFC 3986 §5.2.4 on a path whose `%XX` escapes were decoded once (as an upstream such as
/// nginx does before it normalises).
fn normalized(path: &str) -> String {
    let decoded = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
    let mut out: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    out.join("/")
}

/// Line 1 the path template, line 2 a query value template, line 3 a header value template,
/// the rest the arguments (JSON). A built request never leaves the upstream's origin or base
/// path and holds no CR, LF or other control character in its URL or headers.
pub fn mapping(data: &[u8]) {
    let text = text(data);
    let (path, rest) = split_line(&text);
    let (query, rest) = split_line(rest);
    let (header, args) = split_line(rest);
    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(args) else {
        return;
    };
    let Some(rt) = mapping_runtime(path, query, header) else {
        return;
    };
    let tool = rt.tool("t").expect("the one tool");
    let Ok(req) = mapping::build(tool, &args, &rt.upstream, &[]) else {
        return;
    };
    let uri = req.uri();
    assert_eq!(uri.scheme_str(), Some("http"));
    assert_eq!(uri.authority().map(|a| a.as_str()), Some("127.0.0.1:9"), "{uri}");
    let s = uri.to_string();
    assert!(!s.bytes().any(|b| b.is_ascii_control()), "control character in {s:?}");
    assert!(uri.path().starts_with("/api/"), "{uri}");
    // Dot segments in the template itself are the operator's choice; the arguments' may never
    // climb out of the base path.
    if !path.contains('.') && !path.contains('%') {
        assert!(normalized(uri.path()).starts_with("/api"), "{uri} escapes /api/");
    }
    for (name, value) in req.headers() {
        assert!(
            !value.as_bytes().iter().any(|b| *b == b'\r' || *b == b'\n' || *b == 0),
            "{name}: {value:?}"
        );
    }
}

/// Line 1 a pointer, the rest a JSON document: `pick` and `redacted` never panic, a value
/// the standard RFC 6901 lookup finds is always redacted, the text an audit record carries
/// (`redacted_json`) is the redacted tree's, and a pointer without `*` picks the
/// same reading the body's text ([`pick::read`]) as from the parsed document.
pub fn pointer(data: &[u8]) {
    let text = text(data);
    let (p, body) = split_line(&text);
    let Ok(pointer) = Pointer::parse(p) else { return };
    let compiled = Pick::new(vec![pointer.clone()]);
    let read = match &compiled {
        Pick::Tree(members) => pick::read(body.as_bytes(), members),
        _ => None,
    };
    let doc = match serde_json::from_str::<Value>(body) {
        Ok(doc) => doc,
        Err(e) => {
            // Members a tool drops are checked as JSON text, not built: only a value no tree
            // can hold (nesting past serde_json's limit, a number past f64, an unpaired
            // surrogate escape) may be in one.
            let e = e.to_string();
            let unbuildable = [
                "recursion limit",
                "number out of range",
                "surrogate",
                "hex escape",
                "unicode code point",
            ];
            assert!(
                read.is_none() || unbuildable.iter().any(|u| e.contains(u)),
                "text that is not JSON is refused ({e}): {body}"
            );
            return;
        }
    };
    let picked = shape::pick(&doc, std::slice::from_ref(&pointer));
    if let Pick::Tree(members) = &compiled {
        assert_eq!(read, doc.is_object().then(|| picked.clone()), "{p} of {body}");
        if doc.is_object() {
            assert_eq!(pick::pick_value(&doc, members), picked, "{p} of {doc}");
        }
    }
    let red = audit::redacted(&doc, std::slice::from_ref(&pointer));
    // What a record writes is what the tree reference serializes to.
    assert_eq!(
        audit::redacted_json(&doc, std::slice::from_ref(&pointer)),
        red.to_string(),
        "{p} of {doc}"
    );
    let _ = args::field_of(&doc, p);
    if pointer.tokens.iter().all(Option::is_some) && doc.pointer(p).is_some() {
        assert_eq!(red.pointer(p), Some(&json!("[REDACTED]")), "{p} in {doc}");
    }
}

/// Line 1 trusted CIDRs (comma-separated), line 2 the TCP peer, every further line one
/// `X-Forwarded-For` value: the client is the peer, or a hop one of those values names; an
/// untrusted peer is always the client.
pub fn client_ip(data: &[u8]) {
    let text = text(data);
    let (cidrs, rest) = split_line(&text);
    let (peer, xff) = split_line(rest);
    let mut trusted = Vec::new();
    for c in cidrs.split(',') {
        if let Ok(cidr) = c.parse::<Cidr>() {
            let net: IpAddr = c
                .split('/')
                .next()
                .unwrap_or("")
                .trim()
                .parse()
                .expect("it parsed as a CIDR");
            assert!(cidr.contains(net), "{c} does not contain its own address");
            trusted.push(cidr);
        }
    }
    let Ok(peer) = peer.trim().parse::<IpAddr>() else {
        return;
    };
    let values: Vec<&str> = xff.lines().collect();
    let ip = clientip::client_ip(peer, values.iter().copied(), &trusted);
    if !trusted.iter().any(|c| c.contains(peer)) {
        assert_eq!(ip, peer);
    }
    if ip != peer {
        let named = values.iter().flat_map(|v| v.split(',')).any(|hop| {
            hop.contains(&ip.to_string()) || {
                let h = hop.trim().trim_start_matches('[');
                h.split([']', '%']).next().and_then(|a| a.parse::<IpAddr>().ok()) == Some(ip)
                    || h.rsplit_once(':').and_then(|(a, _)| a.parse::<IpAddr>().ok()) == Some(ip)
            }
        });
        assert!(named, "{ip} is neither the peer {peer} nor a hop of {values:?}");
    }
}

/// A `traceparent` header: when it is continued, the trace id is the header's and the value
/// sent upstream is itself a valid `traceparent` of the same trace.
pub fn trace_context(data: &[u8]) {
    let text = text(data);
    let ctx = TraceContext::from_header(Some(&text));
    let sent = ctx.traceparent();
    let again = TraceContext::continuing(&sent).unwrap_or_else(|| panic!("{sent} is not a valid traceparent"));
    assert_eq!(again.trace_id, ctx.trace_id);
    if let Some(c) = TraceContext::continuing(&text) {
        let tid = text
            .trim()
            .split('-')
            .nth(1)
            .expect("a continued header has a trace id");
        assert_eq!(c.trace_id_hex(), tid.to_ascii_lowercase());
    }
}

/// The fixed Ed25519 key the JWT target signs with (a fixed seed, so seeds stay valid).
fn jwt_key() -> &'static (Ed25519KeyPair, Vec<jwt::Jwk>) {
    static KEY: OnceLock<(Ed25519KeyPair, Vec<jwt::Jwk>)> = OnceLock::new();
    KEY.get_or_init(|| {
        let pair = Ed25519KeyPair::from_seed_unchecked(&[7u8; 32]).expect("a 32-byte seed");
        let jwks = json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1", "alg": "EdDSA",
            "x": URL_SAFE_NO_PAD.encode(pair.public_key().as_ref())}]});
        let keys = jwt::parse_jwks(&jwks.to_string()).expect("the fixed JWKS parses");
        (pair, keys)
    })
}

/// Issuer, audience and time the JWT target expects (`now` fixed so seeds stay valid).
pub const JWT_ISSUER: &str = "https://idp.example";
/// See [`JWT_ISSUER`].
pub const JWT_AUDIENCE: &str = "toolgate";
/// See [`JWT_ISSUER`].
pub const JWT_NOW: i64 = 1_800_000_000;

/// Signs `header` and `claims` (their exact text) with the fixed key.
pub fn jwt_sign(header: &str, claims: &str) -> String {
    let msg = format!("{}.{}", URL_SAFE_NO_PAD.encode(header), URL_SAFE_NO_PAD.encode(claims));
    let sig = jwt_key().0.sign(msg.as_bytes());
    format!("{msg}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
}

/// A token, or (first byte `!`) a header line and a claims text that the target signs with the
/// key the verifier trusts, so the header and claim checks behind the signature are reached. An
/// accepted token always meets every expectation.
pub fn jwt(data: &[u8]) {
    let text = text(data);
    let token = match text.strip_prefix('!') {
        Some(rest) => {
            let (header, claims) = split_line(rest);
            jwt_sign(header, claims)
        }
        None => text.to_string(),
    };
    let _ = jwt::peek_kid(&token);
    let algorithms = ["EdDSA".to_string(), "ES256".to_string()];
    let types = ["at+jwt".to_string(), String::new()];
    let want = jwt::Expectations {
        issuer: JWT_ISSUER,
        audience: JWT_AUDIENCE,
        algorithms: &algorithms,
        token_types: &types,
        leeway: 30,
        now: JWT_NOW,
    };
    let Ok(claims) = jwt::verify_token(&token, &jwt_key().1, &want) else {
        return;
    };
    let header: Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(token.split('.').next().unwrap_or(""))
            .expect("an accepted token has a base64url header"),
    )
    .expect("an accepted token has a JSON header");
    assert_eq!(header["alg"], "EdDSA", "accepted with {header}");
    assert_eq!(claims.get("iss"), Some(&json!(JWT_ISSUER)), "{claims:?}");
    let aud_ok = match claims.get("aud") {
        Some(Value::String(a)) => a == JWT_AUDIENCE,
        Some(Value::Array(a)) => a.iter().any(|v| v == JWT_AUDIENCE),
        _ => false,
    };
    assert!(aud_ok, "audience: {claims:?}");
    let exp = claims
        .get("exp")
        .and_then(Value::as_i64)
        .expect("an accepted token has a numeric exp");
    // The proxy accepts `now <= exp + leeway`.
    assert!(exp + 30 >= JWT_NOW, "expired: {claims:?}");
    if let Some(nbf) = claims.get("nbf").and_then(Value::as_i64) {
        assert!(nbf - 30 <= JWT_NOW, "not yet valid: {claims:?}");
    }
    let _ = jwt::scopes(&claims);
    let _ = jwt::agent(&claims);
}

/// A JWKS document.
pub fn jwks(data: &[u8]) {
    if let Ok(keys) = jwt::parse_jwks(&text(data)) {
        assert!(
            !keys.is_empty() || text(data).contains("[]"),
            "a JWKS that parsed to no key"
        );
    }
}

fn session_keys() -> &'static sealed::SessionKeys {
    static KEYS: OnceLock<sealed::SessionKeys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let key = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
        sealed::SessionKeys::parse(&key).expect("the fixed key parses")
    })
}

/// A session id the proxy sealed with the fixed key (for the HTTP target's legacy requests).
pub fn sealed_session(version: &str) -> String {
    let now = JWT_NOW as u64 + 10_000_000;
    session_keys().seal(&sealed::Claims {
        handle: sealed::random_handle(),
        subject: sealed::subject_digest("anonymous"),
        version: version.into(),
        client_name: Some("fuzz".into()),
        client_version: None,
        rank: 0,
        issued: 0,
        expires: now * 2,
    })
}

/// The fixed session key, base64 (the HTTP target's key file).
pub fn session_key_text() -> String {
    base64::engine::general_purpose::STANDARD.encode([9u8; 32])
}

/// A session id, a key file (first byte `#`), or
/// claims (first byte `{`) that seal and open to themselves.
pub fn session_id(data: &[u8]) {
    let text = text(data);
    if text.starts_with('#') {
        if let Ok(keys) = sealed::SessionKeys::parse(&text) {
            let claims = sample_claims();
            assert_eq!(keys.open(&keys.seal(&claims)), Some(claims));
        }
        return;
    }
    if text.starts_with('{') {
        // The proxy bounds what it seals (a negotiated version, names cut to 128 characters);
        // claims past that bound are not its input.
        if let Ok(claims) = serde_json::from_str::<sealed::Claims>(&text) {
            if serde_json::to_string(&claims).map_or(0, |c| c.len()) <= 600 {
                let id = session_keys().seal(&claims);
                assert_eq!(session_keys().open(&id), Some(claims));
            }
        }
        return;
    }
    // Only ids sealed with the key open (a seed is one); what opens re-seals to itself.
    if let Some(claims) = session_keys().open(&text) {
        assert!(text.starts_with(sealed::PREFIX), "opened {text:?}");
        assert_eq!(session_keys().open(&session_keys().seal(&claims)), Some(claims));
    }
}

fn sample_claims() -> sealed::Claims {
    sealed::Claims {
        handle: "00".repeat(16),
        subject: sealed::subject_digest("k"),
        version: "2025-06-18".into(),
        client_name: None,
        client_version: None,
        rank: 1,
        issued: 1,
        expires: 2,
    }
}

/// Two JSON values, a schema then an instance: the validator never panics, the fast check
/// and the error walk always agree, and so do the small- and large-request modes.
pub fn validator(data: &[u8]) {
    let mut values = serde_json::Deserializer::from_slice(data).into_iter::<Value>();
    let (Some(Ok(schema)), Some(Ok(instance))) = (values.next(), values.next()) else {
        return;
    };
    let Ok(v) = schema::compile(&schema, &schema::Patterns::default()) else {
        return;
    };
    let valid = v.is_valid(&instance);
    let all = args::validate_with(&v, &instance, true);
    let first = args::validate_with(&v, &instance, false);
    assert_eq!(
        valid,
        all.is_empty(),
        "is_valid and the error walk disagree on {instance} for {schema}"
    );
    assert_eq!(
        valid,
        first.is_empty(),
        "the small and large modes disagree on {instance} for {schema}"
    );
    if !valid {
        assert!(
            v.iter_errors(&instance).next().is_some(),
            "invalid but no error for {instance}"
        );
    }
    // A JSON text where the schema wants an object is refused, and the message says so.
    if schema.get("type") == Some(&json!("object")) {
        if let Value::Object(m) = &instance {
            let as_text = Value::String(Value::Object(m.clone()).to_string());
            assert!(
                !args::validate_with(&v, &as_text, true).is_empty(),
                "a JSON string passed as an object"
            );
        }
    }
}
