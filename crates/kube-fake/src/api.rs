//! The HTTP surface: one axum fallback handler that authenticates, resolves the request the way the
//! real RequestInfo resolver does, authorizes it through RBAC, negotiates the media type, and
//! dispatches to discovery, the object operations, watches, and the review and token endpoints.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Value, json};
use tracing::{Instrument, debug, info_span};

use crate::admission;
use crate::auth::{self, API_AUDIENCE, Identity, TokenKind};
use crate::clock;
use crate::discovery;
use crate::ops::{self, Deleted, PatchType, WriteCtx};
use crate::rbac::{self, Attributes};
use crate::registry::{Behaviour, ResourceType};
use crate::selector::{FieldSelector, LabelSelector};
use crate::state::{Inner, RequestRecord, Shared};
use crate::status::{self, ApiError, FieldError};
use crate::strings;
use crate::table::{self, IncludeObject};
use crate::watch::{self, Render, WatchRequest};

const MAX_BODY: usize = 3 * 1024 * 1024;

/// A resource path, parsed like the real RequestInfo resolver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    /// API group, empty for core.
    pub group: String,
    /// Version.
    pub version: String,
    /// Plural resource.
    pub resource: String,
    /// Namespace from the path.
    pub namespace: Option<String>,
    /// Object name.
    pub name: Option<String>,
    /// Subresource.
    pub subresource: Option<String>,
}

/// What a path addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `/healthz`, `/livez`, `/readyz`.
    Health,
    /// `/version`.
    Version,
    /// `/api`.
    Api,
    /// `/apis`.
    Apis,
    /// `/apis/<group>`.
    Group(String),
    /// `/api/v1`, `/apis/<group>/<version>`.
    GroupVersion(String, String),
    /// `/openapi/v3`.
    OpenApiIndex,
    /// `/openapi/v3/api/v1`, `/openapi/v3/apis/<g>/<v>`.
    OpenApiDoc(String, String),
    /// A resource request.
    Resource(ResourcePath),
    /// Anything else.
    Unknown,
}

fn resource_path(group: &str, version: &str, rest: &[&str]) -> Target {
    let mut rest = rest.to_vec();
    let mut namespace = None;
    if rest.first() == Some(&"namespaces")
        && rest.len() > 2
        && !matches!(rest[2], "status" | "finalize")
    {
        namespace = Some(rest[1].to_string());
        rest = rest[2..].to_vec();
    }
    if rest.is_empty() || rest.len() > 3 || rest.iter().any(|s| s.is_empty()) {
        return Target::Unknown;
    }
    Target::Resource(ResourcePath {
        group: group.into(),
        version: version.into(),
        resource: rest[0].into(),
        namespace,
        name: rest.get(1).map(|s| s.to_string()),
        subresource: rest.get(2).map(|s| s.to_string()),
    })
}

/// Parses a request path.
pub fn parse_path(path: &str) -> Target {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    match segs.as_slice() {
        ["healthz" | "livez" | "readyz", ..] => Target::Health,
        ["version"] => Target::Version,
        ["api"] => Target::Api,
        ["api", v] => Target::GroupVersion(String::new(), v.to_string()),
        ["api", v, rest @ ..] => resource_path("", v, rest),
        ["apis"] => Target::Apis,
        ["apis", g] => Target::Group(g.to_string()),
        ["apis", g, v] => Target::GroupVersion(g.to_string(), v.to_string()),
        ["apis", g, v, rest @ ..] => resource_path(g, v, rest),
        ["openapi", "v3"] => Target::OpenApiIndex,
        ["openapi", "v3", "api", v] => Target::OpenApiDoc(String::new(), v.to_string()),
        ["openapi", "v3", "apis", g, v] => Target::OpenApiDoc(g.to_string(), v.to_string()),
        _ => Target::Unknown,
    }
}

/// The response media type chosen from `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// application/json.
    Json,
    /// application/yaml.
    Yaml,
    /// `as=Table`, with the meta.k8s.io version.
    Table(&'static str),
    /// `as=PartialObjectMetadata[List]`, with the meta.k8s.io version.
    Metadata(&'static str),
}

/// Picks the first acceptable media range, as the real server's negotiation does.
pub fn negotiate(accept: Option<&str>) -> Result<Output, ApiError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok(Output::Json);
    };
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let mt = parts.next().unwrap_or_default().to_ascii_lowercase();
        let params: HashMap<String, String> = parts
            .filter_map(|p| {
                p.split_once('=')
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            })
            .collect();
        let json_like = matches!(mt.as_str(), "application/json" | "application/*" | "*/*");
        let meta_version = match params.get("v").map(String::as_str) {
            Some("v1beta1") => "v1beta1",
            _ => "v1",
        };
        match params.get("as").map(String::as_str) {
            Some("Table") if json_like && params.get("g").is_none_or(|g| g == "meta.k8s.io") => {
                return Ok(Output::Table(meta_version));
            }
            Some("PartialObjectMetadata" | "PartialObjectMetadataList") if json_like => {
                return Ok(Output::Metadata(meta_version));
            }
            Some(_) => continue,
            None => {}
        }
        if json_like {
            return Ok(Output::Json);
        }
        if mt == "application/yaml" {
            return Ok(Output::Yaml);
        }
    }
    Err(ApiError::not_acceptable())
}

