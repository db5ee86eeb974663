//! The HTTP API: routing, authentication of callers, and the handlers that call the domain (the
//! objects kept in the store through one REST layer, [`rest`]).
//!
//! Every route is declared once in [`build`], which also records the path and methods so the
//! OpenAPI contract test can compare the router with `openapi/openapi.yaml`.

pub mod drain;
pub mod error;
pub mod kubeconfigs;
pub mod lb;
pub mod limits;
pub mod metrics;
pub mod metrics_listener;
pub mod openapi;
pub mod path;
pub mod rest;
pub mod server;
pub mod tls;
pub mod tunnel;
pub mod ui;

use std::sync::Arc;

use axum::{
    Json, Router,
    body::Bytes,
    extract::{
        DefaultBodyLimit, FromRequestParts, OriginalUri, RawQuery, State, rejection::BytesRejection,
    },
    http::{HeaderValue, Method, StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
    routing::{MethodRouter, get, post},
};
use tower_http::{
    request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer},
    trace::TraceLayer,
};
use tracing::{Level, debug};

pub use error::ApiError;
use metrics::Operation::{Create, Get};

use crate::{
    auth::{self, Authenticator, Principal},
    issuer::Issuer,
    kubeconfig::{self, AccountRequest, CloudConfig, OutputFormat, Rendered},
    lb::admission::AdmittedStore,
    store::ObjectStore,
};

/// Largest request body of the cloud-config routes (Harvester's clients send a few hundred bytes).
pub const BODY_LIMIT: usize = limits::KUBECONFIG_BODY;
pub const KUBECONFIG_PATH: &str = "/v1/harvester/kubeconfig";
/// The same path with a trailing slash, which Harvester's router (gorilla/mux with StrictSlash)
/// answers with a 301 to the path without it.
pub const KUBECONFIG_SLASH_PATH: &str = "/v1/harvester/kubeconfig/";
/// A new token for an existing account (ours; Harvester has no such route).
pub const KUBECONFIG_ROTATE_PATH: &str = "/v1/harvester/kubeconfig/rotate";

/// What every handler reads, behind one reference count: axum clones the router's state with the
/// handler for each request (and drops it after), so a state of a dozen `Arc`s cost a dozen atomic
/// increments and decrements per request, a measured 5% of a GET's server CPU (`perf` of the
/// server under `http_load`: `HandlerService::clone` 2.9%, `drop_in_place<AppState>` 2.4%).
#[derive(Clone)]
pub struct AppState(Arc<StateParts>);

impl AppState {
    pub fn new(parts: StateParts) -> Self {
        AppState(Arc::new(parts))
    }
}

impl std::ops::Deref for AppState {
    type Target = StateParts;

    fn deref(&self) -> &StateParts {
        &self.0
    }
}

/// The parts of an [`AppState`].
pub struct StateParts {
    pub cloud_config: Arc<CloudConfig>,
    pub authenticator: Arc<dyn Authenticator>,
    pub store: Arc<dyn ObjectStore>,
    /// The service-account token issuer, when this backend mints tokens itself.
    pub issuer: Option<Arc<Issuer>>,
    /// The store behind admission, where the API writes IPPools and LoadBalancers (its checks
    /// also answer the admission webhooks).
    pub admitted: Arc<AdmittedStore>,
    /// Guest clusters, when this backend keeps them (embedded).
    pub guests: Option<rest::kinds::GuestClusters>,
    /// Who may send admission reviews.
    pub webhooks: WebhookAccess,
    /// The store of VMIs, and of VM load balancers' Services and EndpointSlices, when this backend
    /// keeps them (embedded).
    pub vms: Option<Arc<dyn ObjectStore>>,
}

/// Who the admission webhooks answer. Their answers tell which IPPool ranges overlap, so they
/// are an oracle to whoever may ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebhookAccess {
    /// Not served: no API server calls them (the embedded store admits writes itself).
    Off,
    /// Anyone who reaches the port, as Harvester's own (the API server authenticates by TLS only).
    Open,
    /// Only a client presenting a certificate signed by `--webhook-client-ca` (the API server,
    /// configured to present one).
    ClientCertificate,
}

/// Marks a request whose connection presented a client certificate the listener verified (set
/// by the server loop, never by a client).
#[derive(Clone, Copy, Debug)]
pub struct VerifiedClient;

/// A route as declared: its path and the methods it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    pub path: &'static str,
    pub methods: Vec<&'static str>,
}

struct Routes {
    router: Router<AppState>,
    table: Vec<RouteSpec>,
}

