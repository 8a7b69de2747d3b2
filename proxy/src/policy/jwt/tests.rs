//! Token verification, one refusal per test.

use super::testing::*;
use super::*;
use serde_json::json;

const NOW: i64 = 1_800_000_000;

static AT_JWT: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| vec!["at+jwt".to_string()]);

fn want(algs: &[String]) -> Expectations<'_> {
    Expectations {
        issuer: "https://issuer.test",
        audience: "https://mcp.test/mcp",
        algorithms: algs,
        token_types: &AT_JWT,
        leeway: 60,
        now: NOW,
    }
}

fn claims() -> Value {
    json!({"iss": "https://issuer.test", "aud": ["https://mcp.test/mcp"], "sub": "user-1", "exp": NOW + 300,
           "nbf": NOW - 10, "scope": "mcp:read mcp:write", "act": {"sub": "agent-7"}})
}

#[test]
fn good_tokens_verify_and_bad_ones_say_why() {
    let ec = EcKey::generate("k1");
    let ed = EdKey::generate("k2");
    let keys = parse_jwks(&json!({"keys": [ec.jwk(), ed.jwk()]}).to_string()).unwrap();
    let algs = vec!["ES256".to_string(), "EdDSA".to_string()];
    let c = verify_token(&ec.sign(&claims()), &keys, &want(&algs)).unwrap();
    assert_eq!(c["sub"], "user-1");
    assert_eq!(scopes(&c), ["mcp:read", "mcp:write"]);
    assert_eq!(agent(&c).as_deref(), Some("agent-7"));
    assert!(verify_token(&ed.sign(&claims()), &keys, &want(&algs)).is_ok());

    let reason = |token: String| verify_token(&token, &keys, &want(&algs)).unwrap_err().reason;
    let mut expired = claims();
    expired["exp"] = json!(NOW - 61);
    assert_eq!(reason(ec.sign(&expired)), "expired");
    let mut skewed = claims();
    skewed["exp"] = json!(NOW - 30);
    assert!(
        verify_token(&ec.sign(&skewed), &keys, &want(&algs)).is_ok(),
        "inside the leeway"
    );
    let mut early = claims();
    early["nbf"] = json!(NOW + 120);
    assert_eq!(reason(ec.sign(&early)), "not_yet_valid");
    let mut aud = claims();
    aud["aud"] = json!("https://other.test");
    assert_eq!(reason(ec.sign(&aud)), "audience");
    let mut iss = claims();
    iss["iss"] = json!("https://evil.test");
    assert_eq!(reason(ec.sign(&iss)), "issuer");
    iss["iss"] = json!(["https://evil.test", "https://issuer.test"]);
    assert_eq!(reason(ec.sign(&iss)), "issuer", "one issuer, not a list holding it");
    iss["iss"] = json!(["https://issuer.test"]);
    assert_eq!(reason(ec.sign(&iss)), "issuer");
    iss.as_object_mut().unwrap().remove("iss");
    assert_eq!(reason(ec.sign(&iss)), "issuer");
    assert_eq!(reason(unsigned(&claims())), "algorithm");
    let good = ec.sign(&claims());
    let (head, rest) = good.split_once('.').unwrap();
    let (_, sig) = rest.split_once('.').unwrap();
    let mut tampered_claims = claims();
    tampered_claims["sub"] = json!("admin");
    let tampered = format!("{head}.{}.{sig}", URL_SAFE_NO_PAD.encode(tampered_claims.to_string()));
    assert_eq!(reason(tampered), "signature");
    let other = EcKey::generate("k1");
    assert_eq!(reason(other.sign(&claims())), "signature");
    assert_eq!(reason(EcKey::generate("k9").sign(&claims())), "unknown_key");
    assert_eq!(reason("abc".into()), "malformed");
    let only_rs = vec!["RS256".to_string()];
    assert_eq!(
        verify_token(&good, &keys, &want(&only_rs)).unwrap_err().reason,
        "algorithm"
    );
}

fn setup() -> (EcKey, Vec<Jwk>, Vec<String>) {
    let ec = EcKey::generate("k1");
    let keys = parse_jwks(&json!({"keys": [ec.jwk()]}).to_string()).unwrap();
    (ec, keys, vec!["ES256".to_string()])
}

