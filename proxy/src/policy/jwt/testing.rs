//! Test support: signing tokens with generated keys (ring can generate P-256 and Ed25519).

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
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("keygen");
        let pair =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).expect("key");
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
        let pair =
            signature::RsaKeyPair::from_pkcs8(include_bytes!("testdata/rsa-2048-test-only.pk8")).expect("the test key");
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
