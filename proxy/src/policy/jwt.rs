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

/// Verification on `ring` for jsonwebtoken. The proxy only verifies: signing is refused.
static RING: CryptoProvider = CryptoProvider {
    signer_factory: no_signer,
    verifier_factory: ring_verifier,
    key_utils: KeyUtils {
        rsa_pub_components_from_private_key: |_| Err(ErrorKind::Provider("private keys are not used".into()).into()),
        rsa_pub_components_from_public_key: |_| Err(ErrorKind::Provider("PEM keys are not used".into()).into()),
        ec_pub_components_from_private_key: |_, _| Err(ErrorKind::Provider("private keys are not used".into()).into()),
        ed_pub_components_from_private_key: |_, _| Err(ErrorKind::Provider("private keys are not used".into()).into()),
        compute_digest: digest,
    },
};

/// Installs [`RING`] as jsonwebtoken's process-wide provider; whether it is the one in use
/// (nothing else installs one: the crate is built without a provider of its own, and if
/// anything ever did, tokens are refused rather than verified by unknown code).
fn install_provider() -> bool {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = RING.install_default();
    });
    CryptoProvider::try_get_default().is_some_and(|p| std::ptr::eq(p, &RING))
}

fn no_signer(_: &Algorithm, _: &EncodingKey) -> jsonwebtoken::errors::Result<Box<dyn JwtSigner>> {
    Err(ErrorKind::Provider("the proxy does not sign tokens".into()).into())
}

fn digest(data: &[u8], hash: ThumbprintHash) -> jsonwebtoken::errors::Result<Vec<u8>> {
    let alg = match hash {
        ThumbprintHash::SHA256 => &ring::digest::SHA256,
        ThumbprintHash::SHA384 => &ring::digest::SHA384,
        _ => &ring::digest::SHA512,
    };
    Ok(ring::digest::digest(alg, data).as_ref().to_vec())
}

/// One algorithm and one public key, verified with `ring`.
struct RingVerifier {
    alg: Algorithm,
    key: DecodingKeyKind,
}

fn ring_verifier(alg: &Algorithm, key: &DecodingKey) -> jsonwebtoken::errors::Result<Box<dyn JwtVerifier>> {
    let fits = matches!(
        (alg.family(), key.family()),
        (AlgorithmFamily::Rsa, AlgorithmFamily::Rsa)
            | (AlgorithmFamily::Ec, AlgorithmFamily::Ec)
            | (AlgorithmFamily::Ed, AlgorithmFamily::Ed)
    );
    if !fits {
        return Err(ErrorKind::InvalidAlgorithm.into());
    }
    Ok(Box::new(RingVerifier {
        alg: *alg,
        key: key.kind().clone(),
    }))
}

impl ::signature::Verifier<Vec<u8>> for RingVerifier {
    fn verify(&self, msg: &[u8], sig: &Vec<u8>) -> Result<(), ::signature::Error> {
        let ok = match (&self.key, self.alg) {
            (DecodingKeyKind::RsaModulusExponent { n, e }, alg) => {
                let params = match alg {
                    Algorithm::RS256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    Algorithm::RS384 => &signature::RSA_PKCS1_2048_8192_SHA384,
                    Algorithm::RS512 => &signature::RSA_PKCS1_2048_8192_SHA512,
                    Algorithm::PS256 => &signature::RSA_PSS_2048_8192_SHA256,
                    Algorithm::PS384 => &signature::RSA_PSS_2048_8192_SHA384,
                    Algorithm::PS512 => &signature::RSA_PSS_2048_8192_SHA512,
                    _ => return Err(::signature::Error::new()),
                };
                RsaPublicKeyComponents { n, e }.verify(params, msg, sig).is_ok()
            }
            (DecodingKeyKind::SecretOrDer(point), Algorithm::ES256) => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(msg, sig)
                    .is_ok()
            }
            (DecodingKeyKind::SecretOrDer(point), Algorithm::ES384) => {
                UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                    .verify(msg, sig)
                    .is_ok()
            }
            (DecodingKeyKind::SecretOrDer(x), Algorithm::EdDSA) => {
                UnparsedPublicKey::new(&signature::ED25519, x).verify(msg, sig).is_ok()
            }
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(::signature::Error::new())
        }
    }
}

impl JwtVerifier for RingVerifier {
    fn algorithm(&self) -> Algorithm {
        self.alg
    }
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

    /// An RSA 2048 signing key, fixed (ring cannot generate RSA keys): a test-only key made
    /// for these tests with `openssl genpkey` and `openssl pkcs8 -topk8` (PKCS#8 DER), never
    /// used anywhere else.
    pub struct RsaKey {
        pair: signature::RsaKeyPair,
        /// `kid` of the key.
        pub kid: String,
    }

    impl RsaKey {
        /// The test key.
        pub fn fixed(kid: &str) -> Self {
            let pair = signature::RsaKeyPair::from_pkcs8(include_bytes!("testdata/rsa-2048-test-only.pk8"))
                .expect("the test key");
            Self { pair, kid: kid.into() }
        }

        /// The public key as a JWK.
        pub fn jwk(&self) -> Value {
            let public: RsaPublicKeyComponents<Vec<u8>> = self.pair.public().into();
            serde_json::json!({"kty": "RSA", "kid": self.kid,
                "n": URL_SAFE_NO_PAD.encode(&public.n), "e": URL_SAFE_NO_PAD.encode(&public.e)})
        }

        /// A token signed with `alg` (RS256, RS384, RS512, PS256, PS384, PS512).
        pub fn sign(&self, alg: &str, claims: &Value) -> String {
            let padding: &'static dyn signature::RsaEncoding = match alg {
                "RS256" => &signature::RSA_PKCS1_SHA256,
                "RS384" => &signature::RSA_PKCS1_SHA384,
                "RS512" => &signature::RSA_PKCS1_SHA512,
                "PS256" => &signature::RSA_PSS_SHA256,
                "PS384" => &signature::RSA_PSS_SHA384,
                _ => &signature::RSA_PSS_SHA512,
            };
            sign_with(&self.kid, alg, claims, |msg| {
                let mut sig = vec![0; self.pair.public().modulus_len()];
                self.pair
                    .sign(padding, &SystemRandom::new(), msg, &mut sig)
                    .expect("sign");
                sig
            })
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
            let c =
                verify_token(&rsa.sign(alg, &claims()), &keys, &want(&all)).unwrap_or_else(|e| panic!("{alg}: {e}"));
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
}
