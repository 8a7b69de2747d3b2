//! The config checks, one concern per test.

use crate::{parse_yaml, ProxyConfig};

const BASE: &str =
    "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {baseUrl: 'http://127.0.0.1:8080'}\n";

fn errors(tools_yaml: &str) -> Vec<String> {
    parse_yaml(&format!("{BASE}tools:\n{tools_yaml}"))
        .unwrap_err()
        .errors
        .into_iter()
        .map(|e| e.to_string())
        .collect()
}

#[test]
fn an_output_schema_may_have_any_root_but_an_input_schema_is_an_object() {
    let ok = parse_yaml(&format!(
        "{BASE}tools:\n  - {{name: t, inputSchema: {{type: object}}, outputSchema: {{type: array, items: {{type: string}}}}, http: {{method: GET, path: /x}}}}\n"
    ));
    assert!(ok.is_ok(), "{:?}", ok.err());
    let errs = errors("  - {name: t, inputSchema: {type: array}, http: {method: GET, path: /x}}\n");
    assert!(
        errs.iter()
            .any(|e| e.contains("inputSchema") && e.contains("type: object")),
        "{errs:?}"
    );
}

#[test]
fn the_architecture_example_loads() {
    let text = include_str!("../../../../example/architecture-example.yaml");
    let cfg = parse_yaml(text).unwrap();
    assert_eq!(cfg.tools[0].name, "get_customer");
    assert_eq!(
        cfg.tools[0].response.statuses["404"].message_es.as_deref(),
        Some("No encontré al cliente")
    );
}

