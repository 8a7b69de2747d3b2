//! OAuth 2.1 resource server: JWT access tokens verified against an issuer's JWKS with `ring`.
//! `alg: none` and algorithms outside the allowlist are refused before any key is looked up, and
//! so are tokens with `crit` header parameters (none is understood, RFC 7515 §4.1.11) or a `typ`
//! outside the accepted token types (RFC 9068 access tokens are `at+jwt`).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::Value;

/// Why a token is refused (`reason` is a stable label; the text never echoes the token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TokenError {
    /// Stable label: `malformed`, `algorithm`, `crit`, `token_type`, `unknown_key`, `signature`,
    /// `expired`, `not_yet_valid`, `issuer`, `audience`, `claims`.
    pub reason: &'static str,
    /// What is wrong, for the `WWW-Authenticate` error description.
    pub message: String,
}

fn err(reason: &'static str, message: impl Into<String>) -> TokenError {
    TokenError {
        reason,
        message: message.into(),
    }
}

/// A verification key from a JWKS.
#[derive(Debug, Clone)]
pub struct Jwk {
    /// `kid`, if any.
    pub kid: Option<String>,
    /// `alg`, if pinned by the JWKS.
    pub alg: Option<String>,
    key: KeyMaterial,
}

#[derive(Debug, Clone)]
enum KeyMaterial {
    Rsa { n: Vec<u8>, e: Vec<u8> },
    Ec { curve: &'static str, point: Vec<u8> },
    Ed25519(Vec<u8>),
}

fn b64(v: Option<&Value>, what: &str) -> Result<Vec<u8>, String> {
    let s = v
        .and_then(Value::as_str)
        .ok_or_else(|| format!("`{what}` is missing"))?;
    URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|_| format!("`{what}` is not base64url"))
}

/// Parses a JWKS document; keys that cannot verify signatures (`use: enc`, unknown `kty`) are skipped.
pub fn parse_jwks(text: &str) -> Result<Vec<Jwk>, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("JWKS is not JSON: {e}"))?;
    let keys = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("JWKS has no `keys` array")?;
    let mut out = Vec::new();
    for k in keys {
        if k.get("use").and_then(Value::as_str).is_some_and(|u| u != "sig") {
            continue;
        }
        let key = match k.get("kty").and_then(Value::as_str) {
            Some("RSA") => KeyMaterial::Rsa {
                n: b64(k.get("n"), "n")?,
                e: b64(k.get("e"), "e")?,
            },
            Some("EC") => {
                let curve = match k.get("crv").and_then(Value::as_str) {
                    Some("P-256") => "P-256",
                    Some("P-384") => "P-384",
                    _ => continue,
                };
                let (x, y) = (b64(k.get("x"), "x")?, b64(k.get("y"), "y")?);
                let mut point = Vec::with_capacity(1 + x.len() + y.len());
                point.push(4);
                point.extend(x);
                point.extend(y);
                KeyMaterial::Ec { curve, point }
            }
            Some("OKP") if k.get("crv").and_then(Value::as_str) == Some("Ed25519") => {
                KeyMaterial::Ed25519(b64(k.get("x"), "x")?)
            }
            _ => continue,
        };
        out.push(Jwk {
            kid: k.get("kid").and_then(Value::as_str).map(str::to_string),
            alg: k.get("alg").and_then(Value::as_str).map(str::to_string),
            key,
        });
    }
    if out.is_empty() {
        return Err("JWKS has no usable signing keys".into());
    }
    Ok(out)
}

fn key_fits(alg: &str, key: &KeyMaterial) -> bool {
    match key {
        KeyMaterial::Rsa { .. } => alg.starts_with("RS") || alg.starts_with("PS"),
        KeyMaterial::Ec { curve: "P-256", .. } => alg == "ES256",
        KeyMaterial::Ec { curve: "P-384", .. } => alg == "ES384",
        KeyMaterial::Ec { .. } => false,
        KeyMaterial::Ed25519(_) => alg == "EdDSA",
    }
}