fn respond(code: StatusCode, value: &Value, output: Output) -> Response {
    if output == Output::Yaml {
        let text = yaml_serde::to_string(value).unwrap_or_default();
        return (code, [(header::CONTENT_TYPE, "application/yaml")], text).into_response();
    }
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

fn render_object(
    rt: &ResourceType,
    version: &str,
    obj: Value,
    output: Output,
    include: IncludeObject,
) -> Value {
    match output {
        Output::Table(v) => {
            let meta = json!({"resourceVersion": obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)});
            table::render(rt, version, &[obj], meta, include, v)
        }
        Output::Metadata(v) => table::partial_metadata(&obj, v),
        _ => obj,
    }
}

/// The identity and audiences of a token, if the fake issued or knows it and it is still valid.
pub fn identity_for(inner: &Inner, token: &str) -> Option<(Identity, Vec<String>)> {
    let sa_uid_of = |ns: &str, name: &str| {
        inner
            .store
            .get(&(
                String::new(),
                "serviceaccounts".into(),
                ns.into(),
                name.into(),
            ))
            .and_then(|sa| sa.pointer("/metadata/uid"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    match inner.tokens.get(token)? {
        TokenKind::Static(id) => Some((id.clone(), vec![API_AUDIENCE.into()])),
        TokenKind::Legacy {
            namespace,
            secret,
            sa_name,
            sa_uid,
        } => {
            let stored = inner.store.get(&(
                String::new(),
                "secrets".into(),
                namespace.clone(),
                secret.clone(),
            ))?;
            let stored_token = stored.pointer("/data/token").and_then(Value::as_str)?;
            if STANDARD.decode(stored_token).ok()? != token.as_bytes()
                || sa_uid_of(namespace, sa_name)? != *sa_uid
            {
                return None;
            }
            Some((
                Identity::service_account(namespace, sa_name, sa_uid),
                vec![API_AUDIENCE.into()],
            ))
        }
        TokenKind::Bound {
            namespace,
            sa_name,
            sa_uid,
            expires,
            audiences,
            jti,
        } => {
            if clock::now_unix() >= *expires || sa_uid_of(namespace, sa_name)? != *sa_uid {
                return None;
            }
            let mut id = Identity::service_account(namespace, sa_name, sa_uid);
            id.extra.insert(
                "authentication.kubernetes.io/credential-id".into(),
                vec![format!("JTI={jti}")],
            );
            Some((id, audiences.clone()))
        }
    }
}

/// The axum fallback handler serving every path.
pub async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let token = auth::bearer(
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok()),
    )
    .map(str::to_string);
    let authn = token.as_deref().and_then(|t| {
        let inner = shared.lock();
        identity_for(&inner, t)
            .filter(|(_, aud)| aud.iter().any(|a| a == API_AUDIENCE))
            .map(|(id, _)| id)
    });
    let record = RequestRecord {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        user: authn
            .as_ref()
            .map(|i| i.username.clone())
            .unwrap_or_default(),
    };
    shared.record(record.clone());
    let span = info_span!("request", %method, %path);
    let result = serve(shared.clone(), req, authn)
        .instrument(span.clone())
        .await;
    let response = result.unwrap_or_else(IntoResponse::into_response);
    if response.status() == axum::http::StatusCode::FORBIDDEN {
        shared
            .forbidden
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record);
    }
    span.in_scope(|| debug!(status = response.status().as_u16(), "served"));
    response
}

