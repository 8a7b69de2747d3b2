//! Micro-benchmarks of the per-call work that does not touch the network: argument
//! validation of a typical 1 KiB argument object, request mapping, and response shaping.
//! `cargo bench -p toolgate-proxy --bench hot_path` (a plain timing loop; no test harness).

use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use serde_json::{json, Value};
use toolgate_proxy::upstream::{mapping, shape, UpstreamResponse};
use toolgate_proxy::Runtime;

const CONFIG: &str = r#"
apiVersion: toolgate.dev/v1alpha1
kind: ProxyConfig
upstream: {baseUrl: "http://127.0.0.1:9"}
tools:
  - name: submit_payment_evidence
    inputSchema:
      type: object
      additionalProperties: false
      required: [customerId, amount, rawExtracted, trackingKeyCandidates]
      properties:
        customerId: {type: string, minLength: 1}
        amount: {type: number, exclusiveMinimum: 0}
        currency: {type: string, enum: [MXN, USD, EUR]}
        identityConfirmed: {type: boolean}
        customerNote: {type: string, maxLength: 2000}
        rawExtracted:
          type: object
          properties:
            monto: {type: string}
            banco_destino: {type: string}
            banco_origen: {type: string}
            fecha: {type: string}
            concepto: {type: string}
        trackingKeyCandidates:
          type: array
          items:
            type: object
            required: [value]
            properties:
              value: {type: string}
              source: {type: string}
              confidence: {type: string, enum: [low, medium, high]}
    http: {method: POST, path: "/customers/{customerId}/payments"}
    response:
      pick: [/paymentId, /matched, /receipt]
      redact: [/receipt/internal]
      evidence: [/paymentId]
"#;

fn args() -> Value {
    json!({
        "customerId": "cus_000000042",
        "amount": 350.0,
        "currency": "MXN",
        "identityConfirmed": true,
        "customerNote": "Cliente envía comprobante de transferencia SPEI desde la app de su banco; indica que pagó la mensualidad de noviembre y solicita que se reactive el servicio hoy mismo, antes de las seis de la tarde, sin cargo por reconexión.",
        "rawExtracted": {
            "monto": "$350.00", "banco_destino": "BBVA", "banco_origen": "Banorte",
            "fecha": "2026-11-30T10:15:00-06:00",
            "concepto": "Pago de servicio de internet, mensualidad de noviembre, contrato 4482-AB"
        },
        "trackingKeyCandidates": [
            {"value": "260604017724349474I", "source": "clave_rastreo", "confidence": "high"},
            {"value": "MBAN01002611300042", "source": "referencia", "confidence": "medium"},
            {"value": "0042-2026-11", "source": "folio", "confidence": "low"},
            {"value": "BNET01002611300042", "source": "ocr", "confidence": "low"},
            {"value": "7724349474", "source": "ocr", "confidence": "low"},
            {"value": "4482AB", "source": "concepto", "confidence": "medium"}
        ]
    })
}

fn bench(name: &str, iters: u32, mut f: impl FnMut()) {
    for _ in 0..iters / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(iters);
    println!("{name:<48} {:>10.0} ns/op  ({iters} iterations)", ns);
}