impl Routes {
    fn add(
        mut self,
        path: &'static str,
        methods: &[&'static str],
        route: MethodRouter<AppState>,
    ) -> Self {
        let allowed: Vec<&'static str> = methods.to_vec();
        let fallback_allowed = allowed.clone();
        let route = route.fallback(move |method: Method, OriginalUri(uri): OriginalUri| {
            let allowed = fallback_allowed.clone();
            async move {
                ApiError::MethodNotAllowed {
                    method,
                    path: uri.path().to_string(),
                    allowed,
                }
            }
        });
        self.router = self.router.route(path, route);
        self.table.push(RouteSpec {
            path,
            methods: allowed,
        });
        self
    }
}

/// The router and the table of what it serves.
pub fn build(state: AppState) -> (Router, Vec<RouteSpec>) {
    let routes = Routes {
        router: Router::new(),
        table: Vec::new(),
    }
    .add(
        KUBECONFIG_PATH,
        &["GET", "POST", "DELETE"],
        get(get_kubeconfig)
            .post(post_kubeconfig)
            .delete(delete_kubeconfig),
    )
    .add(
        KUBECONFIG_SLASH_PATH,
        &["GET", "POST", "DELETE"],
        get(kubeconfig_slash)
            .post(kubeconfig_slash)
            .delete(kubeconfig_slash),
    )
    .add(
        kubeconfigs::KUBECONFIGS_PATH,
        &["GET"],
        get(kubeconfigs::list),
    )
    .add(KUBECONFIG_ROTATE_PATH, &["POST"], post(rotate_kubeconfig))
    .add("/healthz", &["GET"], get(healthz))
    .add("/readyz", &["GET"], get(readyz))
    .add(
        "/.well-known/openid-configuration",
        &["GET"],
        get(openid_configuration),
    )
    .add("/openid/v1/jwks", &["GET"], get(jwks))
    .add(
        lb::VALIDATION_PATH,
        &["POST"],
        post(lb::validation).layer(DefaultBodyLimit::max(limits::REVIEW_BODY)),
    )
    .add(
        lb::MUTATION_PATH,
        &["POST"],
        post(lb::mutation).layer(DefaultBodyLimit::max(limits::REVIEW_BODY)),
    )
    .add(openapi::OPENAPI_PATH, &["GET"], get(openapi::openapi_json));
    let routes = ui::routes(rest::kinds::routes(routes));

    let router = routes
        .router
        .fallback(|OriginalUri(uri): OriginalUri| async move {
            ApiError::NotFound {
                path: uri.path().to_string(),
            }
        })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(limits::bounded))
        .layer(axum::middleware::from_fn(metrics::track))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &axum::http::Request<_>| {
                    let id = req
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default();
                    // The path only: a query string is the caller's business, not the log's.
                    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
                })
                // At debug only: the lifecycle test reads it to tell requests the server read.
                .on_request(tower_http::trace::DefaultOnRequest::new().level(Level::DEBUG))
                .on_response(tower_http::trace::DefaultOnResponse::new().level(Level::DEBUG))
                .on_failure(()),
        )
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(axum::middleware::from_fn(limits::sanitize_request_id))
        .with_state(state);
    (router, routes.table)
}

pub fn router(state: AppState) -> Router {
    build(state).0
}

/// An authenticated caller, whose actions are authorized one by one ([`Caller::authorize`]).
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        // Through the Rancher tunnel, and only there, Rancher says who the caller is; a caller it
        // forwards without a name is refused with a 403, never a 401.
        let via_tunnel = parts.extensions.get::<tunnel::ViaTunnel>().is_some();
        if via_tunnel {
            if let Some(principal) = tunnel::impersonated(&parts.headers) {
                debug!(principal = %principal.name, "identified by Rancher");
                return Ok(Caller(principal));
            }
            if !parts.headers.contains_key(header::AUTHORIZATION) {
                return Ok(Caller(tunnel::anonymous()));
            }
        }
        let principal = async {
            let header = parts
                .headers
                .get(header::AUTHORIZATION)
                .ok_or(auth::AuthError::Missing)?;
            let credential = header
                .to_str()
                .ok()
                .and_then(auth::token::from_authorization)
                .ok_or(auth::AuthError::Malformed)?;
            state.authenticator.authenticate(&credential).await
        }
        .await
        .map_err(|e| if via_tunnel { e.on_tunnel() } else { e })
        .inspect_err(|e| crate::metrics::auth_failed(e.reason()))?;
        debug!(principal = %principal.name, "authenticated");
        Ok(Caller(principal))
    }
}