fn impersonate(inner: &Inner, caller: Identity, headers: &HeaderMap) -> Result<Identity, ApiError> {
    let user = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect();
    let Some(user) = user else {
        if !groups.is_empty() {
            return Err(ApiError::internal(
                "requested [impersonate-group] without impersonating a user",
            ));
        }
        return Ok(caller);
    };
    let check = |attrs: Attributes| -> Result<(), ApiError> {
        if rbac::authorize(&inner.store, &caller, &attrs).allowed {
            Ok(())
        } else {
            Err(ApiError::forbidden(
                &attrs.resource,
                "",
                &attrs.name,
                &rbac::forbidden_reason(&caller, &attrs),
            ))
        }
    };
    let mut id = if let Some(rest) = user.strip_prefix("system:serviceaccount:") {
        let (ns, name) = rest.split_once(':').unwrap_or(("", rest));
        check(Attributes {
            verb: "impersonate".into(),
            resource: "serviceaccounts".into(),
            name: name.into(),
            namespace: ns.into(),
            ..Default::default()
        })?;
        let mut sa = Identity::service_account(ns, name, "");
        sa.groups.retain(|g| g != "system:authenticated");
        sa
    } else {
        check(Attributes {
            verb: "impersonate".into(),
            resource: "users".into(),
            name: user.clone(),
            ..Default::default()
        })?;
        Identity {
            username: user,
            ..Default::default()
        }
    };
    for g in groups {
        check(Attributes {
            verb: "impersonate".into(),
            resource: "groups".into(),
            name: g.clone(),
            ..Default::default()
        })?;
        if !id.groups.contains(&g) {
            id.groups.push(g);
        }
    }
    if let Some(uid) = headers.get("impersonate-uid").and_then(|v| v.to_str().ok()) {
        check(Attributes {
            verb: "impersonate".into(),
            group: "authentication.k8s.io".into(),
            resource: "uids".into(),
            name: uid.into(),
            ..Default::default()
        })?;
        id.uid = uid.into();
    }
    if !id.groups.iter().any(|g| g == "system:authenticated") && id.username != "system:anonymous" {
        id.groups.push("system:authenticated".into());
    }
    Ok(id)
}

fn authorize(
    inner: &Inner,
    id: &Identity,
    attrs: &Attributes,
    group: &str,
    resource: &str,
) -> Result<(), ApiError> {
    if rbac::authorize(&inner.store, id, attrs).allowed {
        return Ok(());
    }
    Err(ApiError::forbidden(
        resource,
        group,
        &attrs.name,
        &rbac::forbidden_reason(id, attrs),
    ))
}

async fn serve(
    shared: Arc<Shared>,
    req: Request,
    authn: Option<Identity>,
) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let target = parse_path(parts.uri.path());
    let caller = match authn {
        Some(id) => id,
        None if matches!(target, Target::Health | Target::Version) => Identity {
            username: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..Default::default()
        },
        None => return Err(ApiError::unauthorized()),
    };
    let id = {
        let inner = shared.lock();
        impersonate(&inner, caller, &parts.headers)?
    };
    let output = negotiate(
        parts
            .headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    )?;
    let query: HashMap<String, String> =
        axum::extract::Query::<HashMap<String, String>>::try_from_uri(&parts.uri)
            .map(|q| q.0)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;

    if let Target::Resource(rp) = target {
        return serve_resource(
            shared,
            parts.method,
            rp,
            query,
            &parts.headers,
            body,
            id,
            output,
        )
        .await;
    }
    if parts.method != Method::GET {
        return Err(ApiError {
            code: 405,
            reason: "MethodNotAllowed".into(),
            message: "the server does not allow this method on the requested resource".into(),
            details: Some(Default::default()),
        });
    }
    let inner = shared.lock();
    let attrs = Attributes {
        verb: "get".into(),
        path: Some(parts.uri.path().to_string()),
        ..Default::default()
    };
    authorize(&inner, &id, &attrs, "", "")?;
    let doc = match target {
        Target::Health => return Ok((StatusCode::OK, "ok").into_response()),
        Target::Version => Some(discovery::version()),
        Target::Api => {
            let addr = shared
                .info
                .base_url
                .trim_start_matches("https://")
                .to_string();
            Some(discovery::core_versions(&addr))
        }
        Target::Apis => Some(discovery::group_list(&inner.types)),
        Target::Group(g) => discovery::group(&inner.types, &g),
        Target::GroupVersion(g, v) => discovery::resource_list(&inner.types, &g, &v),
        Target::OpenApiIndex => Some(discovery::openapi_index(&inner.types)),
        Target::OpenApiDoc(g, v) => discovery::openapi_doc(&inner.types, &g, &v),
        Target::Resource(_) | Target::Unknown => None,
    };
    match doc {
        Some(d) => Ok(respond(
            StatusCode::OK,
            &d,
            if output == Output::Yaml {
                Output::Yaml
            } else {
                Output::Json
            },
        )),
        None => Err(ApiError::path_not_found()),
    }
}

