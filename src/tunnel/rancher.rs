//! Rancher's side of the aggregation, on the Kubernetes API: the `APIService`
//! (`management.cattle.io/v3`) that asks Rancher to route `/v1/harvester/kubeconfig` to us, and
//! the Secret Rancher answers with (`url`, `token`, `ca.crt`), watched by name and turned into the
//! tunnel's [`Endpoint`].
//!
//! Rancher's router is a Go `http.ServeMux` built from every APIService's `paths` (exact
//! patterns) and `pathPrefixes` (subtree patterns); ServeMux sends a request to the most specific
//! pattern that matches, whatever the registration order. So our exact path
//! `/v1/harvester/kubeconfig` takes that one path from Harvester's own APIService (prefix
//! `/v1/harvester/`, path `/v1/harvester`), and the rest of `/v1/harvester/` stays Harvester's.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use thiserror::Error;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Endpoint;

/// The one path we ask Rancher to route to us.
pub const PATHS: &[&str] = &["/v1/harvester/kubeconfig"];
const FIELD_MANAGER: &str = "harvester-cloud";

/// Which APIService to register and where Rancher is to put its Secret.
#[derive(Clone, Debug)]
pub struct ApiServiceSpec {
    pub name: String,
    pub secret_namespace: String,
    pub secret_name: String,
}

#[derive(Debug, Error)]
pub enum RegisterError {
    #[error(
        "cannot register APIService {name}: {source} (is Rancher's management.cattle.io/v3 APIService kind served here? the Helm chart creates the object; the service may only patch it)"
    )]
    Apply { name: String, source: kube::Error },
}

fn api_services(client: &Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ApiResource {
            group: "management.cattle.io".into(),
            version: "v3".into(),
            api_version: "management.cattle.io/v3".into(),
            kind: "APIService".into(),
            plural: "apiservices".into(),
        },
    )
}

/// Creates or updates the APIService (server-side apply: only the fields we own).
pub async fn register(client: &Client, spec: &ApiServiceSpec) -> Result<(), RegisterError> {
    let obj = json!({
        "apiVersion": "management.cattle.io/v3",
        "kind": "APIService",
        "metadata": {
            "name": spec.name,
            "labels": {"app.kubernetes.io/managed-by": "harvester-cloud"},
        },
        "spec": {
            "secretName": spec.secret_name,
            "secretNamespace": spec.secret_namespace,
            "paths": PATHS,
        }
    });
    api_services(client)
        .patch(
            &spec.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&obj),
        )
        .await
        .map_err(|source| RegisterError::Apply {
            name: spec.name.clone(),
            source,
        })?;
    info!(apiservice = %spec.name, paths = ?PATHS, "registered the Rancher APIService");
    Ok(())
}

/// The tunnel's endpoint from the Secret's data; `None` while Rancher has not filled it.
pub fn endpoint_of(secret: &Secret) -> Option<Endpoint> {
    let data = secret.data.as_ref()?;
    let text = |k: &str| {
        data.get(k)
            .map(|b| String::from_utf8_lossy(&b.0).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    Some(Endpoint {
        url: text("url")?,
        token: text("token")?,
        ca_pem: data.get("ca.crt").map(|b| b.0.clone()).unwrap_or_default(),
    })
}

/// Follows the Secret `namespace/name` until `stop`, publishing its endpoint on `tx` whenever it
/// changes (and `None` when the Secret goes or lacks a field).
pub async fn follow_secret(
    client: Client,
    namespace: String,
    name: String,
    tx: watch::Sender<Option<Endpoint>>,
    stop: CancellationToken,
) {
    let secrets: Api<Secret> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(secrets, config).default_backoff().boxed();
    let publish = |endpoint: Option<Endpoint>| {
        tx.send_if_modified(|current| {
            if *current != endpoint {
                *current = endpoint;
                true
            } else {
                false
            }
        });
    };
    // Whether the current (re)list has seen the Secret: a relist without it means it is gone.
    let mut seen = false;
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            next = events.next() => match next {
                None => return,
                Some(Ok(event)) => event,
                Some(Err(e)) => {
                    warn!(error = %e, %namespace, %name, "watching the APIService secret");
                    continue;
                }
            },
        };
        match event {
            watcher::Event::Init => seen = false,
            watcher::Event::InitApply(secret) | watcher::Event::Apply(secret) => {
                seen = true;
                let endpoint = endpoint_of(&secret);
                if endpoint.is_none() {
                    info!(%namespace, %name, "the APIService secret has no url or token yet");
                }
                publish(endpoint);
            }
            watcher::Event::InitDone => {
                if !seen {
                    info!(%namespace, %name, "no APIService secret yet: waiting for Rancher to write it");
                    publish(None);
                }
            }
            watcher::Event::Delete(_) => {
                info!(%namespace, %name, "the APIService secret was deleted");
                publish(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn mk_secret(pairs: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn endpoint_needs_url_and_token() {
        assert_eq!(endpoint_of(&Secret::default()), None);
        assert_eq!(
            endpoint_of(&mk_secret(&[("url", "https://r/v3/connect")])),
            None
        );
        let e = endpoint_of(&mk_secret(&[
            ("url", "https://r/v3/connect\n"),
            ("token", "t"),
            ("ca.crt", "PEM"),
        ]))
        .unwrap();
        assert_eq!(e.url, "https://r/v3/connect");
        assert_eq!(e.token, "t");
        assert_eq!(e.ca_pem, b"PEM");
    }
}
