//! Seed inputs, taken from what the tests send: `cargo run -p toolgate-fuzz --bin seed` writes
//! them into `fuzz/corpus/TARGET/` (checked in; libFuzzer adds what it finds beside them).

use serde_json::json;

use crate::targets::{jwt_sign, JWT_AUDIENCE, JWT_ISSUER, JWT_NOW};

fn modern(method: &str, name: Option<&str>, params: serde_json::Value) -> Vec<u8> {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "fuzz", "version": "1"},
    });
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let mut head = format!("MCP-Protocol-Version: 2026-07-28\nMcp-Method: {method}\n");
    if let Some(n) = name {
        head.push_str(&format!("Mcp-Name: {n}\n"));
    }
    format!("{head}\n{body}").into_bytes()
}

fn legacy(body: serde_json::Value) -> Vec<u8> {
    format!("MCP-Protocol-Version: 2025-06-18\nMcp-Session-Id: $SESSION\n\n{body}").into_bytes()
}

fn call(name: &str, args: serde_json::Value) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": args}})
}

/// The HTTP target's seeds.
pub fn http_mcp() -> Vec<Vec<u8>> {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "whaapy", "version": "1"}}});
    vec![
        init.to_string().into_bytes(),
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}})
        .to_string()
        .into_bytes(),
        legacy(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
        legacy(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})),
        legacy(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"cursor": "abc"}})),
        legacy(json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})),
        legacy(call("get_customer", json!({"customerId": "42"}))),
        legacy(call("get_customer", json!({"customerId": "404"}))),
        legacy(call("search_customers", json!({"query": "Ana", "maxResults": 5}))),
        legacy(call("create_ticket", json!({"customerId": "42", "subject": "Broken", "priority": "high",
            "metadata": {"channel": "whatsapp"}}))),
        legacy(call("create_ticket", json!({"customerId": "42", "subject": "Broken", "metadata": "{\"a\":1}"}))),
        legacy(call("submit_payment", json!({"customerId": "42", "amount": 10.5,
            "trackingKeyCandidates": [{"value": "X", "confidence": "high"}]}))),
        legacy(call("nope", json!({}))),
        legacy(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}})),
        legacy(json!({"jsonrpc": "2.0", "id": 3, "method": "resources/list"})),
        legacy(json!({"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel", "params": {"level": "debug"}})),
        legacy(json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])),
        b"@GET /mcp\nMCP-Protocol-Version: 2025-06-18\nMcp-Session-Id: $SESSION\nAccept: text/event-stream\n\n".to_vec(),
        b"@DELETE /mcp\nMCP-Protocol-Version: 2025-06-18\nMcp-Session-Id: $SESSION\n\n".to_vec(),
        b"@GET /healthz\n\n".to_vec(),
        b"@GET /.well-known/oauth-protected-resource\n\n".to_vec(),
        format!(
            "MCP-Protocol-Version: 2025-06-18\nMcp-Session-Id: $SESSION\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\ntracestate: a=b\nX-Forwarded-For: 203.0.113.7, 127.0.0.1\nOrigin: http://localhost\n\n{}",
            call("get_customer", json!({"customerId": "42"}))
        )
        .into_bytes(),
        modern("server/discover", None, json!({})),
        modern("tools/list", None, json!({})),
        modern("tools/call", Some("get_customer"), json!({"name": "get_customer", "arguments": {"customerId": "42"}})),
        modern(
            "tools/call",
            Some("create_ticket"),
            json!({"name": "create_ticket", "arguments": {"customerId": "1", "subject": "abc"}}),
        ),
        modern("tools/call", Some("get_customer"), json!({"name": "search_customers", "arguments": {}})),
        modern("ping", None, json!({})),
        modern("subscriptions/listen", None, json!({})),
        modern("resources/list", None, json!({})),
        modern("completion/complete", None, json!({"ref": {"type": "ref/prompt", "name": "x"}, "argument": {"name": "a", "value": "b"}})),
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"".to_vec(),
        b"not json".to_vec(),
    ]
}