impl Caller {
    pub async fn authorize(
        &self,
        state: &AppState,
        action: auth::Action<'_>,
    ) -> Result<(), ApiError> {
        self.authorize_with(state.authenticator.as_ref(), action)
            .await
    }

    pub async fn authorize_with(
        &self,
        authenticator: &dyn Authenticator,
        action: auth::Action<'_>,
    ) -> Result<(), ApiError> {
        authenticator
            .authorize(&self.0, &action)
            .await
            .inspect_err(|e| crate::metrics::auth_failed(e.reason()))?;
        Ok(())
    }
}

/// An authenticated administrator (an admin token, or a Rancher global admin); other users get 403.
pub struct Admin(pub Principal);

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        match &caller.0.identity {
            auth::Identity::Admin => Ok(Admin(caller.0)),
            auth::Identity::User { username, .. } => {
                // A Kubernetes user may use the IPPool and LoadBalancer routes as far as the
                // cluster's RBAC lets them use those kinds.
                if let Some((verb, resource, namespace)) = object_permission(parts) {
                    let action = auth::Action::Object {
                        verb,
                        resource,
                        namespace: namespace.as_deref(),
                    };
                    caller.authorize(state, action).await?;
                    return Ok(Admin(caller.0));
                }
                let refused = auth::AuthError::AdminOnly {
                    user: username.clone(),
                };
                crate::metrics::auth_failed(refused.reason());
                Err(refused.into())
            }
        }
    }
}

/// A route of IPPools, LoadBalancers, guest Services or VMIs ([`rest`]): bodies up to
/// [`limits::OBJECT_BODY`].
fn objects(route: MethodRouter<AppState>) -> MethodRouter<AppState> {
    route.layer(DefaultBodyLimit::max(limits::OBJECT_BODY))
}

/// The permission a request of an IPPool or LoadBalancer route needs: the verb from the method and
/// whether it names one object, the namespace from the path (a create names none: it is checked
/// cluster-wide). `None` for any other route.
fn object_permission(parts: &Parts) -> Option<(&'static str, &'static str, Option<String>)> {
    let rest = parts
        .uri
        .path()
        .strip_prefix("/v1/harvester/loadbalancer.harvesterhci.io.")?;
    let mut segments = rest.split('/').filter(|s| !s.is_empty());
    let (resource, namespaced) = match segments.next()? {
        "ippools" => ("ippools", false),
        "loadbalancers" => ("loadbalancers", true),
        _ => return None,
    };
    let after: Vec<&str> = segments.collect();
    let (namespace, named) = match (namespaced, after.as_slice()) {
        (false, []) => (None, false),
        // Who holds a pool's addresses is read as the pool is: `get` on it (and the handler checks
        // `list` on LoadBalancers).
        (false, [_]) | (false, [_, "addresses"]) => (None, true),
        (true, []) => (None, false),
        (true, [ns]) => (Some(ns.to_string()), false),
        // A LoadBalancer's Events are read as the LoadBalancer is: `get` on it.
        (true, [ns, _]) | (true, [ns, _, "events"]) => (Some(ns.to_string()), true),
        _ => return None,
    };
    let verb = match (&parts.method, named) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::PUT, true) => "update",
        (&Method::DELETE, true) => "delete",
        _ => return None,
    };
    Some((verb, resource, namespace))
}

fn body_bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge { limit }
        } else {
            ApiError::BadBody {
                reason: rejection.body_text(),
            }
        }
    })
}

fn cloud_config_response(req: &AccountRequest, kubeconfig: &Rendered) -> Response {
    let content_type = match req.output {
        OutputFormat::CloudInit => "application/x-yaml; charset=utf-8",
        OutputFormat::Kubeconfig => "application/json",
    };
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        kubeconfig.body(req.output, req.cloud_config_path.as_deref()),
    )
        .into_response()
}

async fn post_kubeconfig(
    State(state): State<AppState>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    issue_from_body(
        state,
        caller,
        body,
        Create,
        |namespace| auth::Action::CreateAccount { namespace },
        |cloud_config, req| async move { cloud_config.ensure(&req).await },
    )
    .await
}

async fn rotate_kubeconfig(
    State(state): State<AppState>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    issue_from_body(
        state,
        caller,
        body,
        metrics::Operation::Rotate,
        |namespace| auth::Action::RotateAccount { namespace },
        |cloud_config, req| async move { cloud_config.rotate(&req).await },
    )
    .await
}

