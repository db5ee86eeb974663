//! The router served on connections that arrive through the Rancher aggregation tunnel
//! ([`crate::tunnel`]): HTTP/1, as Rancher's proxy speaks it, each request marked [`ViaTunnel`] so
//! that authentication may take the caller's identity from Rancher's `Impersonate-*` headers
//! there, and only there.

use std::time::Duration;

use std::collections::BTreeMap;

use axum::{Extension, Router, http::HeaderMap};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, debug_span};

use crate::{
    auth::{Identity, Principal},
    tunnel::{Accept, TunnelStream},
};

/// How long Rancher may take to send a request's head on a tunnelled connection.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Marks a request that came through the tunnel (set by [`acceptor`], never by a client).
#[derive(Clone, Copy, Debug)]
pub struct ViaTunnel;

/// Serves `router` on every tunnelled connection until it closes or `shutdown` (then in-flight
/// requests finish and the connection closes).
pub fn acceptor(router: Router, shutdown: CancellationToken) -> Accept {
    let router = router.layer(Extension(ViaTunnel));
    std::sync::Arc::new(move |stream: TunnelStream| {
        let id = stream.id();
        let service = TowerToHyperService::new(router.clone());
        let shutdown = shutdown.clone();
        tokio::spawn(
            async move {
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .keep_alive(true);
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                let mut conn = std::pin::pin!(conn);
                let result = tokio::select! {
                    r = conn.as_mut() => r,
                    _ = shutdown.cancelled() => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                };
                if let Err(e) = result {
                    debug!(error = %e, "tunnelled connection ended with an error");
                }
            }
            .instrument(debug_span!("tunnel_conn", conn = id)),
        );
    })
}

const IMPERSONATE_USER: &str = "impersonate-user";
const IMPERSONATE_UID: &str = "impersonate-uid";
const IMPERSONATE_GROUP: &str = "impersonate-group";
const IMPERSONATE_EXTRA: &str = "impersonate-extra-";

/// The caller Rancher names in its `Impersonate-*` headers (user, uid, one header per group, and
/// `Impersonate-Extra-<key>` per extra, the key lower-cased and percent-decoded as kube-apiserver
/// reads it). `None` without an `Impersonate-User`. Only for requests marked [`ViaTunnel`].
pub fn impersonated(headers: &HeaderMap) -> Option<Principal> {
    let text = |v: &axum::http::HeaderValue| v.to_str().ok().map(str::to_string);
    let username = headers
        .get(IMPERSONATE_USER)
        .and_then(text)
        .filter(|u| !u.is_empty())?;
    let uid = headers
        .get(IMPERSONATE_UID)
        .and_then(text)
        .unwrap_or_default();
    let groups = headers
        .get_all(IMPERSONATE_GROUP)
        .iter()
        .filter_map(text)
        .collect();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(IMPERSONATE_EXTRA) else {
            continue;
        };
        let key = percent_encoding::percent_decode_str(key)
            .decode_utf8_lossy()
            .to_lowercase();
        if let Some(v) = text(value) {
            extra.entry(key).or_default().push(v);
        }
    }
    Some(Principal {
        name: username.clone(),
        identity: Identity::User {
            username,
            uid,
            groups,
            extra,
        },
    })
}

/// Who a tunnelled request without `Impersonate-User` and without a bearer token is: Rancher
/// sends such a request for a caller it did not authenticate.
pub fn anonymous() -> Principal {
    Principal {
        name: "system:anonymous".into(),
        identity: Identity::User {
            username: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn rancher_headers_make_a_user() {
        let p = impersonated(&mk_headers(&[
            ("Impersonate-User", "u-abc12"),
            ("Impersonate-Group", "system:authenticated"),
            ("Impersonate-Group", "github_org://42"),
            ("Impersonate-Extra-Username", "Alice"),
            ("Impersonate-Extra-Principalid", "local://u-abc12"),
            ("Impersonate-Extra-Requesthost", "rancher.example"),
            ("Impersonate-Extra-Acme.com%2fteam", "x"),
        ]))
        .unwrap();
        let Identity::User {
            username,
            groups,
            extra,
            uid,
        } = p.identity
        else {
            panic!("a user");
        };
        assert_eq!(username, "u-abc12");
        assert_eq!(uid, "");
        assert_eq!(groups, ["system:authenticated", "github_org://42"]);
        assert_eq!(extra["username"], ["Alice"]);
        assert_eq!(extra["principalid"], ["local://u-abc12"]);
        assert_eq!(extra["requesthost"], ["rancher.example"]);
        assert_eq!(extra["acme.com/team"], ["x"]);
    }

    #[test]
    fn no_user_no_identity() {
        assert!(impersonated(&mk_headers(&[("Impersonate-Group", "system:masters")])).is_none());
        assert!(impersonated(&mk_headers(&[("Impersonate-User", "")])).is_none());
    }
}
