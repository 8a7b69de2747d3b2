//! `ring` as jsonwebtoken's crypto provider: verification only.

use super::*;

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
pub(super) fn install_provider() -> bool {
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
