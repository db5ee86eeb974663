//! The embedded backend's service-account token controller: it fills a token Secret as it is
//! created, as Kubernetes' token controller does, with a JWT the store's issuer signs.

use std::sync::Arc;

use base64::{Engine, engine::general_purpose::STANDARD as B64};
use serde_json::{Value, json};

use super::{
    EmbeddedStore, TokenController,
    overlay::{Overlay, View},
    semantics::not_an_object,
};
use crate::StoreError;

const SA_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";
const SA_NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
const SA_UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";

impl EmbeddedStore {
    pub(super) fn token_controller(&self) -> Option<Arc<TokenController>> {
        self.token_controller
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What the token of `secret` would be minted for in `state`: `None` when it is not to be
    /// filled (not a token Secret, no controller, no such ServiceAccount, another one's UID).
    /// A ServiceAccount created in the same write (`pending`) counts as there.
    fn claims(&self, state: &View, pending: Option<&Value>, secret: &Value) -> Option<Claims> {
        if secret.get("type").and_then(Value::as_str) != Some(SA_TOKEN_TYPE) {
            return None;
        }
        let controller = self.token_controller()?;
        let (namespace, secret_name) = crate::object_key(secret);
        let annotation = |k: &str| {
            secret
                .pointer(&format!("/metadata/annotations/{}", k.replace('/', "~1")))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let sa_name = annotation(SA_NAME_ANNOTATION)?;
        // Without its ServiceAccount, Kubernetes leaves such a Secret unfilled (and later removes
        // it); so do we.
        let uid_of = |sa: &Value| {
            sa.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let sa_uid = match state.get("v1", "ServiceAccount", &namespace, &sa_name) {
            Some(sa) => uid_of(&sa),
            None => uid_of(pending.filter(|p| {
                p.get("kind").and_then(Value::as_str) == Some("ServiceAccount")
                    && crate::object_key(p) == (namespace.clone(), sa_name.clone())
            })?),
        };
        if annotation(SA_UID_ANNOTATION).is_some_and(|u| u != sa_uid) {
            return None;
        }
        let secret_uid = secret
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        // A cloud-config token with an end carries it as `exp` too (the sweeper deletes its Secret
        // then; the claim holds even if the sweeper is late).
        let exp = controller
            .end_annotation
            .and_then(annotation)
            .and_then(|v| {
                time::OffsetDateTime::parse(&v, &time::format_description::well_known::Rfc3339).ok()
            })
            .map(time::OffsetDateTime::unix_timestamp);
        Some(Claims {
            namespace,
            sa_name,
            sa_uid,
            secret_name,
            secret_uid,
            exp,
        })
    }

    fn mint(&self, claims: &Claims) -> Result<String, StoreError> {
        let controller = self.token_controller().ok_or_else(|| StoreError::Invalid {
            kind: "secret".into(),
            name: claims.secret_name.clone(),
            reason: "no token controller".into(),
        })?;
        controller
            .issuer
            .mint_secret_token(
                &claims.namespace,
                &claims.sa_name,
                &claims.sa_uid,
                &claims.secret_name,
                &claims.secret_uid,
                claims.exp,
            )
            .map_err(|e| StoreError::Invalid {
                kind: "secret".into(),
                name: claims.secret_name.clone(),
                reason: format!("cannot mint service-account token: {e}"),
            })
    }

    /// Signs the token of a Secret about to be created (its uid already set) before the write
    /// takes the writer: signing is most of a token Secret's create, and writes are serialised.
    /// [`Self::fill_token`] uses it only if the state then still gives the same claims.
    pub(super) fn premint(&self, secret: &Value, pending: Option<&Value>) -> Option<Minted> {
        let claims = self.claims(
            &View::new(&self.read(), &Overlay::default()),
            pending,
            secret,
        )?;
        let token = self.mint(&claims).ok()?;
        Some(Minted { claims, token })
    }

    /// Fills a service-account token Secret as Kubernetes' token controller would, with the
    /// token `minted` beforehand when it was minted for what the state says now.
    pub(super) fn fill_token(
        &self,
        state: &View,
        pending: Option<&Value>,
        secret: &mut Value,
        minted: Option<Minted>,
    ) -> Result<(), StoreError> {
        let Some(claims) = self.claims(state, pending, secret) else {
            return Ok(());
        };
        let Some(controller) = self.token_controller() else {
            return Ok(());
        };
        let token = match minted {
            Some(m) if m.claims == claims => m.token,
            _ => self.mint(&claims)?,
        };
        let Claims {
            namespace,
            sa_uid,
            secret_name: name,
            ..
        } = claims;
        let obj = secret
            .as_object_mut()
            .ok_or_else(|| not_an_object("secret", &name))?;
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| not_an_object("secret", &name))?;
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| not_an_object("secret", &name))?;
        annotations.insert(SA_UID_ANNOTATION.into(), Value::from(sa_uid));
        let data = obj
            .entry("data")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| not_an_object("secret", &name))?;
        data.insert("token".into(), Value::from(B64.encode(token)));
        data.insert("ca.crt".into(), Value::from(B64.encode(&controller.ca_pem)));
        data.insert("namespace".into(), Value::from(B64.encode(&namespace)));
        Ok(())
    }
}

/// What a Secret's token is minted for.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Claims {
    namespace: String,
    sa_name: String,
    sa_uid: String,
    secret_name: String,
    secret_uid: String,
    exp: Option<i64>,
}

/// A token signed before its write, and what for.
pub(super) struct Minted {
    claims: Claims,
    token: String,
}