/// The policy layers of one call with API-key auth, both rate limits and an audit record
/// written to /dev/null: what they add to a call, measured in the same process.
fn bench_policy() {
    let dir = std::env::temp_dir().join(format!("toolgate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let creds = dir.join("credentials.yaml");
    let mut text = String::from("credentials:\n");
    for i in 0..1000 {
        text.push_str(&format!("  - {{id: key-{i}, key: secret-key-{i}, role: operator}}\n"));
    }
    std::fs::write(&creds, text).unwrap();
    let config = CONFIG.replace(
        "upstream: {baseUrl: \"http://127.0.0.1:9\"}",
        &format!(
            "upstream: {{baseUrl: \"http://127.0.0.1:9\"}}\npolicy:\n  readOnly: false\n  auth: {{mode: apiKey, credentialsFile: '{}'}}\n  rateLimit: {{perIp: {{requests: 1000000000, windowSeconds: 1}}, perIdentity: {{requests: 1000000000, windowSeconds: 1}}}}\n  audit: {{sink: file, path: /dev/null, bufferSize: 100000, redactArguments: [/customerNote]}}\n",
            creds.display()
        ),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let runtime = Runtime::compile(toolgate_config::parse_yaml(&config).unwrap(), 1).unwrap();
        let shared = toolgate_proxy::mcp::Shared::new(runtime);
        let rt = shared.runtime.load_full();
        let mut headers = http::HeaderMap::new();
        headers.insert("x-api-key", http::HeaderValue::from_static("secret-key-517"));
        let id = json!(7);
        let params = json!({"name": "submit_payment_evidence", "arguments": args()});
        let iters = 100_000u32;
        let start = Instant::now();
        for i in 0..iters {
            let who = rt.auth.authenticate(black_box(&headers)).await.unwrap();
            shared
                .limiters
                .ip
                .check(&std::net::IpAddr::from([127, 0, 0, 1]), rt.limits.per_ip)
                .unwrap();
            shared
                .limiters
                .identity
                .check(&who.subject, rt.limits.per_identity)
                .unwrap();
            let mut audit = toolgate_proxy::mcp::call::CallAudit::new(shared.auditor.load_full(), &id, Some(&params));
            audit.set_arguments(Some(&params), true);
            audit.finish("allowed", "ok", None);
            if i % 1000 == 0 {
                tokio::task::yield_now().await; // let the writer drain
            }
        }
        let ns = start.elapsed().as_nanos() as f64 / f64::from(iters);
        println!(
            "{:<48} {:>10.0} ns/op  ({iters} iterations)",
            "policy: api key + ip/identity limits + audit", ns
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let rt = Runtime::compile(toolgate_config::parse_yaml(CONFIG).unwrap(), 1).unwrap();
    let tool = rt.tool("submit_payment_evidence").unwrap();
    let args = args();
    let size = args.to_string().len();
    println!("argument object: {size} bytes of JSON");
    assert!((900..=1200).contains(&size), "keep the benchmark at about 1 KiB");
    let map = args.as_object().unwrap().clone();
    assert!(tool.input.get().expect("the schema compiles").is_valid(&args));

    bench("validate 1 KiB arguments (valid)", 200_000, || {
        black_box(toolgate_proxy::mcp::args::validate(&tool.input, black_box(&args), true));
    });
    let mut bad = args.clone();
    bad["trackingKeyCandidates"] = json!("[{\"value\": \"x\"}]");
    bench("validate 1 KiB arguments (invalid, with errors)", 100_000, || {
        black_box(toolgate_proxy::mcp::args::validate(&tool.input, black_box(&bad), true));
    });
    let text = args.to_string();
    bench("parse 1 KiB JSON-RPC arguments", 200_000, || {
        black_box(serde_json::from_str::<Value>(black_box(&text)).unwrap());
    });
    bench("map arguments to the HTTP request", 200_000, || {
        black_box(mapping::build(tool, black_box(&map), &rt.upstream, &[]).unwrap());
    });
    let resp = UpstreamResponse {
        status: 201,
        content_type: Some(http::HeaderValue::from_static("application/json")),
        body: Bytes::from(
            json!({"paymentId": "pay_123", "matched": true, "receipt": {"id": "r1", "internal": "x"}, "debug": {"trace": "..."}})
                .to_string(),
        ),
    };
    bench_policy();
    bench("shape the response into an envelope", 200_000, || {
        let o = shape::response(tool, black_box(&resp));
        let envelope = o.envelope_json("t", "mutation", 1);
        black_box(toolgate_proxy::envelope::call_result_json(&envelope, o.is_error()));
    });
}
