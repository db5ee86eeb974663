//! The HTTP API: routing, authentication of callers, and the handlers that call the domain.
//!
//! Every route is declared once in [`build`], which also records the path and methods so the
//! OpenAPI contract test can compare the router with `openapi/openapi.yaml`.

pub mod drain;
pub mod error;
pub mod guest;
pub mod lb;
pub mod metrics;
pub mod openapi;
pub mod tls;
pub mod tunnel;
pub mod vm;

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
    kubeconfig::{self, AccountRequest, CloudConfig, OutputFormat, render},
    store::ObjectStore,
};

/// Largest request body accepted (Harvester's clients send a few hundred bytes).
pub const BODY_LIMIT: usize = 64 * 1024;
pub const KUBECONFIG_PATH: &str = "/v1/harvester/kubeconfig";

#[derive(Clone)]
pub struct AppState {
    pub cloud_config: Arc<CloudConfig>,
    pub authenticator: Arc<dyn Authenticator>,
    pub store: Arc<dyn ObjectStore>,
    /// The service-account token issuer, when this backend mints tokens itself.
    pub issuer: Option<Arc<Issuer>>,
    /// IPPools and LoadBalancers through admission (also serves the admission webhooks).
    pub objects: crate::lb::objects::Objects,
    /// Guest clusters' Services, when this backend keeps them (embedded).
    pub guests: Option<crate::guest::api::GuestClusters>,
    /// VMIs, and VM load balancers' Services and EndpointSlices, when this backend keeps them
    /// (embedded).
    pub vms: Option<crate::lb::vm::api::VmObjects>,
}

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
    .add("/healthz", &["GET"], get(healthz))
    .add("/readyz", &["GET"], get(readyz))
    .add(
        "/.well-known/openid-configuration",
        &["GET"],
        get(openid_configuration),
    )
    .add("/openid/v1/jwks", &["GET"], get(jwks))
    .add(
        lb::POOLS_PATH,
        &["GET", "POST"],
        get(lb::list_pools).post(lb::create_pool),
    )
    .add(
        lb::POOL_PATH,
        &["GET", "PUT", "DELETE"],
        get(lb::get_pool)
            .put(lb::update_pool)
            .delete(lb::delete_pool),
    )
    .add(
        lb::LBS_PATH,
        &["GET", "POST"],
        get(lb::list_lbs).post(lb::create_lb),
    )
    .add(lb::LBS_NAMESPACE_PATH, &["GET"], get(lb::list_lbs_in))
    .add(
        lb::LB_PATH,
        &["GET", "PUT", "DELETE"],
        get(lb::get_lb).put(lb::update_lb).delete(lb::delete_lb),
    )
    .add(guest::SERVICES_PATH, &["GET"], get(guest::list_services))
    .add(guest::EVENTS_PATH, &["GET"], get(guest::list_events))
    .add(
        guest::SERVICE_PATH,
        &["GET", "PUT", "DELETE"],
        get(guest::get_service)
            .put(guest::put_service)
            .delete(guest::delete_service),
    )
    .add(
        guest::CLUSTER_PATH,
        &["DELETE"],
        axum::routing::delete(guest::delete_cluster),
    )
    .add(
        vm::VMIS_PATH,
        &["GET", "POST"],
        get(vm::list_vmis).post(vm::create_vmi),
    )
    .add(vm::VMIS_NAMESPACE_PATH, &["GET"], get(vm::list_vmis_in))
    .add(
        vm::VMI_PATH,
        &["GET", "PUT", "DELETE"],
        get(vm::get_vmi).put(vm::update_vmi).delete(vm::delete_vmi),
    )
    .add(vm::SERVICES_PATH, &["GET"], get(vm::list_services))
    .add(
        vm::SERVICES_NAMESPACE_PATH,
        &["GET"],
        get(vm::list_services_in),
    )
    .add(vm::SERVICE_PATH, &["GET"], get(vm::get_service))
    .add(vm::SLICES_PATH, &["GET"], get(vm::list_slices))
    .add(vm::SLICES_NAMESPACE_PATH, &["GET"], get(vm::list_slices_in))
    .add(vm::SLICE_PATH, &["GET"], get(vm::get_slice))
    .add(lb::VALIDATION_PATH, &["POST"], post(lb::validation))
    .add(lb::MUTATION_PATH, &["POST"], post(lb::mutation))
    .add(openapi::OPENAPI_PATH, &["GET"], get(openapi::openapi_json));

    let router = routes
        .router
        .fallback(|OriginalUri(uri): OriginalUri| async move {
            ApiError::NotFound {
                path: uri.path().to_string(),
            }
        })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
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
        state
            .authenticator
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
        let Caller(principal) = Caller::from_request_parts(parts, state).await?;
        match &principal.identity {
            auth::Identity::Admin => Ok(Admin(principal)),
            auth::Identity::User { username, .. } => {
                let refused = auth::AuthError::NotAdmin {
                    user: username.clone(),
                    roles: "admin".into(),
                };
                crate::metrics::auth_failed(refused.reason());
                Err(refused.into())
            }
        }
    }
}

fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge { limit: BODY_LIMIT }
        } else {
            ApiError::BadBody {
                reason: rejection.body_text(),
            }
        }
    })
}

fn cloud_config_response(req: &AccountRequest, kubeconfig: &str) -> Response {
    match req.output {
        OutputFormat::CloudInit => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-yaml; charset=utf-8"),
            )],
            render::cloud_init(kubeconfig),
        )
            .into_response(),
        OutputFormat::Kubeconfig => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            render::go_json_string(kubeconfig),
        )
            .into_response(),
    }
}

async fn post_kubeconfig(
    State(state): State<AppState>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let issued = async {
        let req = kubeconfig::request::from_json(&body_bytes(body)?)?;
        caller
            .authorize(
                &state,
                auth::Action::CreateAccount {
                    namespace: &req.namespace,
                },
            )
            .await?;
        let kubeconfig = {
            let (cloud_config, req) = (state.cloud_config.clone(), req.clone());
            to_completion(async move { cloud_config.ensure(&req).await }).await?
        };
        Ok::<_, ApiError>((req, kubeconfig))
    };
    let (req, kubeconfig) = metrics::cloud_config(Create, |(r, _)| r.output, issued.await)?;
    Ok(cloud_config_response(&req, &kubeconfig))
}

async fn get_kubeconfig(
    State(state): State<AppState>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let issued = async {
        let req = kubeconfig::request::from_query(query.as_deref())?;
        caller
            .authorize(
                &state,
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