async fn read_body(
    body: Body,
    headers: &HeaderMap,
    patch: bool,
) -> Result<(Value, Option<PatchType>), ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_ascii_lowercase();
    let mt = ct.split(';').next().unwrap_or_default().trim().to_string();
    let bytes: Bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| ApiError {
            code: 413,
            reason: "RequestEntityTooLarge".into(),
            message: "the request body is too large".into(),
            details: None,
        })?;
    let (ptype, yaml) = if patch {
        match mt.as_str() {
            "application/merge-patch+json" => (Some(PatchType::Merge), false),
            "application/strategic-merge-patch+json" => (Some(PatchType::Strategic), false),
            "application/json-patch+json" => (Some(PatchType::Json), false),
            "application/apply-patch+yaml" => (Some(PatchType::Apply), true),
            _ => {
                return Err(ApiError::unsupported_media_type(
                    &mt,
                    &[
                        "application/json-patch+json",
                        "application/merge-patch+json",
                        "application/apply-patch+yaml",
                        "application/strategic-merge-patch+json",
                    ],
                ));
            }
        }
    } else if mt == "application/vnd.kubernetes.protobuf" {
        // kubectl's typed commands send protobuf; decode the kinds they use, refuse the rest.
        return match crate::proto::decode(&bytes) {
            Ok(v) => Ok((v, None)),
            Err(crate::proto::ProtoError::Unsupported(_)) => Err(ApiError::unsupported_media_type(
                &mt,
                &["application/json", "application/yaml"],
            )),
            Err(e) => Err(ApiError::bad_request(e.to_string())),
        };
    } else {
        match mt.as_str() {
            "application/json" | "" => (None, false),
            "application/yaml" => (None, true),
            _ => {
                return Err(ApiError::unsupported_media_type(
                    &mt,
                    &["application/json", "application/yaml"],
                ));
            }
        }
    };
    if bytes.is_empty() {
        return Err(ApiError::bad_request("the body of the request is empty"));
    }
    let value = match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) => v,
        Err(_) if yaml => yaml_serde::from_slice::<Value>(&bytes)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        Err(e) => {
            return Err(ApiError::bad_request(format!(
                "couldn't get version/kind; json parse error: {e}"
            )));
        }
    };
    Ok((value, ptype))
}

fn flag(query: &HashMap<String, String>, name: &str) -> bool {
    query.get(name).is_some_and(|v| v == "true" || v == "1")
}