/// The config target's seeds: every shipped ProxyConfig.
pub fn config() -> Vec<Vec<u8>> {
    let json_cfg = json!({"apiVersion": "toolgate.dev/v1alpha1", "kind": "ProxyConfig",
        "upstream": {"baseUrl": "http://127.0.0.1:8080"},
        "policy": {"readOnly": false, "auth": {"mode": "apiKey"}},
        "tools": [{"name": "t", "inputSchema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$"}}},
            "http": {"method": "GET", "path": "/t/{a}"}}]});
    vec![
        include_bytes!("../../example/proxy.yaml").to_vec(),
        include_bytes!("../../example/architecture-example.yaml").to_vec(),
        serde_json::to_vec(&json_cfg).expect("json"),
    ]
}

/// The credentials target's seeds.
pub fn credentials() -> Vec<Vec<u8>> {
    vec![
        b"credentials:\n  - id: whaapy-prod\n    sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n    role: operator\n    tools: [\"get_*\", \"search_*\"]\n    expiresAt: 2027-01-01T00:00:00Z\n  - id: partner\n    headers: {X-Tenant: acme, X-Signature: s3cr3t}\n".to_vec(),
        b"credentials:\n  - {id: a, key: a-long-enough-plain-key-123}\n".to_vec(),
        br#"{"credentials": [{"id": "j", "key": "0123456789abcdef0123", "role": "admin", "expiresAt": "2026-02-29T23:59:60+01:00"}]}"#.to_vec(),
    ]
}

/// The mapping target's seeds.
pub fn mapping() -> Vec<Vec<u8>> {
    vec![
        b"/customers/{id}\n{q}\n{h}\n{\"id\":\"42\",\"q\":\"a b\",\"h\":\"x\",\"r\":[1,2]}".to_vec(),
        b"/c/{id}/x/{n}\nfixed\n{h}\n{\"id\":\"..\",\"n\":5,\"h\":\"a\\r\\nb\"}".to_vec(),
        b"/c/{id}\n{q}\n{h}\n{\"id\":\"%2e%2e\",\"q\":{\"a\":1},\"h\":\"\\u0000\"}".to_vec(),
    ]
}

/// The pointer target's seeds.
pub fn pointer() -> Vec<Vec<u8>> {
    vec![
        b"/a/b~1c/0\n{\"a\":{\"b/c\":[1,2]}}".to_vec(),
        b"/items/*/secret\n{\"items\":[{\"secret\":1},{\"secret\":2}]}".to_vec(),
        b"\n{\"x\":1}".to_vec(),
        b"/~0/01\n{\"~\":[0,1,2]}".to_vec(),
    ]
}

/// The client-ip target's seeds.
pub fn client_ip() -> Vec<Vec<u8>> {
    vec![
        b"10.0.0.0/8,fd00::/8\n10.1.2.3\n203.0.113.9, 10.0.0.2\n192.0.2.1".to_vec(),
        b"127.0.0.1\n127.0.0.1\n[2001:db8::1]:443,1.2.3.4:80".to_vec(),
        b"0.0.0.0/0\n::ffff:10.0.0.1\nunknown".to_vec(),
    ]
}

/// The trace-context target's seeds.
pub fn trace_context() -> Vec<Vec<u8>> {
    vec![
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_vec(),
        b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-00".to_vec(),
        b"00-00000000000000000000000000000000-00f067aa0ba902b7-01".to_vec(),
        b" 01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra".to_vec(),
    ]
}