fn verify(alg: &str, key: &KeyMaterial, msg: &[u8], sig: &[u8]) -> bool {
    match key {
        KeyMaterial::Rsa { n, e } => {
            let params = match alg {
                "RS256" => &signature::RSA_PKCS1_2048_8192_SHA256,
                "RS384" => &signature::RSA_PKCS1_2048_8192_SHA384,
                "RS512" => &signature::RSA_PKCS1_2048_8192_SHA512,
                "PS256" => &signature::RSA_PSS_2048_8192_SHA256,
                "PS384" => &signature::RSA_PSS_2048_8192_SHA384,
                "PS512" => &signature::RSA_PSS_2048_8192_SHA512,
                _ => return false,
            };
            RsaPublicKeyComponents { n, e }.verify(params, msg, sig).is_ok()
        }
        KeyMaterial::Ec { point, .. } => {
            let params = match alg {
                "ES256" => &signature::ECDSA_P256_SHA256_FIXED,
                "ES384" => &signature::ECDSA_P384_SHA384_FIXED,
                _ => return false,
            };
            UnparsedPublicKey::new(params, point).verify(msg, sig).is_ok()
        }
        KeyMaterial::Ed25519(x) => UnparsedPublicKey::new(&signature::ED25519, x).verify(msg, sig).is_ok(),
    }
}

/// What a token must satisfy.
#[derive(Debug, Clone)]
pub struct Expectations<'a> {
    /// Expected `iss`.
    pub issuer: &'a str,
    /// Required member of `aud`.
    pub audience: &'a str,
    /// Accepted algorithms.
    pub algorithms: &'a [String],
    /// Accepted header `typ` values (see [`type_accepted`]); `""` accepts a token without `typ`.
    pub token_types: &'a [String],
    /// Tolerated clock skew, seconds.
    pub leeway: i64,
    /// Now, Unix seconds.
    pub now: i64,
}

/// The latest NumericDate accepted in `exp`, `nbf` and `iat`: 9999-12-31T23:59:59Z.
pub const MAX_NUMERIC_DATE: i64 = 253_402_300_799;

/// `typ` without a leading `application/` (RFC 7515 §4.1.9), lowercased.
fn media_type(t: &str) -> String {
    let t = t.trim().to_ascii_lowercase();
    match t.strip_prefix("application/") {
        Some(rest) => rest.to_string(),
        None => t,
    }
}

/// Whether a header `typ` (`None`: absent) is one of `accepted`: case-insensitive, with or
/// without the `application/` prefix; an accepted `""` admits a token without `typ`.
pub fn type_accepted(typ: Option<&str>, accepted: &[String]) -> bool {
    match typ {
        None => accepted.iter().any(|a| a.trim().is_empty()),
        Some(t) => {
            let t = media_type(t);
            !t.is_empty() && accepted.iter().any(|a| media_type(a) == t)
        }
    }
}

/// A NumericDate claim: absent, or a JSON integer in 0..=[`MAX_NUMERIC_DATE`]; anything else
/// (a string, a fraction, a negative or out-of-range number) is refused.
fn numeric_date(claims: &serde_json::Map<String, Value>, name: &str) -> Result<Option<i64>, TokenError> {
    match claims.get(name) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .filter(|n| (0..=MAX_NUMERIC_DATE).contains(n))
            .map(Some)
            .ok_or_else(|| {
                err(
                    "claims",
                    format!("`{name}` is not a whole number of seconds between 1970 and 9999"),
                )
            }),
    }
}

/// The header of a token (to pick the key), without verifying anything.
pub fn peek_kid(token: &str) -> Option<String> {
    let header = token.split('.').next()?;
    let v: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).ok()?).ok()?;
    v.get("kid").and_then(Value::as_str).map(str::to_string)
}