#[allow(clippy::too_many_arguments)]
async fn serve_resource(
    shared: Arc<Shared>,
    method: Method,
    rp: ResourcePath,
    query: HashMap<String, String>,
    headers: &HeaderMap,
    body: Body,
    id: Identity,
    output: Output,
) -> Result<Response, ApiError> {
    let rt = {
        let inner = shared.lock();
        inner
            .lookup(&rp.group, &rp.version, &rp.resource)
            .cloned()
            .ok_or_else(ApiError::path_not_found)?
    };
    let version = rp.version.clone();
    let ns_ok = match (rt.namespaced, &rp.namespace) {
        (true, Some(_)) => true,
        (true, None) => rp.name.is_none() && method == Method::GET,
        (false, Some(_)) => false,
        (false, None) => true,
    };
    if !ns_ok {
        return Err(ApiError::path_not_found());
    }
    let sub = rp.subresource.clone();
    let sub_ok = match sub.as_deref() {
        None => true,
        Some("status") => rt.has_status(&version),
        Some("token") => rt.behaviour == Behaviour::ServiceAccount,
        Some(_) => false,
    };
    if !sub_ok {
        return Err(ApiError::path_not_found());
    }
    let watching = flag(&query, "watch");
    let verb = match (&method, rp.name.is_some()) {
        (&Method::GET, _) if watching => "watch",
        (&Method::GET, true) => "get",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::POST, true) if sub.as_deref() == Some("token") => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        (m, _) => {
            return Err(ApiError::method_not_supported(
                &rt.plural,
                &rt.group,
                &m.as_str().to_lowercase(),
            ));
        }
    };
    if rt.is_virtual() && verb != "create" {
        return Err(ApiError::method_not_supported(&rt.plural, &rt.group, verb));
    }
    if sub.as_deref() == Some("token") && verb != "create" {
        return Err(ApiError::method_not_supported(
            "serviceaccounts/token",
            "",
            verb,
        ));
    }
    if sub.as_deref() == Some("status") && !matches!(verb, "get" | "update" | "patch") {
        return Err(ApiError::method_not_supported(
            &format!("{}/status", rt.plural),
            &rt.group,
            verb,
        ));
    }
    let namespace = rp.namespace.clone().unwrap_or_default();
    let name = rp.name.clone().unwrap_or_default();
    let attrs = Attributes {
        verb: verb.into(),
        group: rt.group.clone(),
        resource: rt.plural.clone(),
        subresource: sub.clone().unwrap_or_default(),
        name: name.clone(),
        namespace: namespace.clone(),
        path: None,
    };
    {
        let inner = shared.lock();
        authorize(&inner, &id, &attrs, &rt.group, &rt.plural)?;
    }
    let include = match query.get("includeObject").map(String::as_str) {
        Some("None") => IncludeObject::None,
        Some("Object") => IncludeObject::Object,
        _ => IncludeObject::Metadata,
    };
    let ctx = WriteCtx {
        id: id.clone(),
        dry_run: query.get("dryRun").is_some_and(|v| v == "All"),
        ca_pem: shared.info.ca_pem.clone(),
    };
    let labels = LabelSelector::parse(
        query
            .get("labelSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )?;
    let mut fields = query.get("fieldSelector").cloned().unwrap_or_default();
    if let Some(n) = rp.name.as_ref().filter(|_| verb == "watch") {
        fields = if fields.is_empty() {
            format!("metadata.name={n}")
        } else {
            format!("{fields},metadata.name={n}")
        };
    }
    let fields = FieldSelector::parse(&fields, rt.field_labels())?;
    let manager = query.get("fieldManager").cloned().unwrap_or_default();

    match verb {
        "watch" => {
            let render = match output {
                Output::Table(v) => Render::Table(include, v),
                Output::Metadata(v) => Render::Metadata(v),
                _ => Render::Object,
            };
            let timeout = query
                .get("timeoutSeconds")
                .and_then(|t| t.parse::<u64>().ok())
                .map(Duration::from_secs);
            watch::start(
                shared.clone(),
                WatchRequest {
                    rt,
                    version,
                    namespace: rp.namespace.clone(),
                    labels,
                    fields,
                    resource_version: query.get("resourceVersion").cloned(),
                    send_initial: query.get("sendInitialEvents").map(|v| v == "true"),
                    bookmarks: flag(&query, "allowWatchBookmarks"),
                    timeout,
                    render,
                },
            )
        }
        "get" => {
            let inner = shared.lock();
            let key = ops::key_of(&rt, &namespace, &name);
            let stored = inner
                .store
                .get(&key)
                .ok_or_else(|| ApiError::not_found(&rt.plural, &rt.group, &name))?;
            let obj = ops::to_version(&rt, &version, stored);
            Ok(respond(
                StatusCode::OK,
                &render_object(&rt, &version, obj, output, include),
                output,
            ))
        }
        "list" => {
            let inner = shared.lock();
            let doc = list(
                &inner,
                &rt,
                &version,
                rp.namespace.as_deref(),
                &labels,
                &fields,
                &query,
                output,
                include,
            )?;
            Ok(respond(StatusCode::OK, &doc, output))
        }
        "create" => {
            let (body, _) = read_body(body, headers, false).await?;
            let obj = match rt.behaviour {
                Behaviour::ServiceAccount if sub.as_deref() == Some("token") => {
                    token_request(&mut shared.lock(), &namespace, &name, body)?
                }
                b if rt.is_virtual() => review(&shared.lock(), &rt, b, &namespace, body, &id)?,
                _ => {
                    let write = admission::Write::Create {
                        namespace: rp.namespace.clone(),
                        body,
                        manager: manager.clone(),
                    };
                    admission::write(&shared, &rt, &version, write, &ctx)
                        .await?
                        .0
                }
            };
            shared.wake.notify_one();
            Ok(respond(StatusCode::CREATED, &obj, plain(output)))
        }
        "update" => {
            let (body, _) = read_body(body, headers, false).await?;
            let write = admission::Write::Update {
                namespace: namespace.clone(),
                name: name.clone(),
                body,
                subresource: sub.clone(),
                manager: manager.clone(),
            };
            let (obj, created) = admission::write(&shared, &rt, &version, write, &ctx).await?;
            shared.wake.notify_one();
            Ok(respond(
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                &obj,
                plain(output),
            ))
        }
        "patch" => {
            let (body, ptype) = read_body(body, headers, true).await?;
            let ptype = ptype.unwrap_or(PatchType::Merge);
            if ptype == PatchType::Apply && manager.is_empty() {
                return Err(ApiError::bad_request(
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            let write = admission::Write::Patch {
                namespace: namespace.clone(),
                name: name.clone(),
                ptype,
                body,
                subresource: sub.clone(),
                manager: manager.clone(),
                force: flag(&query, "force"),
            };
            let (obj, created) = admission::write(&shared, &rt, &version, write, &ctx).await?;
            shared.wake.notify_one();
            Ok(respond(
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                &obj,
                plain(output),
            ))
        }
        "delete" => {
            let options = delete_options(body, headers, &query).await?;
            let key = ops::key_of(&rt, &namespace, &name);
            let outcome = admission::delete(&shared, &rt, &version, key, options, &ctx).await?;
            shared.wake.notify_one();
            let body = match outcome {
                Deleted::Pending(obj) => ops::to_version(&rt, &version, &obj),
                Deleted::Gone(obj) if rt.behaviour == Behaviour::Custom => {
                    ops::to_version(&rt, &version, &obj)
                }
                Deleted::Gone(obj) => status::success_deleted(
                    &rt.plural,
                    &rt.group,
                    &name,
                    obj.pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                ),
            };
            Ok(respond(StatusCode::OK, &body, plain(output)))
        }
        _ => {
            let options = delete_options(body, headers, &query).await?;
            let keys_of = |inner: &Inner| -> Vec<_> {
                inner
                    .store
                    .list(&rt.storage.0, &rt.storage.1, rp.namespace.as_deref())
                    .into_iter()
                    .filter(|(_, o)| labels.matches(o) && fields.matches(o))
                    .map(|(k, _)| k.clone())
                    .collect()
            };
            let admitted = admission::enabled(&shared.lock(), &rt);
            let mut items = Vec::new();
            let rv = if admitted {
                let keys = keys_of(&shared.lock());
                // Each object is admitted as its own DELETE, as the real DeleteCollection does;
                // one deleted meanwhile is skipped.
                for key in keys {
                    match admission::delete(&shared, &rt, &version, key, options.clone(), &ctx)
                        .await
                    {
                        Ok(Deleted::Gone(o) | Deleted::Pending(o)) => {
                            items.push(ops::to_version(&rt, &version, &o))
                        }
                        Err(e) if e.code == 404 => {}
                        Err(e) => return Err(e),
                    }
                }
                shared.lock().store.current_rv().to_string()
            } else {
                let mut inner = shared.lock();
                for key in keys_of(&inner) {
                    match ops::delete(&mut inner, &rt, &key, &options, &ctx)? {
                        Deleted::Gone(o) | Deleted::Pending(o) => {
                            items.push(ops::to_version(&rt, &version, &o))
                        }
                    }
                }
                inner.store.current_rv().to_string()
            };
            shared.wake.notify_one();
            let doc = json!({"kind": format!("{}List", rt.kind), "apiVersion": rt.api_version(&version),
                "metadata": {"resourceVersion": rv}, "items": items});
            Ok(respond(StatusCode::OK, &doc, plain(output)))
        }
    }
}

fn plain(output: Output) -> Output {
    if output == Output::Yaml {
        Output::Yaml
    } else {
        Output::Json
    }
}

async fn delete_options(
    body: Body,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
) -> Result<Value, ApiError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let _ = headers;
    let mut options = if bytes.is_empty() {
        json!({})
    } else {
        serde_json::from_slice::<Value>(&bytes)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    if let Some(p) = query.get("propagationPolicy") {
        options["propagationPolicy"] = json!(p);
    }
    Ok(options)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Continue {
    rv: u64,
    after: (String, String),
}

#[allow(clippy::too_many_arguments)]
fn list(
    inner: &Inner,
    rt: &ResourceType,
    version: &str,
    namespace: Option<&str>,
    labels: &LabelSelector,
    fields: &FieldSelector,
    query: &HashMap<String, String>,
    output: Output,
    include: IncludeObject,
) -> Result<Value, ApiError> {
    let ns = if rt.namespaced { namespace } else { None };
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let cont = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => Some(
            URL_SAFE_NO_PAD
                .decode(c)
                .ok()
                .and_then(|b| serde_json::from_slice::<Continue>(&b).ok())
                .ok_or_else(|| ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?,
        ),
        None => None,
    };
    let rv = cont.as_ref().map_or(inner.store.current_rv(), |c| c.rv);
    let matching: Vec<&Value> = inner
        .store
        .list(&rt.storage.0, &rt.storage.1, ns)
        .into_iter()
        .filter(|(k, _)| {
            cont.as_ref()
                .is_none_or(|c| (k.2.clone(), k.3.clone()) > c.after)
        })
        .map(|(_, o)| o)
        .filter(|o| labels.matches(o) && fields.matches(o))
        .collect();
    let total = matching.len();
    let page: Vec<&Value> = match limit {
        Some(l) => matching.into_iter().take(l).collect(),
        None => matching,
    };
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(last) = page.last().filter(|_| page.len() < total) {
        let after = (
            last.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            last.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        );
        let token =
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&Continue { rv, after }).unwrap_or_default());
        meta["continue"] = json!(token);
        meta["remainingItemCount"] = json!(total - page.len());
    }
    let items: Vec<Value> = page
        .into_iter()
        .map(|o| ops::to_version(rt, version, o))
        .collect();
    Ok(match output {
        Output::Table(v) => table::render(rt, version, &items, meta, include, v),
        Output::Metadata(v) => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": format!("meta.k8s.io/{v}"),
            "metadata": meta,
            "items": items.iter().map(|o| table::partial_metadata(o, v)).collect::<Vec<_>>(),
        }),
        _ => {
            // Built-in lists carry no per-item type information on the wire; custom resource lists do.
            let items: Vec<Value> = if rt.behaviour == Behaviour::Custom {
                items
            } else {
                items
                    .into_iter()
                    .map(|mut o| {
                        if let Value::Object(m) = &mut o {
                            m.remove("kind");
                            m.remove("apiVersion");
                        }
                        o
                    })
                    .collect()
            };
            json!({"kind": format!("{}List", rt.kind), "apiVersion": rt.api_version(version), "metadata": meta, "items": items})
        }
    })
}

fn token_request(
    inner: &mut Inner,
    namespace: &str,
    name: &str,
    body: Value,
) -> Result<Value, ApiError> {
    let sa_uid = inner
        .store
        .get(&(
            String::new(),
            "serviceaccounts".into(),
            namespace.into(),
            name.into(),
        ))
        .and_then(|sa| sa.pointer("/metadata/uid"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| ApiError::not_found("serviceaccounts", "", name))?;
    let expiration = body
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(3600);
    if expiration < 600 {
        return Err(ApiError::invalid(
            "TokenRequest",
            "authentication.k8s.io",
            name,
            &[FieldError::invalid(
                "spec.expirationSeconds",
                &json!(expiration),
                "may not specify a duration less than 10 minutes",
            )],
        ));
    }
    let audiences: Vec<String> = body
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| vec![API_AUDIENCE.into()]);
    let now = clock::now_unix();
    let expires = now + expiration;
    let jti = uuid::Uuid::new_v4().to_string();
    let token = auth::mint_jwt(&json!({
        "aud": audiences, "exp": expires, "iat": now, "nbf": now, "jti": jti,
        "iss": API_AUDIENCE,
        "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": sa_uid}},
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
    }));
    inner.tokens.insert(
        token.clone(),
        TokenKind::Bound {
            namespace: namespace.into(),
            sa_name: name.into(),
            sa_uid,
            expires,
            audiences: audiences.clone(),
            jti,
        },
    );
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": null},
        "spec": {"audiences": audiences, "expirationSeconds": expiration, "boundObjectRef": body.pointer("/spec/boundObjectRef").cloned().unwrap_or(Value::Null)},
        "status": {"token": token, "expirationTimestamp": clock::rfc3339(expires)}
    }))
}

