//! OAuth 2.1 resource server: JWT access tokens verified against an issuer's JWKS with `ring`.
//! `alg: none` and algorithms outside the allowlist are refused before any key is looked up.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::Value;

/// Why a token is refused (`reason` is a stable label; the text never echoes the token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TokenError {
    /// Stable label: `malformed`, `algorithm`, `unknown_key`, `signature`, `expired`,
    /// `not_yet_valid`, `issuer`, `audience`, `claims`.
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
    /// Tolerated clock skew, seconds.
    pub leeway: i64,
    /// Now, Unix seconds.
    pub now: i64,
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
    let alg = header.get("alg").and_then(Value::as_str).unwrap_or("none");
    if alg.eq_ignore_ascii_case("none") || !want.algorithms.iter().any(|a| a == alg) {
        return Err(err("algorithm", format!("algorithm `{alg}` is not accepted")));
    }
    let sig = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| err("malformed", "the signature is not base64url"))?;
    let kid = header.get("kid").and_then(Value::as_str);
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
    let num = |k: &str| claims.get(k).and_then(Value::as_f64).map(|f| f as i64);
    let exp = num("exp").ok_or_else(|| err("claims", "the token has no `exp`"))?;
    if want.now > exp + want.leeway {
        return Err(err("expired", "the token has expired"));
    }
    if num("nbf").is_some_and(|nbf| want.now + want.leeway < nbf) {
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

        /// A signed token with `claims` (header `alg` may be overridden to test refusals).
        pub fn sign(&self, claims: &Value) -> String {
            sign_with(&self.kid, "ES256", claims, |msg| {
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

    /// `header.payload.signature` with `sign` over the first two parts.
    pub fn sign_with(kid: &str, alg: &str, claims: &Value, sign: impl FnOnce(&[u8]) -> Vec<u8>) -> String {
        let header = serde_json::json!({"alg": alg, "typ": "JWT", "kid": kid});
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
        let header = serde_json::json!({"alg": "none", "typ": "JWT"});
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

    fn want(algs: &[String]) -> Expectations<'_> {
        Expectations {
            issuer: "https://issuer.test",
            audience: "https://mcp.test/mcp",
            algorithms: algs,
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
}
