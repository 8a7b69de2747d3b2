//! OAuth 2.1 resource server: JWT access tokens, parsed and verified with `jsonwebtoken` (JWS
//! compact serialization, JWK to key, algorithm/key matching, signature, `iss` and `aud`),
//! with `ring` as its crypto provider (the workspace's one crypto stack; the crate is built
//! without its own).
//!
//! Checks jsonwebtoken does not make, or makes more loosely, stay here and run first, so a
//! token is refused before any key is looked up: `alg: none` and algorithms outside the
//! allowlist; any `crit` header parameter (none is understood, RFC 7515 §4.1.11, where
//! jsonwebtoken accepts `b64`); a `typ` outside the accepted token types (RFC 9068 access tokens
//! are `at+jwt`). After the signature: NumericDates must be whole seconds up to year 9999,
//! `exp` is required and checked with the leeway against the caller's clock, and `sub` must be
//! non-empty.

use std::sync::Once;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, ThumbprintHash};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, DecodingKeyKind, EncodingKey, Validation};
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
    /// The curve of an EC key (ES256 needs P-256, ES384 P-384).
    curve: Option<EllipticCurve>,
    key: DecodingKey,
}

/// Parses a JWKS document with jsonwebtoken's JWK model. Keys that cannot verify signatures
/// here are skipped: `use` other than `sig`, symmetric (`oct`) and unknown key types, curves
/// other than P-256, P-384 and Ed25519. A key of a supported type that does not parse is an
/// error, and so is a JWKS with no usable key.
pub fn parse_jwks(text: &str) -> Result<Vec<Jwk>, String> {
    if !install_provider() {
        return Err("another JOSE crypto provider is installed in this process".into());
    }
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("JWKS is not JSON: {e}"))?;
    let keys = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("JWKS has no `keys` array")?;
    let mut out = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        if k.get("use").and_then(Value::as_str).is_some_and(|u| u != "sig") {
            continue;
        }
        let kty = k.get("kty").and_then(Value::as_str);
        let crv = k.get("crv").and_then(Value::as_str);
        let supported = match kty {
            Some("RSA") => true,
            Some("EC") => matches!(crv, Some("P-256" | "P-384")),
            Some("OKP") => crv == Some("Ed25519"),
            _ => false,
        };
        if !supported {
            continue;
        }
        let bad = |why: String| format!("JWKS key {i} ({}) is malformed: {why}", kty.unwrap_or_default());
        let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(k.clone()).map_err(|e| bad(e.to_string()))?;
        let curve = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => None,
            AlgorithmParameters::EllipticCurve(p) => Some(p.curve.clone()),
            AlgorithmParameters::OctetKeyPair(p) => Some(p.curve.clone()),
            _ => return Err(bad("a member is missing or of the wrong type".into())),
        };
        let key = DecodingKey::from_jwk(&jwk).map_err(|e| bad(e.to_string()))?;
        out.push(Jwk {
            kid: jwk.common.key_id,
            alg: k.get("alg").and_then(Value::as_str).map(str::to_string),
            curve,
            key,
        });
    }
    if out.is_empty() {
        return Err("JWKS has no usable signing keys".into());
    }
    Ok(out)
}