/// Verifies `token` with `keys` and returns its claims.
pub fn verify_token(
    token: &str,
    keys: &[Jwk],
    want: &Expectations<'_>,
) -> Result<serde_json::Map<String, Value>, TokenError> {
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(err("malformed", "the token is not a JWS compact serialization"));
    };
    let header: Value = URL_SAFE_NO_PAD
        .decode(h)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| err("malformed", "the token header is not base64url JSON"))?;
    let Value::Object(header) = header else {
        return Err(err("malformed", "the token header is not a JSON object"));
    };
    let alg = header.get("alg").and_then(Value::as_str).unwrap_or("none");
    if alg.eq_ignore_ascii_case("none") || !want.algorithms.iter().any(|a| a == alg) {
        return Err(err("algorithm", format!("algorithm `{alg}` is not accepted")));
    }
    // RFC 7515 §4.1.11: every extension named in `crit` must be understood, and none is; an
    // empty list is forbidden to producers, and anything but a list of names is malformed.
    if header.contains_key("crit") {
        return Err(err(
            "crit",
            "the token has critical header parameters (`crit`) that are not understood",
        ));
    }
    let typ = match header.get("typ") {
        None => None,
        Some(Value::String(t)) => Some(t.as_str()),
        Some(_) => return Err(err("token_type", "the token's `typ` is not a string")),
    };
    if !type_accepted(typ, want.token_types) {
        return Err(err(
            "token_type",
            "the token's `typ` is not an accepted access token type",
        ));
    }
    let sig = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| err("malformed", "the signature is not base64url"))?;
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(k)) => Some(k.as_str()),
        Some(_) => return Err(err("malformed", "the token's `kid` is not a string")),
    };
    let candidates: Vec<&Jwk> = keys
        .iter()
        .filter(|k| key_fits(alg, &k.key))
        .filter(|k| k.alg.as_deref().is_none_or(|a| a == alg))
        .filter(|k| kid.is_none() || k.kid.as_deref() == kid)
        .collect();
    if candidates.is_empty() {
        return Err(err(
            "unknown_key",
            "no key of the issuer matches the token's kid and algorithm",
        ));
    }
    let msg = &token.as_bytes()[..h.len() + 1 + p.len()];
    if !candidates.iter().any(|k| verify(alg, &k.key, msg, &sig)) {
        return Err(err("signature", "the signature does not verify"));
    }
    let claims: serde_json::Map<String, Value> = URL_SAFE_NO_PAD
        .decode(p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| err("malformed", "the payload is not base64url JSON"))?;
    let exp = numeric_date(&claims, "exp")?.ok_or_else(|| err("claims", "the token has no `exp`"))?;
    let nbf = numeric_date(&claims, "nbf")?;
    numeric_date(&claims, "iat")?;
    let leeway = want.leeway.max(0);
    if want.now > exp.saturating_add(leeway) {
        return Err(err("expired", "the token has expired"));
    }
    if nbf.is_some_and(|nbf| want.now.saturating_add(leeway) < nbf) {
        return Err(err("not_yet_valid", "the token is not valid yet"));
    }
    if claims.get("iss").and_then(Value::as_str) != Some(want.issuer) {
        return Err(err("issuer", "the token was issued by another issuer"));
    }
    let aud_ok = match claims.get("aud") {
        Some(Value::String(a)) => a == want.audience,
        Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(want.audience)),
        _ => false,
    };
    if !aud_ok {
        return Err(err("audience", "the token is not meant for this resource"));
    }
    if claims.get("sub").and_then(Value::as_str).is_none_or(str::is_empty) {
        return Err(err("claims", "the token has no `sub`"));
    }
    Ok(claims)
}

/// Scopes from `scope` (space separated) or `scp` (array or string).
pub fn scopes(claims: &serde_json::Map<String, Value>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for key in ["scope", "scp"] {
        match claims.get(key) {
            Some(Value::String(s)) => out.extend(s.split_whitespace().map(str::to_string)),
            Some(Value::Array(a)) => out.extend(a.iter().filter_map(Value::as_str).map(str::to_string)),
            _ => {}
        }
    }
    out
}

