//! `toolgate-proxy import openapi`: the example service's spec becomes tools that serve real
//! calls against the real service, with every mapping form the import writes (path, query and
//! header parameters, a flattened body, a whole-body argument); the skipped operation is named
//! with its reason, and a re-import is byte for byte the same.

mod common;

use common::Session;
use serde_json::{json, Value};
use toolgate_proxy::import::{self, Format, Options, Outcome};
use toolgate_proxy::{start, StartOptions};

const SPEC: &str = include_str!("../../example/openapi.yaml");

fn options(format: Format) -> Options {
    Options {
        server: "shop".into(),
        format,
        source: "openapi.yaml".into(),
        ..Options::default()
    }
}

#[test]
fn the_example_spec_imports_every_json_operation_and_names_the_rest() {
    let doc = import::parse(SPEC).unwrap();
    let result = import::import(doc.clone(), &options(Format::McpTool)).unwrap();
    let names: Vec<&str> = result.tools().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "getCustomer",
            "searchCustomers",
            "createTicket",
            "deleteTicket",
            "submitPayment",
            "echoBatch"
        ]
    );
    let skipped: Vec<(&str, &str)> = result.skipped().map(|(o, r)| (o.route.as_str(), r)).collect();
    assert_eq!(
        skipped,
        [("POST /attachments", "the request body is multipart/form-data, not JSON")]
    );
    assert!(result
        .text
        .contains("# skipped POST /attachments (uploadAttachment): the request body is multipart/form-data, not JSON"));

    let tool = |n: &str| result.tools().find(|t| t.name == n).unwrap().clone();
    // 3.0 idioms become JSON Schema: exclusive bounds, nullable.
    let pay = tool("submitPayment");
    let amount = &pay.input_schema["properties"]["amount"];
    assert_eq!(amount["exclusiveMinimum"].as_f64(), Some(0.0), "{amount}");
    assert!(amount.get("minimum").is_none(), "{amount}");
    assert_eq!(
        pay.input_schema["properties"]["reference"]["type"],
        json!(["string", "null"])
    );
    assert_eq!(pay.input_schema["required"], json!(["customerId", "amount"]));
    // A `$ref`'d body object is flattened; its closed shape closes the arguments.
    let ticket = tool("createTicket");
    assert_eq!(ticket.input_schema["additionalProperties"], json!(false));
    assert_eq!(ticket.input_schema["required"], json!(["customerId", "subject"]));
    assert_eq!(
        ticket.output_schema.as_ref().unwrap()["required"],
        json!(["ticketId", "status"])
    );
    // An array body is one argument.
    let echo = serde_json::to_value(tool("echoBatch").http).unwrap();
    assert_eq!(echo["body"], json!({"argument": "body"}));
    assert_eq!(echo["headers"], json!({"X-Channel": "{X_Channel}"}));
    assert!(result
        .text
        .contains("# note: header parameter `X-Request-Id` left out: the proxy sets it"));
    // Read and write tiers come from the method.
    assert_eq!(tool("getCustomer").annotations.unwrap().read_only_hint, Some(true));
    assert_eq!(tool("deleteTicket").annotations.unwrap().destructive_hint, Some(true));

    // McpTool documents name their server; a re-import is the same text.
    assert!(result.text.contains("kind: McpTool"));
    assert!(result.text.contains("name: shop-createticket"));
    assert_eq!(
        import::import(doc, &options(Format::McpTool)).unwrap().text,
        result.text
    );
}

#[test]
fn filters_pick_operations_by_id_tag_and_path() {
    let doc = import::parse(SPEC).unwrap();
    let names = |include: &[&str], exclude: &[&str]| -> Vec<String> {
        let mut o = options(Format::ProxyConfig);
        o.filter.include = include.iter().map(|s| s.to_string()).collect();
        o.filter.exclude = exclude.iter().map(|s| s.to_string()).collect();
        import::import(doc.clone(), &o)
            .unwrap()
            .tools()
            .map(|t| t.name.clone())
            .collect()
    };
    assert_eq!(names(&["tag:customers"], &[]), ["getCustomer", "searchCustomers"]);
    assert_eq!(names(&["/tickets*"], &["delete*"]), ["createTicket"]);
    assert_eq!(names(&["*Payment"], &[]), ["submitPayment"]);
    assert!(names(&["nothing-matches"], &[]).is_empty());
}

#[test]
fn specs_that_are_not_openapi_3_are_refused_with_the_reason() {
    let err = |text: &str| import::import(import::parse(text).unwrap(), &options(Format::McpTool)).unwrap_err();
    assert!(err("swagger: '2.0'\ninfo: {title: t, version: '1'}\npaths: {}\n").contains("Swagger 2.0"));
    assert!(err("openapi: 4.0.0\n").contains("OpenAPI 4.0.0 is not supported"));
    assert!(err("{\"info\": {}}").contains("no top-level `openapi`"));
    assert!(err("openapi: 3.0.3\ninfo: {title: t}\npaths: {}\n").contains("not a valid OpenAPI 3.0 document"));
    assert!(import::parse("{not json").unwrap_err().contains("not valid JSON"));
    let external = "openapi: 3.1.0\ninfo: {title: t, version: '1'}\npaths:\n  /a:\n    get:\n      operationId: a\n      parameters: [{$ref: 'other.yaml#/p'}]\n      responses: {'200': {description: ok}}\n";
    let r = import::import(import::parse(external).unwrap(), &options(Format::McpTool)).unwrap();
    match &r.operations[0].outcome {
        Outcome::Skipped(reason) => assert!(reason.contains("only local references"), "{reason}"),
        other => panic!("expected a skip: {other:?}"),
    }
}