/// The JWT target's seeds: valid tokens of the fixed key and header/claims pairs to sign.
pub fn jwt() -> Vec<Vec<u8>> {
    let claims = json!({"iss": JWT_ISSUER, "aud": [JWT_AUDIENCE, "other"], "sub": "u1", "exp": JWT_NOW + 600,
        "nbf": JWT_NOW - 10, "iat": JWT_NOW - 10, "scope": "tools:call", "act": {"sub": "agent-7"}});
    let header = json!({"alg": "EdDSA", "typ": "at+jwt", "kid": "k1"}).to_string();
    vec![
        jwt_sign(&header, &claims.to_string()).into_bytes(),
        format!("!{header}\n{claims}").into_bytes(),
        format!("!{}\n{}", json!({"alg": "none"}), claims).into_bytes(),
        format!(
            "!{}\n{}",
            json!({"alg": "EdDSA", "kid": "k2", "typ": "JWT"}),
            json!({"iss": JWT_ISSUER, "aud": JWT_AUDIENCE, "exp": 1e300})
        )
        .into_bytes(),
        b"eyJhbGciOiJub25lIn0.eyJpc3MiOiJ4In0.".to_vec(),
    ]
}

/// The JWKS target's seeds.
pub fn jwks() -> Vec<Vec<u8>> {
    vec![
        br#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#.to_vec(),
        br#"{"keys":[{"kty":"EC","crv":"P-256","kid":"e","alg":"ES256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#.to_vec(),
        br#"{"keys":[{"kty":"RSA","kid":"r","n":"sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw","e":"AQAB"}]}"#.to_vec(),
        br#"{"keys":[]}"#.to_vec(),
    ]
}

/// The session-id target's seeds.
pub fn session_id() -> Vec<Vec<u8>> {
    vec![
        crate::targets::sealed_session("2025-06-18").into_bytes(),
        b"tg1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".to_vec(),
        b"#keys\nCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=\nBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\n".to_vec(),
        br#"{"h":"00000000000000000000000000000000","s":"x","p":"2025-06-18","n":"c","r":2,"i":1,"e":2}"#.to_vec(),
    ]
}

/// The validator target's seeds: schemas like the shipped tools', with good and bad values.
pub fn validator() -> Vec<Vec<u8>> {
    let pairs = [
        (
            json!({"type": "object", "required": ["a"], "properties": {"a": {"type": "string", "pattern": "^[0-9]+$"}}}),
            json!({"a": "12"}),
        ),
        (
            json!({"type": "object", "additionalProperties": false, "properties": {"p": {"enum": ["low", "high"]}}}),
            json!({"p": "mid", "x": 1}),
        ),
        (
            json!({"type": "object", "properties": {"m": {"type": "object"}}}),
            json!({"m": "{\"a\":1}"}),
        ),
        (
            json!({"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}),
            json!({"c": {"c": {"c": 1}}}),
        ),
        (
            json!({"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 3}),
            json!([1, -1, 2, 3]),
        ),
        (
            json!({"anyOf": [{"type": "string", "format": "email"}, {"type": "number", "exclusiveMinimum": 0}]}),
            json!(0),
        ),
    ];
    pairs.iter().map(|(s, v)| format!("{s}\n{v}").into_bytes()).collect()
}

/// The JSON-RPC scan target's seeds.
pub fn jsonrpc_scan() -> Vec<Vec<u8>> {
    vec![
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_customer","arguments":{}}}"#.to_vec(),
        br#"{"id":"x","params":{"arguments":{"name":1},"name":"t"},"method":"tools/call","method":"ping"}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":1.5e3,"method":"tools/call","params":{"name":"get_cust"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"roots":{}},"io.modelcontextprotocol/clientInfo":{"name":"c","version":"1"},"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"a=b","progressToken":1},"name":"t","arguments":{"_meta":{}},"_meta":"x"}}"#.to_vec(),
    ]
}

/// Every target's seeds, by target name.
pub fn all() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    vec![
        ("http_mcp", http_mcp()),
        ("jsonrpc_scan", jsonrpc_scan()),
        ("config", config()),
        ("credentials", credentials()),
        ("mapping", mapping()),
        ("pointer", pointer()),
        ("client_ip", client_ip()),
        ("trace_context", trace_context()),
        ("jwt", jwt()),
        ("jwks", jwks()),
        ("session_id", session_id()),
        ("validator", validator()),
    ]
}
