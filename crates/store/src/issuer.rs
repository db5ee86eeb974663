//! The embedded backend's service-account token issuer: ES256-signed JWTs with Kubernetes'
//! service-account claims, and the OpenID discovery documents that let anyone verify them
//! (`/.well-known/openid-configuration`, `/openid/v1/jwks`), as a Kubernetes issuer publishes.

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD as B64URL};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, jwk::Jwk};
use rcgen::PublicKeyData;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    #[error("no signing key")]
    NoKey,
    #[error("cannot generate a signing key: {0}")]
    Generate(#[source] rcgen::Error),
    #[error("signing key {index} is not a P-256 PKCS#8 PEM key: {reason}")]
    LoadKey { index: usize, reason: String },
    #[error("cannot sign token: {0}")]
    Sign(String),
    #[error("token does not verify: {0}")]
    Verify(#[source] jsonwebtoken::errors::Error),
    #[error("token is expired")]
    Expired,
}

struct Key {
    kid: String,
    /// Parsed once: jsonwebtoken's `encode` parses the PKCS#8 key again for every token, which
    /// derives its public key (a second scalar multiplication), and was half of a new account's
    /// signing time. ring's P-256, not the `p256` crate's portable arithmetic: signing was 11% of
    /// the server's CPU under POST load (`benches/http_load.rs`) with the latter.
    signing: ring::signature::EcdsaKeyPair,
    jwk: Jwk,
    decoding: DecodingKey,
}

/// Signs service-account tokens with the newest key and publishes all keys.
pub struct Issuer {
    url: String,
    keys: Vec<Key>,
    /// ECDSA's per-signature nonces.
    random: ring::rand::SystemRandom,
}

/// The nested `kubernetes.io` claim of a service-account token.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KubernetesClaim {
    pub namespace: String,
    pub serviceaccount: Ref,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Ref>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ref {
    pub name: String,
    pub uid: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: Vec<String>,
    pub iat: i64,
    pub nbf: i64,
    pub jti: String,
    /// When the token stops working (a cloud-config issued with `expirationSeconds`); none for
    /// the long-lived Secret tokens Kubernetes issues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<i64>,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaim,
}

/// base64url of the JSON of a JWT's header or claims.
fn b64_json<T: Serialize>(v: &T) -> Result<String, IssuerError> {
    serde_json::to_vec(v)
        .map(|json| B64URL.encode(json))
        .map_err(|e| IssuerError::Sign(e.to_string()))
}

/// A new P-256 key as PKCS#8 PEM, for the store to keep.
pub(crate) fn generate_key_pem() -> Result<String, IssuerError> {
    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map(|k| k.serialize_pem())
        .map_err(IssuerError::Generate)
}

impl Issuer {
    /// `keys` are PKCS#8 PEM P-256 keys, oldest first; the last one signs.
    pub fn new(url: impl Into<String>, keys: &[String]) -> Result<Self, IssuerError> {
        let random = ring::rand::SystemRandom::new();
        let keys = keys
            .iter()
            .enumerate()
            .map(|(index, pem)| {
                let err = |reason: String| IssuerError::LoadKey { index, reason };
                let pair = rcgen::KeyPair::from_pem(pem).map_err(|e| err(e.to_string()))?;
                if pair.algorithm() != &rcgen::PKCS_ECDSA_P256_SHA256 {
                    return Err(err("not a P-256 key".into()));
                }
                // Kubernetes derives the key id from the SHA-256 of the DER public key.
                let kid = B64URL.encode(Sha256::digest(pair.subject_public_key_info()));
                let encoding =
                    EncodingKey::from_ec_pem(pem.as_bytes()).map_err(|e| err(e.to_string()))?;
                let mut jwk = Jwk::from_encoding_key(&encoding, Algorithm::ES256)
                    .map_err(|e| err(e.to_string()))?;
                jwk.common.key_id = Some(kid.clone());
                jwk.common.public_key_use = Some(jsonwebtoken::jwk::PublicKeyUse::Signature);
                let decoding = DecodingKey::from_jwk(&jwk).map_err(|e| err(e.to_string()))?;
                let signing = ring::signature::EcdsaKeyPair::from_pkcs8(
                    &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                    &pair.serialize_der(),
                    &random,
                )
                .map_err(|e| err(e.to_string()))?;
                Ok(Key {
                    kid,
                    signing,
                    jwk,
                    decoding,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(IssuerError::NoKey);
        }
        Ok(Issuer {
            url: url.into(),
            keys,
            random,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// A token bound to a service account and its token Secret, as the Kubernetes token controller
    /// issues for `kubernetes.io/service-account-token` Secrets: long-lived unless `exp` (a Unix
    /// time) gives it an end.
    pub(crate) fn mint_secret_token(
        &self,
        namespace: &str,
        sa_name: &str,
        sa_uid: &str,
        secret_name: &str,
        secret_uid: &str,
        exp: Option<i64>,
    ) -> Result<String, IssuerError> {
        let key = self.keys.last().ok_or(IssuerError::NoKey)?;
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let claims = Claims {
            iss: self.url.clone(),
            sub: format!("system:serviceaccount:{namespace}:{sa_name}"),
            aud: vec![self.url.clone()],
            iat: now,
            nbf: now,
            jti: uuid::Uuid::new_v4().to_string(),
            exp,
            kubernetes: KubernetesClaim {
                namespace: namespace.to_string(),
                serviceaccount: Ref {
                    name: sa_name.to_string(),
                    uid: sa_uid.to_string(),
                },
                secret: Some(Ref {
                    name: secret_name.to_string(),
                    uid: secret_uid.to_string(),
                }),
            },
        };
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(key.kid.clone());
        // JWS compact serialization (RFC 7515): base64url(header) . base64url(claims) .
        // base64url(r || s), the signature ES256's (RFC 7518 §3.4).
        let mut token = b64_json(&header)?;
        token.push('.');
        token.push_str(&b64_json(&claims)?);
        let signature = key
            .signing
            .sign(&self.random, token.as_bytes())
            .map_err(|e| IssuerError::Sign(e.to_string()))?;
        token.push('.');
        token.push_str(&B64URL.encode(signature.as_ref()));
        Ok(token)
    }

    /// Verifies a token of ours (signature, issuer, audience) and returns its claims.
    pub fn verify(&self, token: &str) -> Result<Claims, IssuerError> {
        let header = jsonwebtoken::decode_header(token).map_err(IssuerError::Verify)?;
        let key = self
            .keys
            .iter()
            .find(|k| Some(&k.kid) == header.kid.as_ref())
            .ok_or(IssuerError::NoKey)?;
        let mut v = Validation::new(Algorithm::ES256);
        v.set_issuer(&[&self.url]);
        v.set_audience(&[&self.url]);
        v.set_required_spec_claims(&["iss", "sub", "aud"]);
        // Checked below: a token without `exp` is long-lived, as Kubernetes' Secret tokens are.
        v.validate_exp = false;
        let claims = jsonwebtoken::decode::<Claims>(token, &key.decoding, &v)
            .map(|d| d.claims)
            .map_err(IssuerError::Verify)?;
        if claims
            .exp
            .is_some_and(|exp| exp <= time::OffsetDateTime::now_utc().unix_timestamp())
        {
            return Err(IssuerError::Expired);
        }
        Ok(claims)
    }

    /// `/.well-known/openid-configuration`, shaped as kube-apiserver serves it.
    pub fn openid_configuration(&self) -> Value {
        json!({
            "issuer": self.url,
            "jwks_uri": format!("{}/openid/v1/jwks", self.url.trim_end_matches('/')),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
    }

    /// `/openid/v1/jwks`: every key, so tokens signed by an older key still verify.
    pub fn jwks(&self) -> Value {
        json!({ "keys": self.keys.iter().map(|k| &k.jwk).collect::<Vec<_>>() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_issuer(n: usize) -> Issuer {
        let keys: Vec<String> = (0..n).map(|_| generate_key_pem().unwrap()).collect();
        Issuer::new("https://issuer.test", &keys).unwrap()
    }

    #[test]
    fn minted_tokens_verify_with_kubernetes_claims() {
        let issuer = mk_issuer(1);
        let t = issuer
            .mint_secret_token("gc-test", "gc4", "sa-uid", "gc4-token", "secret-uid", None)
            .unwrap();
        let c = issuer.verify(&t).unwrap();
        assert_eq!(c.sub, "system:serviceaccount:gc-test:gc4");
        assert_eq!(c.kubernetes.namespace, "gc-test");
        assert_eq!(
            c.kubernetes.serviceaccount,
            Ref {
                name: "gc4".into(),
                uid: "sa-uid".into()
            }
        );
        assert_eq!(c.kubernetes.secret.unwrap().name, "gc4-token");
        assert_eq!(c.iss, "https://issuer.test");
    }

    #[test]
    fn tokens_from_another_issuer_or_tampered_fail() {
        let (a, b) = (mk_issuer(1), mk_issuer(1));
        let t = a
            .mint_secret_token("n", "s", "u", "s-token", "v", None)
            .unwrap();
        assert!(b.verify(&t).is_err());
        let mut parts: Vec<String> = t.split('.').map(str::to_string).collect();
        parts[1] = B64URL
            .encode(br#"{"iss":"https://issuer.test","sub":"system:serviceaccount:n:admin"}"#);
        assert!(a.verify(&parts.join(".")).is_err());
    }

    #[test]
    fn a_token_with_an_end_stops_then() {
        let issuer = mk_issuer(1);
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let live = issuer
            .mint_secret_token("n", "s", "u", "s-token", "v", Some(now + 60))
            .unwrap();
        assert_eq!(issuer.verify(&live).unwrap().exp, Some(now + 60));
        let ended = issuer
            .mint_secret_token("n", "s", "u", "s-token", "v", Some(now - 1))
            .unwrap();
        assert!(matches!(issuer.verify(&ended), Err(IssuerError::Expired)));
    }

    #[test]
    fn jwks_publishes_every_key_with_its_kid() {
        let issuer = mk_issuer(2);
        let jwks = issuer.jwks();
        let keys = jwks["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 2);
        for k in keys {
            assert_eq!(k["kty"], "EC");
            assert_eq!(k["crv"], "P-256");
            assert_eq!(k["use"], "sig");
            assert!(k["kid"].as_str().is_some_and(|s| s.len() == 43));
        }
        assert_eq!(
            issuer.openid_configuration()["jwks_uri"],
            "https://issuer.test/openid/v1/jwks"
        );
    }
}
