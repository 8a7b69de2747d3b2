//! The one-pass reading against the tree's, byte for byte: what it reads and what it refuses.

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
