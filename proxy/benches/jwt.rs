//! JWT access-token verification per token: ES256 and EdDSA against a JWKS of both, the path
//! `policy.auth.mode: oauth` takes on every request. `cargo bench -p toolgate-proxy --bench jwt`
//! (a plain timing loop; no test harness). Prints the median of 7 rounds in µs per token.

use std::hint::black_box;
use std::time::Instant;

use serde_json::json;
use toolgate_proxy::policy::jwt::testing::{EcKey, EdKey};
use toolgate_proxy::policy::jwt::{parse_jwks, verify_token, Expectations};

fn main() {
    let now = 1_800_000_000i64;
    let ec = EcKey::generate("k1");
    let ed = EdKey::generate("k2");
    let keys = parse_jwks(&json!({"keys": [ec.jwk(), ed.jwk()]}).to_string()).unwrap();
    let algorithms = vec!["ES256".to_string(), "EdDSA".to_string()];
    let types = vec!["at+jwt".to_string()];
    let want = Expectations {
        issuer: "https://issuer.test",
        audience: "https://mcp.test/mcp",
        algorithms: &algorithms,
        token_types: &types,
        leeway: 60,
        now,
    };
    let claims = json!({"iss": "https://issuer.test", "aud": ["https://mcp.test/mcp"], "sub": "user-1",
        "exp": now + 300, "nbf": now - 10, "scope": "mcp:read mcp:write", "act": {"sub": "agent-7"}});
    let cases = [
        ("ES256", ec.sign(&claims)),
        ("EdDSA", ed.sign(&claims)),
        ("refused: bad signature (ES256)", {
            let t = ec.sign(&claims);
            let other = EcKey::generate("k1").sign(&claims);
            format!(
                "{}.{}",
                t.rsplit_once('.').unwrap().0,
                other.rsplit_once('.').unwrap().1
            )
        }),
        (
            "refused: alg none",
            toolgate_proxy::policy::jwt::testing::unsigned(&claims),
        ),
        ("parse_jwks (2 keys)", String::new()),
    ];
    let jwks = json!({"keys": [ec.jwk(), ed.jwk()]}).to_string();
    const N: u32 = 2000;
    for (name, token) in &cases {
        let mut rounds = Vec::new();
        for _ in 0..7 {
            let start = Instant::now();
            for _ in 0..N {
                if token.is_empty() {
                    black_box(parse_jwks(black_box(&jwks)).unwrap());
                } else {
                    let _ = black_box(verify_token(black_box(token), &keys, &want));
                }
            }
            rounds.push(start.elapsed().as_secs_f64() * 1e6 / f64::from(N));
        }
        rounds.sort_by(f64::total_cmp);
        println!("{name:<34} {:>8.2} µs", rounds[3]);
    }
}