fn key_fits(alg: Algorithm, key: &Jwk) -> bool {
    match (alg, key.key.family()) {
        (Algorithm::ES256, AlgorithmFamily::Ec) => key.curve == Some(EllipticCurve::P256),
        (Algorithm::ES384, AlgorithmFamily::Ec) => key.curve == Some(EllipticCurve::P384),
        (Algorithm::EdDSA, AlgorithmFamily::Ed) => key.curve == Some(EllipticCurve::Ed25519),
        (a, AlgorithmFamily::Rsa) => a.family() == AlgorithmFamily::Rsa,
        _ => false,
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

/// The `kid` of a token's header (to pick the key), without verifying anything.
pub fn peek_kid(token: &str) -> Option<String> {
    jsonwebtoken::decode_header(token).ok()?.kid
}

/// jsonwebtoken's refusal as one of the stable reasons.
fn refusal(kind: &ErrorKind) -> TokenError {
    match kind {
        ErrorKind::InvalidSignature => err("signature", "the signature does not verify"),
        ErrorKind::InvalidIssuer => err("issuer", "the token was issued by another issuer"),
        ErrorKind::MissingRequiredClaim(c) if c == "iss" => err("issuer", "the token has no `iss`"),
        ErrorKind::InvalidAudience => err("audience", "the token is not meant for this resource"),
        ErrorKind::MissingRequiredClaim(c) if c == "aud" => err("audience", "the token has no `aud`"),
        ErrorKind::InvalidClaimFormat(c) if c == "aud" => {
            err("audience", "the token's `aud` is not a string or a list")
        }
        ErrorKind::MissingRequiredClaim(c) | ErrorKind::InvalidClaimFormat(c) => {
            err("claims", format!("the token's `{c}` is missing or malformed"))
        }
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm | ErrorKind::InvalidAlgorithmName => {
            err("algorithm", "the token's algorithm does not fit the key")
        }
        ErrorKind::ExpiredSignature => err("expired", "the token has expired"),
        ErrorKind::ImmatureSignature => err("not_yet_valid", "the token is not valid yet"),
        _ => err("malformed", "the token is not a well-formed signed JWT"),
    }
}

/// Verifies `token` with `keys` and returns its claims.
pub fn verify_token(
    token: &str,
    keys: &[Jwk],
    want: &Expectations<'_>,
) -> Result<serde_json::Map<String, Value>, TokenError> {
    if !install_provider() {
        return Err(err(
            "signature",
            "another JOSE crypto provider is installed in this process",
        ));
    }
    let mut parts = token.split('.');
    let (Some(h), Some(_), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(err("malformed", "the token is not a JWS compact serialization"));
    };
    // The header is read here first: jsonwebtoken's header model would refuse an unknown `alg`
    // or a `crit` without saying which, and does not know `typ` rules.
    let header: Value = URL_SAFE_NO_PAD
        .decode(h)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| err("malformed", "the token header is not base64url JSON"))?;
    let Value::Object(header) = header else {
        return Err(err("malformed", "the token header is not a JSON object"));
    };
    let alg_name = header.get("alg").and_then(Value::as_str).unwrap_or("none");
    let alg = (!alg_name.eq_ignore_ascii_case("none") && want.algorithms.iter().any(|a| a == alg_name))
        .then(|| alg_name.parse::<Algorithm>().ok())
        .flatten()
        .ok_or_else(|| err("algorithm", format!("algorithm `{alg_name}` is not accepted")))?;
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
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(k)) => Some(k.as_str()),
        Some(_) => return Err(err("malformed", "the token's `kid` is not a string")),
    };
    let candidates: Vec<&Jwk> = keys
        .iter()
        .filter(|k| key_fits(alg, k))
        .filter(|k| k.alg.as_deref().is_none_or(|a| a == alg_name))
        .filter(|k| kid.is_none() || k.kid.as_deref() == kid)
        .collect();
    if candidates.is_empty() {
        return Err(err(
            "unknown_key",
            "no key of the issuer matches the token's kid and algorithm",
        ));
    }
    // jsonwebtoken: signature, then `iss` and `aud`. Times are checked below against the
    // caller's clock, with stricter NumericDates than its own.
    let mut validation = Validation::new(alg);
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.leeway = 0;
    validation.set_required_spec_claims(&["iss", "aud"]);
    validation.set_issuer(&[want.issuer]);
    validation.set_audience(&[want.audience]);
    let mut claims = None;
    for key in candidates {
        match jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key.key, &validation) {
            Ok(data) => {
                claims = Some(data.claims);
                break;
            }
            // Another key with this kid and algorithm may be the one (rotation).
            Err(e) if matches!(e.kind(), ErrorKind::InvalidSignature) => {}
            Err(e) => return Err(refusal(e.kind())),
        }
    }
    let claims = claims.ok_or_else(|| refusal(&ErrorKind::InvalidSignature))?;
    // jsonwebtoken also takes an `iss` array with the issuer among others: exactly one is
    // required here.
    if claims.get("iss").and_then(Value::as_str) != Some(want.issuer) {
        return Err(err("issuer", "the token was issued by another issuer"));
    }
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

mod provider;
use provider::install_provider;
pub mod testing;
#[cfg(test)]
mod tests;