/// The acting agent: `act.sub` (RFC 8693 delegation), else `azp`, else `client_id`.
pub fn agent(claims: &serde_json::Map<String, Value>) -> Option<String> {
    claims
        .get("act")
        .and_then(|a| a.get("sub"))
        .and_then(Value::as_str)
        .or_else(|| claims.get("azp").and_then(Value::as_str))
        .or_else(|| claims.get("client_id").and_then(Value::as_str))
        .map(str::to_string)
}

/// Test support: signing tokens with generated keys (ring can generate P-256 and Ed25519).
pub mod testing {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair};

    /// A P-256 signing key with its JWKS entry.
    pub struct EcKey {
        pair: EcdsaKeyPair,
        /// `kid` of the key.
        pub kid: String,
    }

    impl EcKey {
        /// A fresh key.
        pub fn generate(kid: &str) -> Self {
            let rng = SystemRandom::new();
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("keygen");
            let pair = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
                .expect("key");
            Self { pair, kid: kid.into() }
        }

        /// The public key as a JWK.
        pub fn jwk(&self) -> Value {
            let p = self.pair.public_key().as_ref();
            serde_json::json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig", "alg": "ES256",
                "x": URL_SAFE_NO_PAD.encode(&p[1..33]), "y": URL_SAFE_NO_PAD.encode(&p[33..65])})
        }

        /// A signed token with `claims` and the header `{"alg":"ES256","typ":"at+jwt","kid":…}`.
        pub fn sign(&self, claims: &Value) -> String {
            self.sign_with_header(&header("ES256", &self.kid), claims)
        }

        /// A signed token with `header` exactly as given (to test header refusals).
        pub fn sign_with_header(&self, header: &Value, claims: &Value) -> String {
            sign_header(header, claims, |msg| {
                self.pair
                    .sign(&SystemRandom::new(), msg)
                    .expect("sign")
                    .as_ref()
                    .to_vec()
            })
        }
    }

    /// An Ed25519 signing key.
    pub struct EdKey {
        pair: Ed25519KeyPair,
        /// `kid` of the key.
        pub kid: String,
    }

    impl EdKey {
        /// A fresh key.
        pub fn generate(kid: &str) -> Self {
            let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("keygen");
            Self {
                pair: Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("key"),
                kid: kid.into(),
            }
        }

        /// The public key as a JWK.
        pub fn jwk(&self) -> Value {
            serde_json::json!({"kty": "OKP", "crv": "Ed25519", "kid": self.kid, "x": URL_SAFE_NO_PAD.encode(self.pair.public_key().as_ref())})
        }

        /// A signed token.
        pub fn sign(&self, claims: &Value) -> String {
            sign_with(&self.kid, "EdDSA", claims, |msg| self.pair.sign(msg).as_ref().to_vec())
        }
    }

    /// The header the signing helpers use: an RFC 9068 access token.
    pub fn header(alg: &str, kid: &str) -> Value {
        serde_json::json!({"alg": alg, "typ": "at+jwt", "kid": kid})
    }

    /// `header.payload.signature` with `sign` over the first two parts, header `typ: at+jwt`.
    pub fn sign_with(kid: &str, alg: &str, claims: &Value, sign: impl FnOnce(&[u8]) -> Vec<u8>) -> String {
        sign_header(&header(alg, kid), claims, sign)
    }

    /// `header.payload.signature` with `header` as given.
    pub fn sign_header(header: &Value, claims: &Value, sign: impl FnOnce(&[u8]) -> Vec<u8>) -> String {
        let msg = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let sig = sign(msg.as_bytes());
        format!("{msg}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    /// An unsigned `alg: none` token.
    pub fn unsigned(claims: &Value) -> String {
        let header = serde_json::json!({"alg": "none", "typ": "at+jwt"});
        format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        )
    }
}

#[cfg(test)]
mod tests {
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
}
