//! Starting and stopping the fake: the builder, the TLS accept loop serving the axum router over
//! HTTP/1.1 and HTTP/2, the seeded cluster state, and the handle tests use (URL, CA, tokens,
//! kubeconfigs, request log, knobs, shutdown).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::api;
use crate::auth::{self, Identity, TokenKind};
use crate::controllers;
use crate::ops;
use crate::rbac;
use crate::state::{RequestRecord, ServerInfo, Shared, TokenMode};
use crate::tls::{self, TlsError};
use crate::webhook_client::ServiceMap;

/// Why the fake could not start.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    /// The listen address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The PKI could not be generated.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Writing the kubeconfig failed.
    #[error("writing kubeconfig {path}: {source}")]
    WriteKubeconfig {
        /// The target file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// Entry point of the library API.
#[derive(Debug)]
pub struct FakeApiServer;

impl FakeApiServer {
    /// A builder with defaults: `127.0.0.1:0`, tokens filled after 50 ms, 20,000 retained changes.
    pub fn builder() -> FakeApiServerBuilder {
        FakeApiServerBuilder {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            token_mode: TokenMode::After(Duration::from_millis(50)),
            history_limit: 20_000,
            admin_token: None,
            webhook_services: ServiceMap::new(),
        }
    }
}

/// Configures a fake before it starts.
#[derive(Debug, Clone)]
pub struct FakeApiServerBuilder {
    listen: SocketAddr,
    token_mode: TokenMode,
    history_limit: usize,
    admin_token: Option<String>,
    webhook_services: ServiceMap,
}

impl FakeApiServerBuilder {
    /// Listen address (port 0 picks a free port).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Delay before the token controller fills a service-account token Secret.
    pub fn token_delay(mut self, delay: Duration) -> Self {
        self.token_mode = TokenMode::After(delay);
        self
    }

    /// The token controller never fills token Secrets (to test timeouts).
    pub fn never_fill_tokens(mut self) -> Self {
        self.token_mode = TokenMode::Never;
        self
    }

    /// How many changes are retained for watch replay before older versions answer `Expired`.
    pub fn history_limit(mut self, limit: usize) -> Self {
        self.history_limit = limit.max(1);
        self
    }

    /// A fixed admin token instead of a random one.
    pub fn admin_token(mut self, token: impl Into<String>) -> Self {
        self.admin_token = Some(token.into());
        self
    }

    /// Where admission webhooks with `clientConfig.service` {namespace, name} connect (the real
    /// server resolves the Service; the fake has no Services with endpoints). TLS still verifies the
    /// certificate for `<name>.<namespace>.svc`; the service port only appears in the URL.
    pub fn webhook_service(
        mut self,
        namespace: impl Into<String>,
        name: impl Into<String>,
        addr: SocketAddr,
    ) -> Self {
        self.webhook_services
            .insert((namespace.into(), name.into()), addr);
        self
    }

    /// Binds, seeds the cluster, and serves in the background.
    pub async fn start(self) -> Result<FakeHandle, FakeError> {
        let pki = tls::generate()?;
        let listener = TcpListener::bind(self.listen)
            .await
            .map_err(|source| FakeError::Bind {
                addr: self.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| FakeError::Bind {
            addr: self.listen,
            source,
        })?;
        let info = ServerInfo {
            base_url: format!("https://{addr}"),
            ca_pem: pki.ca_pem.clone(),
            admin_token: self.admin_token.unwrap_or_else(auth::random_token),
        };
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let shared = Shared::new(
            info,
            self.token_mode,
            self.history_limit,
            shutdown_rx.clone(),
        );
        shared.lock().webhook_services = self.webhook_services;
        seed(&shared);
        let app = Router::new()
            .fallback(api::handle)
            .with_state(shared.clone());
        let acceptor = TlsAcceptor::from(pki.server_config);
        let server = tokio::spawn(
            accept_loop(listener, acceptor, app, shutdown_rx)
                .instrument(info_span!("fake-apiserver", %addr)),
        );
        let controllers = controllers::spawn(shared.clone());
        info!(%addr, "fake API server listening");
        Ok(FakeHandle {
            shared,
            shutdown_tx,
            tasks: vec![server, controllers],
            addr,
        })
    }
}

fn seed(shared: &Shared) {
    let mut inner = shared.lock();
    let ctx = ops::system_ctx(&shared.info.ca_pem);
    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        if let Some(rt) = ops::type_for_storage(&inner, "", "namespaces") {
            let _ = ops::create(
                &mut inner,
                &rt,
                "v1",
                None,
                json!({"metadata": {"name": name}}),
                &ctx,
            );
        }
    }
    for (plural, obj) in rbac::bootstrap_policy() {
        if let Some(rt) = ops::type_for_storage(&inner, rbac::RBAC, plural) {
            let _ = ops::create(&mut inner, &rt, "v1", None, obj, &ctx);
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let app = app.clone();
                let mut stop = shutdown.clone();
                conns.spawn(
                    async move {
                        let tls = match acceptor.accept(tcp).await {
                            Ok(s) => s,
                            Err(e) => {
                                debug!(error = %e, "TLS handshake failed");
                                return;
                            }
                        };
                        let builder = auto::Builder::new(TokioExecutor::new());
                        let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), TowerToHyperService::new(app));
                        tokio::select! {
                            r = conn => if let Err(e) = r { debug!(error = %e, "connection ended with error") },
                            _ = stop.changed() => {}
                        }
                    }
                    .instrument(info_span!("connection", %peer)),
                );
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
}

/// A running fake. Dropping it stops the server too; [`FakeHandle::shutdown`] also waits for it.
#[derive(Debug)]
pub struct FakeHandle {
    shared: Arc<Shared>,
    shutdown_tx: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    addr: SocketAddr,
}

impl FakeHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>`.
    pub fn base_url(&self) -> &str {
        &self.shared.info.base_url
    }

    /// PEM of the CA that signed the serving certificate (also the `ca.crt` of issued tokens).
    pub fn ca_pem(&self) -> &str {
        &self.shared.info.ca_pem
    }

    /// The admin bearer token (user `kube-fake-admin`, group `system:masters`).
    pub fn admin_token(&self) -> &str {
        &self.shared.info.admin_token
    }

    /// A kubeconfig for the admin.
    pub fn kubeconfig_yaml(&self) -> String {
        self.kubeconfig_for_token(self.admin_token(), "default")
    }

    /// A kubeconfig for any bearer token, with a default namespace.
    pub fn kubeconfig_for_token(&self, token: &str, namespace: &str) -> String {
        kubeconfig(self.base_url(), self.ca_pem(), token, namespace)
    }

    /// Adds a user with groups and returns its new random token.
    pub fn add_user(&self, name: &str, groups: &[&str]) -> String {
        let token = auth::random_token();
        self.add_token(&token, name, groups);
        token
    }

    /// Registers a known token for a user with groups.
    pub fn add_token(&self, token: &str, name: &str, groups: &[&str]) {
        self.shared.lock().tokens.insert(
            token.to_string(),
            TokenKind::Static(Identity::user(name, groups)),
        );
    }

    /// Every request served so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The requests answered 403 Forbidden so far, in order.
    pub fn forbidden(&self) -> Vec<RequestRecord> {
        self.shared
            .forbidden
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many requests were served so far.
    pub fn request_count(&self) -> usize {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Clears the request log.
    pub fn reset_requests(&self) {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Adds or replaces a webhook service address after start (see
    /// [`FakeApiServerBuilder::webhook_service`]).
    pub fn set_webhook_service(&self, namespace: &str, name: &str, addr: SocketAddr) {
        self.shared
            .lock()
            .webhook_services
            .insert((namespace.to_string(), name.to_string()), addr);
    }

    /// Changes the token controller delay from now on.
    pub fn set_token_delay(&self, delay: Duration) {
        self.shared.lock().token_mode = TokenMode::After(delay);
        self.shared.wake.notify_one();
    }

    /// Stops the token controller from filling tokens (Secrets created meanwhile stay empty).
    pub fn never_fill_tokens(&self) {
        self.shared.lock().token_mode = TokenMode::Never;
    }

    /// Drops the retained change history: watches from older resourceVersions get `Expired`.
    pub fn compact_history(&self) {
        self.shared.lock().store.compact();
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().store.current_rv()
    }

    /// A stored object, bypassing the API (storage shape: core events for both event APIs).
    pub fn object(&self, group: &str, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .store
            .get(&(group.into(), plural.into(), namespace.into(), name.into()))
            .cloned()
    }

    /// Stops serving, ends watches, and waits for the server tasks.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown_tx.send(true);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for FakeHandle {
    fn drop(&mut self) {
        let _ = self.shutdown_tx.send(true);
    }
}

/// A kubeconfig YAML for a server, CA and bearer token.
pub fn kubeconfig(server: &str, ca_pem: &str, token: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-fake\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: kube-fake-user\n  user:\n    token: {token}\ncontexts:\n- name: kube-fake\n  context:\n    cluster: kube-fake\n    user: kube-fake-user\n    namespace: {namespace}\ncurrent-context: kube-fake\npreferences: {{}}\n",
        ca = STANDARD.encode(ca_pem)
    )
}