fn review_attrs(spec: &Value) -> Option<Attributes> {
    if let Some(ra) = spec.get("resourceAttributes").filter(|v| v.is_object()) {
        let s = |f: &str| {
            ra.get(f)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        return Some(Attributes {
            verb: s("verb"),
            group: s("group"),
            resource: s("resource"),
            subresource: s("subresource"),
            name: s("name"),
            namespace: s("namespace"),
            path: None,
        });
    }
    let nra = spec
        .get("nonResourceAttributes")
        .filter(|v| v.is_object())?;
    Some(Attributes {
        verb: nra
            .get("verb")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .into(),
        path: Some(
            nra.get("path")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .into(),
        ),
        ..Default::default()
    })
}

fn review(
    inner: &Inner,
    rt: &ResourceType,
    behaviour: Behaviour,
    namespace: &str,
    body: Value,
    caller: &Identity,
) -> Result<Value, ApiError> {
    let mut spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let mut out = json!({
        "kind": rt.kind,
        "apiVersion": rt.api_version("v1"),
        "metadata": {"creationTimestamp": null},
    });
    let status = match behaviour {
        Behaviour::TokenReview => {
            let token = spec
                .get("token")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let wanted = strings(spec.get("audiences"));
            let wanted_eff = if wanted.is_empty() {
                vec![API_AUDIENCE.to_string()]
            } else {
                wanted.clone()
            };
            match identity_for(inner, token) {
                Some((who, aud)) => {
                    let matched: Vec<String> = wanted_eff
                        .iter()
                        .filter(|a| aud.contains(a))
                        .cloned()
                        .collect();
                    if matched.is_empty() {
                        json!({"user": {}, "error": format!("[invalid bearer token, token audiences {aud:?} is invalid for the target audiences {wanted_eff:?}]")})
                    } else {
                        json!({"authenticated": true, "user": who.to_json(), "audiences": matched})
                    }
                }
                None => {
                    json!({"user": {}, "error": "[invalid bearer token, service account token has been invalidated]"})
                }
            }
        }
        Behaviour::SelfSubjectReview => json!({"userInfo": caller.to_json()}),
        Behaviour::SelfSubjectRulesReview => {
            let ns = spec
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let rules = rbac::rules_for(&inner.store, caller, ns);
            let (nonres, res): (Vec<Value>, Vec<Value>) = rules
                .into_iter()
                .partition(|r| r.get("nonResourceURLs").is_some());
            json!({"resourceRules": res, "nonResourceRules": nonres, "incomplete": false})
        }
        _ => {
            if behaviour == Behaviour::LocalSubjectAccessReview {
                let ra_ns = spec
                    .pointer("/resourceAttributes/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if ra_ns.is_empty() {
                    if let Some(ra) = spec.get_mut("resourceAttributes").filter(|v| v.is_object()) {
                        ra["namespace"] = json!(namespace);
                    }
                } else if ra_ns != namespace {
                    return Err(ApiError::invalid(
                        &rt.kind,
                        &rt.group,
                        "",
                        &[FieldError::invalid(
                            "spec.resourceAttributes.namespace",
                            &json!(ra_ns),
                            "must match metadata.namespace",
                        )],
                    ));
                }
                out["metadata"]["namespace"] = json!(namespace);
            }
            let Some(attrs) = review_attrs(&spec) else {
                return Err(ApiError::invalid(
                    &rt.kind,
                    &rt.group,
                    "",
                    &[FieldError::invalid(
                        "spec.resourceAttributes",
                        &json!("null"),
                        "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                    )],
                ));
            };
            let who = if behaviour == Behaviour::SelfSubjectAccessReview {
                caller.clone()
            } else {
                let user = spec
                    .get("user")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let groups = strings(spec.get("groups"));
                if user.is_empty() && groups.is_empty() {
                    return Err(ApiError::invalid(
                        &rt.kind,
                        &rt.group,
                        "",
                        &[FieldError::invalid(
                            "spec.user",
                            &json!(""),
                            "at least one of user or group must be specified",
                        )],
                    ));
                }
                let extra: BTreeMap<String, Vec<String>> = spec
                    .get("extra")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), strings(Some(v))))
                            .collect()
                    })
                    .unwrap_or_default();
                Identity {
                    username: user,
                    uid: spec
                        .get("uid")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .into(),
                    groups,
                    extra,
                }
            };
            let d = rbac::authorize(&inner.store, &who, &attrs);
            if d.allowed {
                json!({"allowed": true, "reason": d.reason})
            } else {
                json!({"allowed": false})
            }
        }
    };
    out["spec"] = spec;
    out["status"] = status;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_like_request_info() {
        let r = |p: &str| match parse_path(p) {
            Target::Resource(r) => Some((r.resource, r.namespace, r.name, r.subresource)),
            _ => None,
        };
        assert_eq!(
            r("/api/v1/namespaces"),
            Some(("namespaces".into(), None, None, None))
        );
        assert_eq!(
            r("/api/v1/namespaces/a"),
            Some(("namespaces".into(), None, Some("a".into()), None))
        );
        assert_eq!(
            r("/api/v1/namespaces/a/status"),
            Some((
                "namespaces".into(),
                None,
                Some("a".into()),
                Some("status".into())
            ))
        );
        assert_eq!(
            r("/api/v1/namespaces/a/secrets/s"),
            Some(("secrets".into(), Some("a".into()), Some("s".into()), None))
        );
        assert_eq!(
            r("/api/v1/namespaces/a/serviceaccounts/s/token"),
            Some((
                "serviceaccounts".into(),
                Some("a".into()),
                Some("s".into()),
                Some("token".into())
            ))
        );
        assert_eq!(parse_path("/apis/apps"), Target::Group("apps".into()));
        assert_eq!(
            parse_path("/openapi/v3/api/v1"),
            Target::OpenApiDoc(String::new(), "v1".into())
        );
    }

    #[test]
    fn negotiation() {
        assert_eq!(negotiate(None).ok(), Some(Output::Json));
        assert_eq!(
            negotiate(Some(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
            ))
            .ok(),
            Some(Output::Table("v1"))
        );
        assert_eq!(
            negotiate(Some("application/vnd.kubernetes.protobuf,application/json")).ok(),
            Some(Output::Json)
        );
        assert_eq!(
            negotiate(Some("application/vnd.kubernetes.protobuf"))
                .err()
                .map(|e| e.code),
            Some(406)
        );
    }
}