/// POST and rotate: the JSON body read, the caller authorized for `action`, the cloud-config
/// issued by `issue` (to completion, even if the client goes), counted, and answered.
async fn issue_from_body<Fut>(
    state: AppState,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
    operation: metrics::Operation,
    action: for<'a> fn(&'a str) -> auth::Action<'a>,
    issue: fn(Arc<CloudConfig>, AccountRequest) -> Fut,
) -> Result<Response, ApiError>
where
    Fut:
        std::future::Future<Output = Result<String, kubeconfig::CloudConfigError>> + Send + 'static,
{
    let issued = async {
        let req = kubeconfig::request::from_json(&body_bytes(body, BODY_LIMIT)?)?;
        caller.authorize(&state, action(&req.namespace)).await?;
        let kubeconfig = to_completion(issue(state.cloud_config.clone(), req.clone())).await?;
        Ok::<_, ApiError>((req, kubeconfig))
    };
    let (req, kubeconfig) = metrics::cloud_config(operation, |(r, _)| r.output, issued.await)?;
    Ok(cloud_config_response(&req, &Rendered::new(kubeconfig)))
}

async fn get_kubeconfig(
    State(state): State<AppState>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let issued = async {
        let req = kubeconfig::request::from_query(query.as_deref())?;
        caller
            .authorize_with(
                state.authenticator.as_ref(),
                auth::Action::ReadAccount {
                    namespace: &req.namespace,
                },
            )
            .await?;
        let kubeconfig = state.cloud_config.fetch(&req).await?;
        Ok::<_, ApiError>((req, kubeconfig))
    };
    let (req, kubeconfig) = metrics::cloud_config(Get, |(r, _)| r.output, issued.await)?;
    Ok(cloud_config_response(&req, &kubeconfig))
}

/// The body of a successful DELETE.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RevocationBody {
    namespace: String,
    service_account_name: String,
    #[serde(flatten)]
    revocation: kubeconfig::Revocation,
}

async fn delete_kubeconfig(
    State(state): State<AppState>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> Result<Json<RevocationBody>, ApiError> {
    let req = kubeconfig::request::from_query(query.as_deref())?;
    caller
        .authorize(
            &state,
            auth::Action::DeleteAccount {
                namespace: &req.namespace,
            },
        )
        .await?;
    let revocation = {
        let (cloud_config, req) = (state.cloud_config.clone(), req.clone());
        to_completion(async move {
            cloud_config
                .revoke(&req.namespace, &req.service_account)
                .await
        })
        .await?
    };
    Ok(Json(RevocationBody {
        namespace: req.namespace,
        service_account_name: req.service_account,
        revocation,
    }))
}

/// Runs a write to its end even when its caller goes away: hyper drops a request's handler when
/// the connection closes, and a POST or DELETE cut off there would leave the objects it had made
/// (or half of those it was removing) instead of finishing or rolling back.
async fn to_completion<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    use tracing::Instrument;
    match tokio::spawn(work.instrument(tracing::Span::current())).await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled: only when the runtime itself shuts down, and with it this request.
        Err(_) => std::future::pending().await,
    }
}

/// A 301 to the kubeconfig path, the query kept, as Harvester's StrictSlash does (it answers
/// before authenticating, so neither do we: the redirect tells nothing). The location is relative
/// so that it resolves right behind a proxy that mounts us under a prefix (Rancher's).
async fn kubeconfig_slash(OriginalUri(uri): OriginalUri) -> Response {
    let location = match uri.query() {
        Some(query) => format!("../kubeconfig?{query}"),
        None => "../kubeconfig".to_string(),
    };
    match HeaderValue::from_str(&location) {
        Ok(value) => (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, value)]).into_response(),
        // A query the URI parser accepted is a valid header value; should it not be, the path
        // without it still is.
        Err(_) => (
            StatusCode::MOVED_PERMANENTLY,
            [(header::LOCATION, HeaderValue::from_static("../kubeconfig"))],
        )
            .into_response(),
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    state
        .store
        .ping()
        .await
        .map_err(|e| ApiError::Unavailable {
            what: "store",
            reason: e.to_string(),
        })?;
    Ok("ok")
}

fn issuer(state: &AppState) -> Result<&Issuer, ApiError> {
    state.issuer.as_deref().ok_or(ApiError::NoIssuer)
}

async fn openid_configuration(
    State(state): State<AppState>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(issuer(&state)?.openid_configuration()))
}

async fn jwks(State(state): State<AppState>) -> Result<Response, ApiError> {
    let body = Json(issuer(&state)?.jwks());
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/jwk-set+json"),
        )],
        body,
    )
        .into_response())
}
