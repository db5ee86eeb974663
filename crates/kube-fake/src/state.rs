//! Shared server state: the single lock around the store, the served types and the token table,
//! plus the request log and the knobs tests turn at run time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::auth::{Identity, TokenKind};
use crate::registry::{self, ResourceType};
use crate::store::{Key, Store};
use crate::webhook_client::ServiceMap;

/// When the token controller fills `kubernetes.io/service-account-token` Secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenMode {
    /// After this delay from the Secret's creation.
    After(Duration),
    /// Never (to test callers' timeouts).
    Never,
}

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Raw query string, empty when none.
    pub query: String,
    /// Authenticated user, empty when authentication failed.
    pub user: String,
}

/// Everything behind the one lock.
#[derive(Debug)]
pub struct Inner {
    /// Objects and history.
    pub store: Store,
    /// Built-in types followed by CRD-registered types.
    pub types: Vec<ResourceType>,
    /// Known tokens.
    pub tokens: HashMap<String, TokenKind>,
    /// Token Secrets waiting for the token controller, with when they were created.
    pub pending_tokens: HashMap<Key, tokio::time::Instant>,
    /// UIDs of deleted objects whose dependents the garbage collector must look at:
    /// `(uid, owner is namespaced, owner namespace)`.
    pub gc_queue: Vec<(String, bool, String)>,
    /// Next ClusterIP host number in 10.43.0.0/16.
    pub next_cluster_ip: u32,
    /// Next NodePort.
    pub next_node_port: u32,
    /// Token controller mode.
    pub token_mode: TokenMode,
    /// Set when an object started terminating, so the controllers scan for work.
    pub scan_deletions: bool,
    /// Where webhook service references connect, by `(namespace, name)`.
    pub webhook_services: ServiceMap,
}

impl Inner {
    /// The type serving `group/version` `plural`.
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types.iter().find(|t| {
            t.group == group && t.plural == plural && t.versions.iter().any(|v| v == version)
        })
    }

    /// The type of an `apiVersion` + `kind`.
    pub fn lookup_kind(&self, api_version: &str, kind: &str) -> Option<&ResourceType> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.types
            .iter()
            .find(|t| t.group == group && t.kind == kind && t.versions.iter().any(|v| v == version))
    }

    /// Replaces the types registered by one CRD (none when `rt` is `None`).
    pub fn register_crd(&mut self, crd_name: &str, rt: Option<ResourceType>) {
        self.types.retain(|t| t.crd.as_deref() != Some(crd_name));
        if let Some(rt) = rt {
            self.types.push(rt);
        }
    }
}

/// Static facts about the running server.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// `https://127.0.0.1:<port>`.
    pub base_url: String,
    /// PEM of the CA that signed the serving certificate.
    pub ca_pem: String,
    /// The admin bearer token (`system:masters`).
    pub admin_token: String,
}

/// State shared by the HTTP handlers and the controllers.
#[derive(Debug)]
pub struct Shared {
    inner: Mutex<Inner>,
    /// Request log.
    pub requests: Mutex<Vec<RequestRecord>>,
    /// The requests answered 403 Forbidden.
    pub forbidden: Mutex<Vec<RequestRecord>>,
    /// Facts for kubeconfigs and the `ca.crt` of tokens.
    pub info: ServerInfo,
    /// Wakes the controller loop after writes.
    pub wake: Notify,
    /// Flips to true on shutdown; watches end.
    pub shutdown: watch::Receiver<bool>,
}

impl Shared {
    /// A fresh state with the built-in types and the admin token.
    pub fn new(
        info: ServerInfo,
        token_mode: TokenMode,
        history_limit: usize,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<Self> {
        let mut tokens = HashMap::new();
        tokens.insert(
            info.admin_token.clone(),
            TokenKind::Static(Identity::user("kube-fake-admin", &["system:masters"])),
        );
        let inner = Inner {
            store: Store::new(history_limit),
            types: registry::builtins(),
            tokens,
            pending_tokens: HashMap::new(),
            gc_queue: Vec::new(),
            next_cluster_ip: 10,
            next_node_port: 30000,
            token_mode,
            scan_deletions: false,
            webhook_services: ServiceMap::new(),
        };
        Arc::new(Self {
            inner: Mutex::new(inner),
            requests: Mutex::new(Vec::new()),
            forbidden: Mutex::new(Vec::new()),
            info,
            wake: Notify::new(),
            shutdown,
        })
    }

    /// The one lock. Never held across an await.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends to the request log.
    pub fn record(&self, rec: RequestRecord) {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(rec);
    }
}