#[test]
fn unknown_keys_are_rejected_with_the_tool_named() {
    let e = errors("  - name: t\n    inputSchema: {type: object}\n    http: {method: GET, path: /x, methd: GET}\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("tools[0] (t).http"), "{e:?}");
    assert!(e[0].contains("unknown field `methd`"), "{e:?}");
}

#[test]
fn the_flattened_semantic_contract_still_refuses_unknown_and_mistyped_keys() {
    let e =
        errors("  - name: t\n    whenToUs: soon\n    inputSchema: {type: object}\n    http: {method: GET, path: /x}\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("tools[0] (t)") && e[0].contains("unknown field `whenToUs`"),
        "{e:?}"
    );
    let e =
        errors("  - name: t\n    whenToUse: [a]\n    inputSchema: {type: object}\n    http: {method: GET, path: /x}\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("tools[0] (t)") && e[0].contains("expected a string"),
        "{e:?}"
    );
    let schema = ProxyConfig::json_schema().to_string();
    for key in [
        "whenToUse",
        "neverUseFor",
        "identity",
        "sideEffects",
        "successCriteria",
        "fallback",
    ] {
        assert!(
            schema.contains(&format!("\"{key}\"")),
            "{key} missing from the config schema"
        );
    }
}

#[test]
fn root_type_must_be_object() {
    let e = errors("  - name: t\n    inputSchema: {type: string}\n    http: {method: GET, path: /x}\n");
    assert!(
        e[0].contains("tools[0] (t).inputSchema") && e[0].contains("type: object"),
        "{e:?}"
    );
}

#[test]
fn invalid_schema_is_rejected() {
    let e = errors(
        "  - name: t\n    inputSchema: {type: object, properties: {a: {type: 12}}}\n    http: {method: GET, path: /x}\n",
    );
    assert!(e.iter().any(|e| e.contains("not a valid JSON Schema")), "{e:?}");
}

#[test]
fn duplicate_names_and_every_problem_are_reported() {
    let e = errors(concat!(
        "  - name: t\n    inputSchema: {type: object}\n    http: {method: GET, path: /x}\n",
        "  - name: t\n    inputSchema: {type: object}\n    http: {method: GET, path: '/y/{id}', timeoutMs: 31000}\n",
    ));
    assert!(
        e.iter()
            .any(|e| e.contains("duplicate tool name `t` (first declared at tools[0])")),
        "{e:?}"
    );
    assert!(
        e.iter().any(|e| e.contains("placeholder `{id}` is not a property")),
        "{e:?}"
    );
    assert!(e.iter().any(|e| e.contains("tools[1] (t).http.timeoutMs")), "{e:?}");
}

#[test]
fn path_placeholders_must_be_required_properties() {
    let e = errors(
        "  - name: t\n    inputSchema: {type: object, properties: {id: {type: string}}}\n    http: {method: GET, path: '/y/{id}'}\n",
    );
    assert!(e[0].contains("must be listed in inputSchema.required"), "{e:?}");
}

#[test]
fn header_values_with_newlines_and_reserved_headers_are_rejected() {
    let e = errors(
        "  - name: t\n    inputSchema: {type: object}\n    http: {method: GET, path: /x, headers: {X-A: \"a\\r\\nb\", Host: evil}}\n",
    );
    assert!(e.iter().any(|e| e.contains("CR, LF")), "{e:?}");
    assert!(e.iter().any(|e| e.contains("`Host` is set by the proxy")), "{e:?}");
}

#[test]
fn bad_pointers_and_status_keys_are_rejected() {
    let e = errors(
        "  - name: t\n    inputSchema: {type: object}\n    http: {method: GET, path: /x}\n    response: {pick: [id], statuses: {'600': {status: failed}, '4xx': {status: failed}}}\n",
    );
    assert!(e.iter().any(|e| e.contains("response.pick[0]")), "{e:?}");
    assert!(e.iter().any(|e| e.contains("statuses.600")), "{e:?}");
    assert_eq!(e.len(), 2, "{e:?}");
}

#[test]
fn https_and_userinfo_upstreams_are_rejected() {
    let e = parse_yaml("apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {baseUrl: 'https://x'}\n")
        .unwrap_err();
    assert!(e.errors[0].to_string().starts_with("upstream.baseUrl"), "{e}");
}

#[test]
fn wrong_api_version_is_reported() {
    let e = parse_yaml("apiVersion: v1\nkind: ProxyConfig\nupstream: {baseUrl: 'http://x:1'}\n").unwrap_err();
    assert!(e.errors[0].to_string().contains("toolgate.dev/v1alpha1"));
}

#[test]
fn a_read_tier_tool_must_use_a_safe_method_and_be_safe() {
    // (method, tier, safety) -> None when accepted, or a fragment of the `.tier` error.
    let never = "can never be a read-tier tool";
    let unsafe_ = "a read-tier tool must be safe";
    for (method, tier, safety, expected) in [
        ("GET", "read", None, None),
        ("GET", "read", Some("read_only"), None),
        ("HEAD", "read", None, None),
        ("POST", "read", Some("read_only"), None),
        ("GET", "write", None, None),
        ("POST", "write", None, None),
        ("PUT", "write", Some("mutation"), None),
        ("DELETE", "write", None, None),
        ("POST", "read", None, Some(unsafe_)),
        ("POST", "read", Some("mutation"), Some(unsafe_)),
        ("GET", "read", Some("external_send"), Some(unsafe_)),
        ("PUT", "read", Some("read_only"), Some(never)),
        ("PUT", "read", None, Some(never)),
        ("PATCH", "read", Some("read_only"), Some(never)),
        ("DELETE", "read", Some("read_only"), Some(never)),
        ("DELETE", "read", None, Some(never)),
    ] {
        let safety = safety.map(|s| format!(", safety: {s}")).unwrap_or_default();
        let text = format!(
            "{BASE}tools:\n  - {{name: close, tier: {tier}{safety}, inputSchema: {{type: object}}, http: {{method: {method}, path: /accounts/close}}}}\n"
        );
        let case = format!("{method} tier {tier}{safety}");
        match (parse_yaml(&text), expected) {
            (Ok(_), None) => {}
            (Err(e), Some(needle)) => {
                let e: Vec<String> = e.errors.iter().map(|e| e.to_string()).collect();
                assert_eq!(e.len(), 1, "{case}: {e:?}");
                assert!(e[0].starts_with("tools[0] (close).tier: "), "{case}: {e:?}");
                assert!(e[0].contains(needle), "{case}: {e:?}");
                assert!(e[0].contains("tier: write"), "{case}: says what to do: {e:?}");
            }
            (got, want) => panic!("{case}: expected {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn read_only_mode_serves_get_and_head_and_post_only_when_allowed() {
    let cfg = parse_yaml(&format!(
        "{BASE}tools:\n  - {{name: get, inputSchema: {{type: object}}, http: {{method: GET, path: /a}}}}\n  - {{name: head, inputSchema: {{type: object}}, http: {{method: HEAD, path: /a}}}}\n  - {{name: search, tier: read, safety: read_only, inputSchema: {{type: object}}, http: {{method: POST, path: /s}}}}\n  - {{name: post, inputSchema: {{type: object}}, http: {{method: POST, path: /p}}}}\n  - {{name: get_write, tier: write, inputSchema: {{type: object}}, http: {{method: GET, path: /g}}}}\n  - {{name: put, inputSchema: {{type: object}}, http: {{method: PUT, path: /u}}}}\n"
    ))
    .unwrap();
    assert!(cfg.policy.read_only && !cfg.policy.allow_read_over_post, "defaults");
    let served = |p: &crate::PolicyConfig| -> Vec<&str> {
        cfg.tools
            .iter()
            .filter(|t| p.serves(t))
            .map(|t| t.name.as_str())
            .collect()
    };
    let mut p = cfg.policy.clone();
    assert_eq!(served(&p), ["get", "head"]);
    p.allow_read_over_post = true;
    assert_eq!(served(&p), ["get", "head", "search"]);
    p.read_only = false;
    assert_eq!(served(&p).len(), 6);
    // A PUT that claims to be a safe read is still never served read-only (configs that skip
    // validation included).
    let mut put = cfg.tools[5].clone();
    put.tier = Some(crate::Tier::Read);
    put.safety = Some(crate::Safety::ReadOnly);
    assert!(!put.served_read_only(true));
}

#[test]
fn allow_read_over_post_is_a_policy_key() {
    let cfg = parse_yaml(&format!("{BASE}policy: {{allowReadOverPost: true}}\n")).unwrap();
    assert!(cfg.policy.allow_read_over_post);
}

#[test]
fn tool_paths_cannot_name_a_host_or_hide_characters() {
    for (path, needle) in [
        ("//evil.example/x", "single `/`"),
        ("/a\\\\b", "`\\`"),
        ("/a\tb", "control"),
    ] {
        let e = errors(&format!(
            "  - {{name: t, inputSchema: {{type: object}}, http: {{method: GET, path: \"{path}\"}}}}\n"
        ));
        assert!(
            e.iter()
                .any(|e| e.starts_with("tools[0] (t).http.path") && e.contains(needle)),
            "{path}: {e:?}"
        );
    }
}

#[test]
fn upstream_base_urls_are_checked_structurally() {
    let load = |url: &str| {
        let text = format!(
            "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {{baseUrl: {}}}\n",
            serde_json::to_string(url).unwrap()
        );
        parse_yaml(&text).map(|_| ()).map_err(|e| {
            assert_eq!(e.errors.len(), 1, "{url}: {e}");
            e.errors[0].to_string()
        })
    };
    for ok in [
        "http://127.0.0.1:8080",
        "http://127.0.0.1:8080/",
        "http://shop-api.demo.svc:80",
        "http://shop-api.demo.svc.cluster.local:8080/api/v1/",
        "http://[::1]:9000/x",
        "http://localhost",
    ] {
        assert_eq!(load(ok), Ok(()), "{ok}");
    }
    for (bad, needle) in [
        ("http://127.0.0.1:38080/.demo.svc:80", "contains `:`"),
        ("http://admin@shop-api.demo.svc", "user info"),
        ("http://shop-api.demo.svc:80@127.0.0.1:38080", "user info"),
        ("http://shop-api/?x=1", "query"),
        ("http://shop-api/#x", "fragment"),
        ("http://shop-api/a/../b", "`..`"),
        ("http://shop-api/./b", "`.`"),
        ("http://%31%32%37.0.0.1", "percent-encoded"),
        ("http://evil\\@shop-api", "backslash"),
        ("http://shop api", "whitespace"),
        ("http://shop-api\n.demo", "whitespace"),
        ("http://:8080", "host"),
        ("http://127.1:8080", "dotted quad"),
        ("https://shop-api.demo.svc", "https:// upstreams are not supported"),
        ("ftp://shop-api", "scheme `ftp`"),
        ("shop-api.demo.svc:80", "scheme"),
    ] {
        let e = load(bad).expect_err(bad);
        assert!(e.starts_with("upstream.baseUrl: "), "{bad}: {e}");
        assert!(e.contains(needle), "{bad}: `{needle}` not in: {e}");
    }
}

#[test]
fn policy_references_are_checked() {
    let text = format!(
        "{BASE}policy:\n  auth: {{mode: apiKey}}\n  rateLimit: {{perTool: {{nope: {{requests: 1}}}}, trustedProxies: [bad]}}\n  audit: {{sink: file}}\ntools:\n  - {{name: t, requiredRole: root, inputSchema: {{type: object}}, http: {{method: GET, path: /x, headers: {{X-Toolgate-Tool: x}}}}}}\n"
    );
    let e: Vec<String> = parse_yaml(&text)
        .unwrap_err()
        .errors
        .iter()
        .map(|e| e.to_string())
        .collect();
    for needle in [
        "policy.auth.credentialsFile",
        "policy.rateLimit.perTool.nope",
        "policy.rateLimit.trustedProxies[0]",
        "policy.audit.path",
        "tools[0] (t).requiredRole: `root` is not one of policy.roles",
        "tools[0] (t).http.headers.X-Toolgate-Tool",
    ] {
        assert!(e.iter().any(|e| e.contains(needle)), "{needle} missing in {e:#?}");
    }
}

#[test]
fn unusable_limits_fall_back_to_defaults_with_warnings() {
    let text = format!(
        "{BASE}policy:\n  rateLimit:\n    perIp: {{requests: 0, windowSeconds: abc}}\n    perIdentity: {{requests: '30'}}\n    maxKeys: -5\n"
    );
    let cfg = parse_yaml(&text).unwrap();
    let (limits, warnings) = cfg.resolved_limits();
    assert_eq!((limits.per_ip.requests, limits.per_ip.window_seconds), (120, 60));
    assert_eq!(
        (limits.per_identity.requests, limits.per_identity.window_seconds),
        (30, 60)
    );
    assert_eq!(limits.max_keys, 50_000);
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(warnings[0].contains("policy.rateLimit.perIp.requests"), "{warnings:?}");
}

#[test]
fn unquoted_numeric_status_keys_work() {
    let cfg = parse_yaml(&format!(
        "{BASE}tools:\n  - name: t\n    inputSchema: {{type: object}}\n    http: {{method: GET, path: /x}}\n    response: {{statuses: {{404: {{status: needs_more_info}}}}}}\n"
    ))
    .unwrap();
    assert!(cfg.tools[0].response.statuses.contains_key("404"));
}

#[test]
fn published_description_has_the_contract_in_order() {
    let cfg = parse_yaml(&format!(
        "{BASE}tools:\n  - name: t\n    description: Does X.\n    fallback: Ask.\n    whenToUse: When Y.\n    inputSchema: {{type: object}}\n    http: {{method: GET, path: /x}}\n"
    ))
    .unwrap();
    assert_eq!(
        cfg.tools[0].published_description(),
        "Does X.\n\nWhen to use:\nWhen Y.\n\nFallback:\nAsk."
    );
}

#[test]
fn hints_tier_and_safety_follow_the_method() {
    let cfg = parse_yaml(&format!(
        "{BASE}tools:\n  - {{name: a, inputSchema: {{type: object}}, http: {{method: GET, path: /x}}}}\n  - {{name: b, inputSchema: {{type: object}}, http: {{method: DELETE, path: /x}}}}\n  - {{name: c, inputSchema: {{type: object}}, http: {{method: POST, path: /x}}, annotations: {{idempotentHint: true}}}}\n"
    ))
    .unwrap();
    let [a, b, c] = [&cfg.tools[0], &cfg.tools[1], &cfg.tools[2]];
    let (ha, hb, hc) = (
        a.effective_annotations(),
        b.effective_annotations(),
        c.effective_annotations(),
    );
    assert_eq!(
        (ha.read_only_hint, ha.idempotent_hint, ha.destructive_hint),
        (Some(true), Some(true), Some(false))
    );
    assert_eq!(
        (hb.read_only_hint, hb.idempotent_hint, hb.destructive_hint),
        (Some(false), Some(true), Some(true))
    );
    assert_eq!((hc.read_only_hint, hc.idempotent_hint), (Some(false), Some(true)));
    assert_eq!(a.effective_tier(), crate::Tier::Read);
    assert_eq!(b.effective_safety(), crate::Safety::Destructive);
    assert_eq!(c.effective_tier(), crate::Tier::Write);
}