#[tokio::test]
async fn imported_tools_serve_real_calls_against_the_service() {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let mut opts = options(Format::ProxyConfig);
    opts.base_url = Some(format!("http://{upstream}"));
    let text = import::import(import::parse(SPEC).unwrap(), &opts).unwrap().text;
    // Served as generated, with write tools opened to the anonymous test caller.
    let mut doc = toolgate_config::parse_yaml_value(&text).unwrap();
    doc["server"] = json!({"listen": "127.0.0.1:0", "adminListen": "127.0.0.1:0"});
    doc["policy"] = json!({"readOnly": false, "audit": {"enabled": false}});
    for t in doc["tools"].as_array_mut().unwrap() {
        t["requiredRole"] = json!("viewer");
    }
    let proxy = start(toolgate_config::from_value(doc).unwrap(), StartOptions::default())
        .await
        .unwrap();
    let s = Session::open(common::client(), format!("http://{}/mcp", proxy.mcp_addr), "2025-06-18").await;

    let (env, is_error) = s.envelope("getCustomer", json!({"customerId": "42"})).await;
    assert!(!is_error, "{env}");
    assert_eq!(env["data"]["name"], "Ana López");

    let (env, _) = s.envelope("searchCustomers", json!({"query": "Ana", "limit": 5})).await;
    assert_eq!(env["status"], "success", "{env}");
    assert_eq!(env["data"]["count"], 1);

    let (env, _) = s
        .envelope("createTicket", json!({"customerId": "42", "subject": "Router down", "priority": "high", "metadata": {"channel": "whatsapp"}}))
        .await;
    assert_eq!(env["status"], "success", "{env}");
    assert!(env["data"]["ticketId"].as_str().unwrap().starts_with("T-"));
    assert_eq!(env["data"]["priority"], "high");

    // The schema the spec declared is enforced (2025-06-18: invalid arguments are -32602):
    // a JSON string where it wants an object, and the exclusive bound.
    let refused = s
        .call(
            "createTicket",
            json!({"customerId": "42", "subject": "Router down", "metadata": "{\"channel\":\"x\"}"}),
        )
        .await;
    assert_eq!(refused["error"]["data"]["field"], "metadata", "{refused}");
    let refused = s.call("submitPayment", json!({"customerId": "42", "amount": 0})).await;
    assert_eq!(
        refused["error"]["data"]["field"], "amount",
        "exclusiveMinimum 0 refuses 0: {refused}"
    );
    let (env, _) = s
        .envelope("submitPayment", json!({"customerId": "42", "amount": 10.5}))
        .await;
    assert_eq!(env["ok"], true, "{env}");
    assert!(env["data"]["jobId"].is_string());

    let items = json!([{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]);
    let (env, _) = s
        .envelope("echoBatch", json!({"body": items, "X_Channel": "whatsapp"}))
        .await;
    assert_eq!(env["status"], "success", "{env}");
    assert_eq!(env["data"]["method"], "PUT");
    assert_eq!(env["data"]["body"], items, "the array is the whole body");
    assert_eq!(env["data"]["headers"]["x-channel"], "whatsapp");

    let (env, _) = s.envelope("deleteTicket", json!({"ticketId": "T-1001"})).await;
    assert_eq!(env["data"]["status"], "deleted", "{env}");
    let refused: Value = s.call("deleteTicket", json!({"ticketId": "../customers/42"})).await;
    assert_eq!(
        refused["error"]["data"]["field"], "ticketId",
        "the spec's pattern holds: {refused}"
    );
    proxy.shutdown().await;
}

#[test]
fn openapi_31_schemas_keep_every_keyword_and_odd_text_stays_in_comments() {
    let spec = r##"{"openapi": "3.1.0", "info": {"title": "t", "version": "1"},
      "paths": {"/items/{id}": {"put": {
        "operationId": "put\r---\rkind: ClusterRoleBinding",
        "parameters": [{"name": "id", "in": "path", "required": true,
                        "schema": {"type": "string", "not": {"const": "admin"}}}],
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Item"}}}},
        "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": true}}}}}}},
      "components": {"schemas": {"Item": {"type": "object", "properties": {"a": {"type": "string"}},
        "patternProperties": {"^x-": {"type": "string"}}, "dependentRequired": {"a": ["b"]}}}}}"##;
    let r = import::import(import::parse(spec).unwrap(), &options(Format::McpTool)).unwrap();
    let tool = r.tools().next().expect("one tool");
    // oas3's model has no `not`, `patternProperties` or `dependentRequired`: read from the document.
    assert_eq!(tool.input_schema["properties"]["id"]["not"], json!({"const": "admin"}));
    let body = &tool.input_schema["properties"]["body"];
    assert!(
        body["patternProperties"].is_object(),
        "not flattened, kept whole: {}",
        tool.input_schema
    );
    assert_eq!(body["dependentRequired"], json!({"a": ["b"]}));
    assert!(tool.output_schema.is_none(), "a `true` response schema says nothing");
    // The CRs in the operationId end no comment: one document only.
    assert_eq!(r.text.matches("\n---\n").count(), 1, "{}", r.text);
    assert!(!r.text.contains("\nkind: ClusterRoleBinding"));
}
