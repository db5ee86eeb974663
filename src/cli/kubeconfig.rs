//! `harvester-cloud kubeconfig …`: `generate` ensures a guest cluster's service account in a
//! Harvester cluster through the Kubernetes API, as the cloud-config API would, and prints its cloud
//! config and cloud-init user data (the replacement for `generate_addon.sh`); `list`, `rotate` and
//! `revoke` show, rotate and revoke the accounts the service issued, through a running service (`--url`, HTTP) or
//! in the cluster (`--kubeconfig`). Each subcommand is one arm of [`run`].

use std::{path::Path, sync::Arc, time::Duration};

use axum::http::{Method, Request, StatusCode, Uri, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

use crate::kubeconfig::{
    AccountRequest, CloudConfig, CloudConfigError, RequestError, Revocation, Settings,
    accounts::{Account, AccountPage, Accounts, AccountsError, ListQuery, MAX_LIMIT},
    render,
};
use crate::{
    config::{
        AccountsTarget, KubeArgs, KubeConfigError, KubeconfigCommand, OutputKind, RotateOutput,
    },
    store::{ObjectStore, kubernetes::KubeStore},
};

/// A `kubeconfig` subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigCliError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Config(#[from] KubeConfigError),
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error(transparent)]
    Issue(#[from] CloudConfigError),
    #[error(transparent)]
    Accounts(#[from] AccountsError),
    #[error("cannot read {what} {path}: {source}")]
    ReadFile {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("invalid --url {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("cannot reach {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("{url} answered {status}: {message}")]
    Status {
        url: String,
        status: StatusCode,
        message: String,
    },
    #[error("{url} answered something that is not what was asked for: {reason}")]
    Answer { url: String, reason: String },
    #[error("cannot write the output: {0}")]
    Output(#[source] serde_json::Error),
}

/// Runs one `kubeconfig` subcommand.
pub async fn run(command: KubeconfigCommand) -> Result<(), KubeconfigCliError> {
    match command {
        KubeconfigCommand::Generate {
            service_account,
            namespace,
            kube,
            server_url,
            token_timeout,
        } => {
            generate(
                &service_account,
                &namespace,
                &kube,
                server_url,
                token_timeout,
            )
            .await
        }
        KubeconfigCommand::List {
            namespace,
            target,
            output,
        } => {
            let accounts = list(&target, namespace).await?;
            print!("{}", list_output(&accounts, output)?);
            Ok(())
        }
        KubeconfigCommand::Rotate {
            service_account,
            namespace,
            grace,
            expiration,
            output,
            cloud_config_path,
            server_url,
            target,
        } => {
            let mut body = serde_json::json!({
                "namespace": namespace,
                "serviceAccountName": service_account,
            });
            if let Some(g) = grace {
                body["gracePeriod"] = g.as_secs().into();
            }
            if let Some(e) = expiration {
                body["expirationSeconds"] = e.as_secs().into();
            }
            if let Some(p) = &cloud_config_path {
                body["cloudConfigPath"] = p.clone().into();
            }
            // Validated as the service validates it, before anything is sent or written.
            let req = crate::kubeconfig::request::from_json(body.to_string().as_bytes())?;
            let kubeconfig = rotate(&target, &req, body, server_url).await?;
            match output {
                RotateOutput::Kubeconfig => print!("{kubeconfig}"),
                RotateOutput::CloudInit => print!(
                    "{}",
                    render::cloud_init(&kubeconfig, req.cloud_config_path.as_deref())
                ),
            }
            Ok(())
        }
        KubeconfigCommand::Revoke {
            service_account,
            namespace,
            target,
            output,
        } => {
            let revoked = revoke(&target, &namespace, &service_account).await?;
            print!("{}", revoke_output(&revoked, output)?);
            Ok(())
        }
    }
}

async fn kube_store(kube: &KubeArgs) -> Result<(Arc<dyn ObjectStore>, String), KubeconfigCliError> {
    let config = kube.client_config().await?;
    let server = config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string();
    let client = kube::Client::try_from(config).map_err(KubeconfigCliError::Client)?;
    Ok((Arc::new(KubeStore::new(client)), server))
}

/// A CloudConfig on `store` for what renders no kubeconfig against the service's settings.
fn cloud_config(
    store: Arc<dyn ObjectStore>,
    server: String,
    token_timeout: Duration,
) -> CloudConfig {
    CloudConfig::new(
        store,
        Settings {
            harvester_namespace: "harvester-system".into(),
            server_url: Some(server),
            cluster_ca: None,
            token_timeout,
            default_grace: Settings::DEFAULT_GRACE,
            max_grace: Settings::MAX_GRACE,
        },
    )
}

/// Ensures `namespace/service_account` on the cluster `kube` reaches and prints what it needs.
pub async fn generate(
    service_account: &str,
    namespace: &str,
    kube: &KubeArgs,
    server_url: Option<String>,
    token_timeout: Duration,
) -> Result<(), KubeconfigCliError> {
    let req = AccountRequest::new(namespace, service_account)?;
    let (store, cluster_url) = kube_store(kube).await?;
    // As generate_addon.sh did: the kubeconfig points where your own kubeconfig points.
    let server = server_url.unwrap_or(cluster_url);
    let kubeconfig = cloud_config(store, server, token_timeout)
        .ensure(&req)
        .await?;
    print!(
        "########## cloud config ############\n{kubeconfig}\n{}",
        render::cloud_init(&kubeconfig, None)
    );
    Ok(())
}

/// Every account, page after page.
pub async fn list(
    target: &AccountsTarget,
    namespace: Option<String>,
) -> Result<Vec<Account>, KubeconfigCliError> {
    let mut query = ListQuery {
        namespace,
        limit: Some(MAX_LIMIT),
        continue_token: None,
    };
    let mut all = Vec::new();
    match Service::of(target)? {
        Some(service) => loop {
            let mut path = format!("/v1/harvester/kubeconfigs?limit={MAX_LIMIT}");
            if let Some(ns) = &query.namespace {
                path.push_str(&format!("&namespace={}", encode(ns)));
            }
            if let Some(c) = &query.continue_token {
                path.push_str(&format!("&continue={}", encode(c)));
            }
            let page: CollectionPage = service.json(Method::GET, &path).await?;
            all.extend(page.data);
            match page.continue_token {
                Some(c) if !c.is_empty() => query.continue_token = Some(c),
                _ => return Ok(all),
            }
        },
        None => {
            let (store, _) = kube_store(&target.kube).await?;
            let accounts = Accounts::new(store);
            loop {
                let AccountPage {
                    accounts: page,
                    continue_token,
                    ..
                } = accounts.list(&query).await?;
                all.extend(page);
                match continue_token {
                    Some(c) => query.continue_token = Some(c),
                    None => return Ok(all),
                }
            }
        }
    }
}

/// Rotates one account's token and returns the new kubeconfig.
pub async fn rotate(
    target: &AccountsTarget,
    req: &AccountRequest,
    body: serde_json::Value,
    server_url: Option<String>,
) -> Result<String, KubeconfigCliError> {
    match Service::of(target)? {
        // The raw kubeconfig (a JSON string); the CLI renders cloud-init itself.
        Some(service) => {
            service
                .json_with(
                    Method::POST,
                    "/v1/harvester/kubeconfig/rotate",
                    Some(body.to_string()),
                )
                .await
        }
        None => {
            let (store, cluster_url) = kube_store(&target.kube).await?;
            let server = server_url.unwrap_or(cluster_url);
            Ok(cloud_config(store, server, Duration::from_secs(30))
                .rotate(req)
                .await?)
        }
    }
}

/// What a revocation did, as DELETE /v1/harvester/kubeconfig answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Revoked {
    pub namespace: String,
    pub service_account_name: String,
    pub deleted: Vec<String>,
    pub kept: Vec<KeptObject>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptObject {
    pub object: String,
    pub reason: String,
}

/// Revokes one account.
pub async fn revoke(
    target: &AccountsTarget,
    namespace: &str,
    service_account: &str,
) -> Result<Revoked, KubeconfigCliError> {
    let req = AccountRequest::new(namespace, service_account)?;
    match Service::of(target)? {
        Some(service) => {
            let path = format!(
                "/v1/harvester/kubeconfig?namespace={}&serviceAccountName={}",
                encode(&req.namespace),
                encode(&req.service_account)
            );
            service.json(Method::DELETE, &path).await
        }
        None => {
            let (store, server) = kube_store(&target.kube).await?;
            let Revocation { deleted, kept } = cloud_config(store, server, Duration::ZERO)
                .revoke(&req.namespace, &req.service_account)
                .await?;
            Ok(Revoked {
                namespace: req.namespace,
                service_account_name: req.service_account,
                deleted,
                kept: kept
                    .into_iter()
                    .map(|k| KeptObject {
                        object: k.object,
                        reason: k.reason,
                    })
                    .collect(),
            })
        }
    }
}

fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// One page of the collection, as far as the CLI reads it.
#[derive(Deserialize)]
struct CollectionPage {
    data: Vec<Account>,
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

/// A running service: its base URL, the admin token, and the CAs its certificate may chain to.
struct Service {
    base: Uri,
    token: String,
    roots: Option<rustls::RootCertStore>,
}

impl Service {
    /// The service `--url` names, or `None` to act in the cluster.
    fn of(target: &AccountsTarget) -> Result<Option<Service>, KubeconfigCliError> {
        let Some(url) = &target.url else {
            return Ok(None);
        };
        let bad = |reason: &str| KubeconfigCliError::Url {
            url: url.clone(),
            reason: reason.into(),
        };
        let base: Uri = url.parse().map_err(|_| bad("not a URL"))?;
        match (base.scheme_str(), base.host()) {
            (Some("http" | "https"), Some(_)) => {}
            _ => return Err(bad("it must be an absolute http(s) URL")),
        }
        let token = match &target.token_file {
            Some(path) => read(path, "--token-file")?,
            None => return Err(bad("--token-file is needed with --url")),
        };
        let token = String::from_utf8_lossy(&token).trim().to_string();
        let roots = match base.scheme_str() {
            Some("https") => Some(roots(target.ca_file.as_deref())?),
            _ => None,
        };
        Ok(Some(Service { base, token, roots }))
    }

    fn url(&self, path_and_query: &str) -> String {
        format!(
            "{}{path_and_query}",
            self.base.to_string().trim_end_matches('/')
        )
    }

    /// Sends one request and decodes its JSON answer; an error answer becomes its message.
    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path_and_query: &str,
    ) -> Result<T, KubeconfigCliError> {
        self.json_with(method, path_and_query, None).await
    }

    /// [`Service::json`] with a JSON request body.
    async fn json_with<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<String>,
    ) -> Result<T, KubeconfigCliError> {
        let url = self.url(path_and_query);
        let (status, body) = self.send(method, path_and_query, body).await?;
        if !status.is_success() {
            let message = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
            return Err(KubeconfigCliError::Status {
                url,
                status,
                message,
            });
        }
        serde_json::from_slice(&body).map_err(|e| KubeconfigCliError::Answer {
            url,
            reason: e.to_string(),
        })
    }

    async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<String>,
    ) -> Result<(StatusCode, Bytes), KubeconfigCliError> {
        let url = self.url(path_and_query);
        let connect = |reason: String| KubeconfigCliError::Connect {
            url: url.clone(),
            reason,
        };
        let host = self.base.host().unwrap_or_default();
        let bare_host = host.trim_start_matches('[').trim_end_matches(']');
        let port = self
            .base
            .port_u16()
            .unwrap_or(if self.roots.is_some() { 443 } else { 80 });
        let path = format!("{}{path_and_query}", self.base.path().trim_end_matches('/'));
        let authority = self
            .base
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let mut req = Request::builder();
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .method(method)
            .uri(path)
            .header(header::HOST, authority)
            .header(header::AUTHORIZATION, format!("Bearer {}", self.token))
            .header(header::ACCEPT, "application/json")
            .header(header::CONNECTION, "close")
            .header(
                header::USER_AGENT,
                concat!("harvester-cloud/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| connect(e.to_string()))?;
        let tcp = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect((bare_host, port)))
            .await
            .map_err(|_| connect(format!("no connection within {REQUEST_TIMEOUT:?}")))?
            .map_err(|e| connect(e.to_string()))?;
        let answer = match &self.roots {
            Some(roots) => {
                let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .map_err(|e| connect(e.to_string()))?
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
                let name = rustls::pki_types::ServerName::try_from(bare_host.to_string())
                    .map_err(|e| connect(e.to_string()))?;
                let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
                    .connect(name, tcp)
                    .await
                    .map_err(|e| connect(format!("TLS: {e}")))?;
                tokio::time::timeout(REQUEST_TIMEOUT, exchange(TokioIo::new(tls), req)).await
            }
            None => tokio::time::timeout(REQUEST_TIMEOUT, exchange(TokioIo::new(tcp), req)).await,
        };
        answer
            .map_err(|_| connect(format!("no answer within {REQUEST_TIMEOUT:?}")))?
            .map_err(connect)
    }
}

/// How long one request to the service may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

async fn exchange<T>(io: T, req: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(io)
        .await
        .map_err(|e| e.to_string())?;
    // With `Connection: close` the connection ends after the answer; driven here, beside it.
    let conn = async {
        let _ = conn.await;
    };
    let request = async {
        let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    let (answer, ()) = tokio::join!(request, conn);
    answer
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, KubeconfigCliError> {
    std::fs::read(path).map_err(|source| KubeconfigCliError::ReadFile {
        what,
        path: path.display().to_string(),
        source,
    })
}

fn roots(ca_file: Option<&Path>) -> Result<rustls::RootCertStore, KubeconfigCliError> {
    let mut roots = rustls::RootCertStore::empty();
    let Some(path) = ca_file else {
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        return Ok(roots);
    };
    let pem = read(path, "--ca-file")?;
    let bad = |reason: String| KubeconfigCliError::ReadFile {
        what: "--ca-file",
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
    };
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| bad(e.to_string()))?;
        roots.add(cert).map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(roots)
}

/// The list as a table (one account a line) or as JSON (an array of accounts).
pub fn list_output(accounts: &[Account], kind: OutputKind) -> Result<String, KubeconfigCliError> {
    if kind == OutputKind::Json {
        return serde_json::to_string_pretty(accounts)
            .map(|s| s + "\n")
            .map_err(KubeconfigCliError::Output);
    }
    let mut rows = vec![[
        "NAMESPACE".to_string(),
        "SERVICE ACCOUNT".into(),
        "GUEST CLUSTER".into(),
        "CREATED".into(),
        "BINDINGS".into(),
        "TOKENS".into(),
        "EXPIRES".into(),
    ]];
    for a in accounts {
        let binding =
            |what: &str, b: &crate::kubeconfig::accounts::BindingState| match (b.exists, b.ours) {
                (true, true) => None,
                (false, _) => Some(format!("{what} missing")),
                (true, false) => Some(format!("{what} not ours")),
            };
        let problems: Vec<String> = [
            binding("rolebinding", &a.bindings.role_binding),
            binding("clusterrolebinding", &a.bindings.cluster_role_binding),
        ]
        .into_iter()
        .flatten()
        .collect();
        let current = a.tokens.iter().find(|t| t.current);
        rows.push([
            a.namespace.clone(),
            a.service_account.clone(),
            a.guest_cluster.clone().unwrap_or_else(|| "-".into()),
            a.created.clone().unwrap_or_else(|| "-".into()),
            if problems.is_empty() {
                "ok".into()
            } else {
                problems.join(", ")
            },
            a.tokens.len().to_string(),
            match current {
                Some(t) => t.expires_at.clone().unwrap_or_else(|| "never".into()),
                None => "no token".into(),
            },
        ]);
    }
    Ok(table(&rows))
}

/// What a revocation did, as lines or as DELETE's JSON.
pub fn revoke_output(revoked: &Revoked, kind: OutputKind) -> Result<String, KubeconfigCliError> {
    if kind == OutputKind::Json {
        return serde_json::to_string_pretty(revoked)
            .map(|s| s + "\n")
            .map_err(KubeconfigCliError::Output);
    }
    let mut out = String::new();
    if revoked.deleted.is_empty() {
        out.push_str(&format!(
            "nothing of account {}/{} to delete\n",
            revoked.namespace, revoked.service_account_name
        ));
    }
    for d in &revoked.deleted {
        out.push_str(&format!("deleted {d}\n"));
    }
    for k in &revoked.kept {
        out.push_str(&format!("kept {}: {}\n", k.object, k.reason));
    }
    Ok(out)
}

fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubeconfig::accounts::{BindingState, Bindings, TokenInfo};

    fn mk_account(ns: &str, sa: &str, rb_ours: bool) -> Account {
        let b = |ours| BindingState {
            name: format!("{ns}-{sa}"),
            exists: true,
            ours,
            reason: None,
        };
        Account {
            namespace: ns.into(),
            service_account: sa.into(),
            created: Some("2026-12-01T10:00:00Z".into()),
            bindings: Bindings {
                role_binding: b(rb_ours),
                cluster_role_binding: b(true),
            },
            tokens: vec![TokenInfo {
                secret: format!("{sa}-token"),
                created: None,
                current: true,
                expires_at: None,
                rotated_at: None,
                kind: "service-account-token".into(),
            }],
            guest_cluster: Some(sa.into()),
        }
    }

    #[test]
    fn tables() {
        let out = list_output(
            &[
                mk_account("gc-test", "gc1", true),
                mk_account("b", "x", false),
            ],
            OutputKind::Table,
        )
        .unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("NAMESPACE   SERVICE ACCOUNT   GUEST CLUSTER"),
            "{out}"
        );
        assert!(
            lines[1].contains("gc1") && lines[1].contains(" ok ") && lines[1].ends_with("never"),
            "{out}"
        );
        assert!(lines[2].contains("rolebinding not ours"), "{out}");
    }
}