#[test]
fn critical_header_parameters_are_refused() {
    let (ec, keys, algs) = setup();
    let plain = header("ES256", "k1");
    assert!(verify_token(&ec.sign_with_header(&plain, &claims()), &keys, &want(&algs)).is_ok());
    for crit in [
        json!(["exp"]),
        json!(["b64"]),
        json!(["b64", "urn:x"]),
        json!([]),
        json!("b64"),
        json!([1]),
        json!(null),
    ] {
        let mut h = plain.clone();
        h["crit"] = crit.clone();
        h["b64"] = json!(false);
        let e = verify_token(&ec.sign_with_header(&h, &claims()), &keys, &want(&algs)).unwrap_err();
        assert_eq!(e.reason, "crit", "crit {crit}");
    }
}

#[test]
fn the_token_type_must_be_accepted() {
    let (ec, keys, algs) = setup();
    let with_typ = |typ: Option<Value>| {
        let mut h = json!({"alg": "ES256", "kid": "k1"});
        if let Some(t) = typ {
            h["typ"] = t;
        }
        ec.sign_with_header(&h, &claims())
    };
    let check = |token: &str, types: &[&str]| {
        let types: Vec<String> = types.iter().map(|t| t.to_string()).collect();
        let w = Expectations {
            token_types: &types,
            ..want(&algs)
        };
        verify_token(token, &keys, &w).map(|_| ()).map_err(|e| e.reason)
    };
    let default = ["at+jwt"];
    for ok in ["at+jwt", "AT+JWT", "application/at+jwt", "Application/At+JWT"] {
        assert_eq!(check(&with_typ(Some(json!(ok))), &default), Ok(()), "{ok}");
    }
    assert_eq!(check(&with_typ(Some(json!("at+jwt"))), &["application/AT+JWT"]), Ok(()));
    for bad in [
        json!("JWT"),
        json!("jwt"),
        json!(""),
        json!("application/jwt"),
        json!("at+jwt+x"),
        json!(5),
        json!(["at+jwt"]),
    ] {
        assert_eq!(
            check(&with_typ(Some(bad.clone())), &default),
            Err("token_type"),
            "{bad}"
        );
    }
    assert_eq!(check(&with_typ(None), &default), Err("token_type"), "typ absent");
    // An identity provider that labels access tokens `JWT`, or omits `typ`, is allowed explicitly.
    assert_eq!(check(&with_typ(Some(json!("JWT"))), &["at+jwt", "JWT"]), Ok(()));
    assert_eq!(check(&with_typ(None), &["at+jwt", "JWT"]), Err("token_type"));
    assert_eq!(check(&with_typ(None), &["at+jwt", ""]), Ok(()));
    assert_eq!(check(&with_typ(Some(json!(""))), &["at+jwt", ""]), Err("token_type"));
}

#[test]
fn numeric_dates_must_be_whole_seconds_in_range_and_never_overflow() {
    let (ec, keys, algs) = setup();
    let reason = |name: &str, v: Value, w: &Expectations<'_>| {
        let mut c = claims();
        c[name] = v;
        verify_token(&ec.sign(&c), &keys, w).map(|_| ()).map_err(|e| e.reason)
    };
    let w = want(&algs);
    for name in ["exp", "nbf", "iat"] {
        for bad in [
            json!(i64::MAX),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(-1),
            json!(MAX_NUMERIC_DATE + 1),
            json!(1e300),
            json!(f64::MAX),
            json!(-1e300),
            json!((NOW + 100) as f64 + 0.5),
            json!((NOW + 100) as f64),
            json!("1800000100"),
            json!(null),
            json!(true),
        ] {
            assert_eq!(reason(name, bad.clone(), &w), Err("claims"), "{name}: {bad}");
        }
    }
    assert_eq!(reason("exp", json!(MAX_NUMERIC_DATE), &w), Ok(()));
    assert_eq!(reason("iat", json!(0), &w), Ok(()));
    assert_eq!(reason("nbf", json!(MAX_NUMERIC_DATE), &w), Err("not_yet_valid"));
    // Extreme leeway and clocks saturate instead of wrapping.
    let huge = Expectations {
        leeway: i64::MAX,
        ..want(&algs)
    };
    assert_eq!(
        reason("exp", json!(0), &huge),
        Ok(()),
        "everything is inside an infinite leeway"
    );
    assert_eq!(reason("nbf", json!(MAX_NUMERIC_DATE), &huge), Ok(()));
    let late = Expectations {
        now: i64::MAX,
        ..want(&algs)
    };
    assert_eq!(reason("exp", json!(MAX_NUMERIC_DATE), &late), Err("expired"));
    let early = Expectations {
        now: i64::MIN,
        leeway: i64::MAX,
        ..want(&algs)
    };
    assert_eq!(reason("nbf", json!(MAX_NUMERIC_DATE), &early), Err("not_yet_valid"));
    let negative = Expectations {
        leeway: i64::MIN,
        ..want(&algs)
    };
    assert_eq!(
        reason("exp", json!(NOW + 300), &negative),
        Ok(()),
        "a negative leeway counts as 0"
    );
    assert_eq!(reason("exp", json!(NOW - 1), &negative), Err("expired"));
    let mut no_exp = claims();
    no_exp.as_object_mut().unwrap().remove("exp");
    assert_eq!(verify_token(&ec.sign(&no_exp), &keys, &w).unwrap_err().reason, "claims");
}

#[test]
fn rsa_tokens_verify_with_every_rsa_algorithm_and_keys_are_not_confused() {
    let rsa = RsaKey::fixed("r1");
    let ec = EcKey::generate("k1");
    let keys = parse_jwks(&json!({"keys": [rsa.jwk(), ec.jwk()]}).to_string()).unwrap();
    let all: Vec<String> = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    for alg in &all[..6] {
        let c = verify_token(&rsa.sign(alg, &claims()), &keys, &want(&all)).unwrap_or_else(|e| panic!("{alg}: {e}"));
        assert_eq!(c["sub"], "user-1");
    }
    // A token that names the RSA key but another algorithm family never reaches it.
    let mut h = header("ES256", "r1");
    h["typ"] = json!("at+jwt");
    let confused = ec.sign_with_header(&h, &claims());
    assert_eq!(
        verify_token(&confused, &keys, &want(&all)).unwrap_err().reason,
        "unknown_key"
    );
    // HS256 signed with the RSA public key as the secret (the classic confusion): the
    // algorithm is refused, and would find no key if it were allowed.
    let secret = rsa.jwk().to_string();
    let forged = sign_with("r1", "HS256", &claims(), |msg| {
        ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes()), msg)
            .as_ref()
            .to_vec()
    });
    assert_eq!(
        verify_token(&forged, &keys, &want(&all)).unwrap_err().reason,
        "algorithm"
    );
    let with_hs: Vec<String> = vec!["HS256".into(), "RS256".into()];
    assert_eq!(
        verify_token(&forged, &keys, &want(&with_hs)).unwrap_err().reason,
        "unknown_key"
    );
    // A JWKS may pin a key to one algorithm.
    let mut pinned = rsa.jwk();
    pinned["alg"] = json!("PS256");
    let keys = parse_jwks(&json!({"keys": [pinned]}).to_string()).unwrap();
    assert!(verify_token(&rsa.sign("PS256", &claims()), &keys, &want(&all)).is_ok());
    assert_eq!(
        verify_token(&rsa.sign("RS256", &claims()), &keys, &want(&all))
            .unwrap_err()
            .reason,
        "unknown_key"
    );
}

#[test]
fn jwks_keep_only_keys_that_can_verify() {
    let ec = EcKey::generate("k1");
    let skipped = json!([
        {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
        {"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA", "kid": "p521"},
        {"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB", "kid": "enc"},
        {"kty": "XYZ", "kid": "future"},
        {"kty": "OKP", "crv": "X25519", "x": "AA", "kid": "ecdh"}
    ]);
    let mut all = skipped.as_array().unwrap().clone();
    all.push(ec.jwk());
    let keys = parse_jwks(&json!({"keys": all}).to_string()).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(keys[0].kid.as_deref(), Some("k1"));
    assert!(parse_jwks(&json!({"keys": skipped}).to_string())
        .unwrap_err()
        .contains("no usable signing keys"));
    let mut bad = ec.jwk();
    bad["x"] = json!("not base64!");
    assert!(parse_jwks(&json!({"keys": [bad]}).to_string())
        .unwrap_err()
        .contains("malformed"));
    let mut missing = ec.jwk();
    missing.as_object_mut().unwrap().remove("y");
    assert!(parse_jwks(&json!({"keys": [missing]}).to_string())
        .unwrap_err()
        .contains("malformed"));
    assert!(parse_jwks("{}").unwrap_err().contains("`keys`"));
    assert!(parse_jwks("nope").unwrap_err().contains("not JSON"));
}

#[test]
fn malformed_headers_are_refused() {
    let (ec, keys, algs) = setup();
    let r = |h: Value| {
        verify_token(&ec.sign_with_header(&h, &claims()), &keys, &want(&algs))
            .unwrap_err()
            .reason
    };
    assert_eq!(r(json!({"alg": "ES256", "typ": "at+jwt", "kid": 1})), "malformed");
    assert_eq!(r(json!(["ES256"])), "malformed");
}
