//! One REST layer for every kind of object the HTTP API serves through the store: a kind says what
//! it is ([`Resource`]: its name, its store descriptor, where a URL's objects live, how it is
//! shown; [`Writable`]: how a body is read and checked), and the handlers here do the rest for all
//! of them alike: list, get, create (POST), replace (PUT of an existing object), put (PUT that
//! creates or replaces) and delete. [`kinds`] holds the kinds and their routes.
//!
//! Where the kinds behaved differently before they shared this layer, each kind keeps its own
//! behaviour through a knob of [`Resource`] (and the wording of [`error::Place`]); the differences
//! are pinned by `tests/rest_layer.rs`.
//!
//! No kind is watched over HTTP, and none has a status subresource route: the reconcilers own
//! status, and a VMI's is written with the object (KubeVirt's CRD has no status subresource).

pub mod body;
pub mod error;
pub mod kinds;

use std::{marker::PhantomData, sync::Arc};

use axum::{
    Json,
    body::Bytes,
    extract::{FromRequestParts, Path, State, rejection::BytesRejection},
    http::{StatusCode, request::Parts},
    response::{IntoResponse, Response},
};
use kube::Resource as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use error::{Action, Place, RestError};

use super::{Admin, ApiError, AppState};
use crate::store::{Api, Deleted, Kind, LabelSelector, Object, ObjectStore, Preconditions};

/// How a kind's objects are shown.
#[derive(Clone, Copy, Debug)]
pub enum Shape {
    /// steve's (Rancher's API, which the Harvester UI speaks): `id` (`name` or `namespace/name`)
    /// and `type` before the Kubernetes object; a list is
    /// `{"type":"collection","resourceType":…,"revision":…,"data":[…]}`.
    Steve(&'static str),
    /// A core/v1 object as a Kubernetes client reads it (`apiVersion` and `kind` set); a list is a
    /// `<Kind>List`.
    CoreV1(&'static str),
}

impl Shape {
    fn what(self) -> &'static str {
        match self {
            Shape::Steve(what) | Shape::CoreV1(what) => what,
        }
    }

    /// An object as shown.
    pub fn object<T: Serialize>(self, object: &T) -> Result<Value, ApiError> {
        let value = serde_json::to_value(object).map_err(|e| ApiError::Encode {
            what: self.what(),
            reason: e.to_string(),
        })?;
        Ok(self.value(value))
    }

    /// An object already in JSON, as shown.
    pub fn value(self, mut value: Value) -> Value {
        match self {
            Shape::Steve(type_) => {
                let (namespace, name) = crate::store::object_key(&value);
                let id = if namespace.is_empty() {
                    name
                } else {
                    format!("{namespace}/{name}")
                };
                let mut out = Map::new();
                out.insert("id".into(), Value::from(id));
                out.insert("type".into(), Value::from(type_));
                if let Value::Object(fields) = value {
                    out.extend(fields);
                }
                Value::Object(out)
            }
            Shape::CoreV1(kind) => {
                if let Some(fields) = value.as_object_mut() {
                    fields.insert("apiVersion".into(), Value::from("v1"));
                    fields.insert("kind".into(), Value::from(kind));
                }
                value
            }
        }
    }

    /// A list of objects as shown, with the revision to watch from.
    pub fn list<T: Serialize>(
        self,
        items: &[T],
        revision: String,
    ) -> Result<Json<Value>, ApiError> {
        let items = items
            .iter()
            .map(|i| self.object(i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Json(match self {
            Shape::Steve(type_) => serde_json::json!({
                "type": "collection",
                "resourceType": type_,
                "revision": revision,
                "data": items,
            }),
            Shape::CoreV1(kind) => serde_json::json!({
                "apiVersion": "v1",
                "kind": format!("{kind}List"),
                "metadata": {"resourceVersion": revision},
                "items": items,
            }),
        }))
    }
}

/// What a deletion answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteAnswer {
    /// The object as the store returned it, with 200 whether it is gone or marked for deletion.
    AsStored,
    /// The object read as the kind, with 200 when it is gone and 202 when it is marked for
    /// deletion until its finalizers are done.
    Decoded,
}

/// What a path segment that is not UTF-8 once percent-decoded is answered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadPath {
    /// It names no object: 404 in the error shape.
    NotFound,
    /// axum's own answer: a plain-text 400.
    Plain,
}

/// The path parameters of every REST route, by name; each kind reads those of its routes.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Loc {
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub cluster: Option<String>,
    #[serde(default)]
    pub svc_namespace: Option<String>,
    #[serde(default)]
    pub svc_name: Option<String>,
}

/// Where a request's objects live: the store to call and the place, which sets the wording of
/// failures.
pub struct Scope {
    pub store: Arc<dyn ObjectStore>,
    pub place: Place,
}

impl Scope {
    pub fn host(store: Arc<dyn ObjectStore>) -> Self {
        Scope {
            store,
            place: Place::Host,
        }
    }

    fn api<R: Resource>(&self) -> Api<R::Object> {
        Api::with_kind(self.store.clone(), R::kind())
    }

    pub fn failed<R: Resource>(
        &self,
        action: Action,
        namespace: &str,
        name: &str,
    ) -> impl FnOnce(crate::store::StoreError) -> RestError + use<R> {
        self.place
            .failed(action, R::NAME, &R::kind().plural, namespace, name)
    }
}

/// A kind the REST layer serves.
pub trait Resource: Send + Sync + 'static {
    type Object: Object;
    /// The kind as messages name it (`loadbalancer`, `service`).
    const NAME: &'static str;
    const SHAPE: Shape;
    /// Knob: the answer to a path segment that is not UTF-8.
    const BAD_PATH: BadPath = BadPath::NotFound;
    /// Knob: whether one stored object that does not decode fails a whole list (500) rather than
    /// being left out of it (and logged).
    const STRICT_LIST: bool = false;
    /// Knob: what a deletion answers.
    const DELETED: DeleteAnswer = DeleteAnswer::AsStored;

    /// The store's descriptor of the kind.
    fn kind() -> Kind {
        Kind::of::<Self::Object>()
    }

    /// Where the URL's objects live, or why this backend has none of them.
    fn scope(state: &AppState, at: &Loc) -> Result<Scope, ApiError>;

    /// The namespace and name of the object the URL names (`""` namespace when cluster-scoped).
    fn key(at: &Loc) -> Result<(String, String), RestError> {
        Ok((
            at.namespace.clone().unwrap_or_default(),
            at.name.clone().unwrap_or_default(),
        ))
    }

    /// The namespace whose objects a list URL asks for (`None`: every namespace).
    fn list_namespace(at: &Loc) -> Result<Option<String>, ApiError> {
        Ok(at.namespace.clone())
    }

    /// Puts a list in the order it is shown in (the store's by default).
    fn arrange(_items: &mut [Self::Object]) {}
}

/// A kind whose objects are written through the REST layer.
pub trait Writable: Resource {
    /// A request body, read as the API server reads the kind (before admission).
    fn decode(body: &[u8]) -> Result<Self::Object, RestError>;

    /// Checks a write beyond the store's own, on the object as it is about to be written.
    fn check(
        _state: &AppState,
        _scope: &Scope,
        _object: &Self::Object,
    ) -> impl Future<Output = Result<(), RestError>> + Send {
        async { Ok(()) }
    }

    /// Carries the server's part of the stored object (its status) into one that replaces it.
    fn keep_status(_object: &mut Self::Object, _current: &Self::Object) {}
}

/// The path parameters of a request for kind `R`.
pub struct At<R>(pub Loc, PhantomData<fn() -> R>);

impl<R: Resource> FromRequestParts<AppState> for At<R> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        match Path::<Loc>::from_request_parts(parts, state).await {
            Ok(Path(at)) => Ok(At(at, PhantomData)),
            Err(rejection) => Err(match R::BAD_PATH {
                BadPath::NotFound => ApiError::NotFound {
                    path: parts.uri.path().to_string(),
                }
                .into_response(),
                BadPath::Plain => rejection.into_response(),
            }),
        }
    }
}

/// The objects of a list, in the namespace (if any), and the revision to watch from.
pub async fn list_objects<R: Resource>(
    scope: &Scope,
    namespace: Option<&str>,
) -> Result<(Vec<R::Object>, String), RestError> {
    let kind = R::kind();
    let list = scope
        .store
        .list(&kind, namespace, &LabelSelector::everything())
        .await
        .map_err(scope.failed::<R>(Action::List, "", namespace.unwrap_or_default()))?;
    let mut items = if R::STRICT_LIST {
        list.items
            .into_iter()
            .map(|v| {
                serde_json::from_value(v).map_err(|e| RestError::Stored {
                    kind: kind.kind.to_string(),
                    reason: e.to_string(),
                    cluster: scope.place.cluster().cloned(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?
    } else {
        crate::store::decode_listed(&kind, list.items)
    };
    R::arrange(&mut items);
    Ok((items, list.resource_version))
}

/// One object; not found when it does not exist.
pub async fn fetch<R: Resource>(
    scope: &Scope,
    namespace: &str,
    name: &str,
) -> Result<R::Object, RestError> {
    scope
        .api::<R>()
        .get(namespace, name)
        .await
        .map_err(scope.failed::<R>(Action::Get, namespace, name))?
        .ok_or_else(|| scope.place.not_found(R::NAME, namespace, name))
}

/// `GET` of a collection.
pub async fn list<R: Resource>(
    State(state): State<AppState>,
    _admin: Admin,
    At(at, _): At<R>,
) -> Result<Json<Value>, ApiError> {
    let scope = R::scope(&state, &at)?;
    let namespace = R::list_namespace(&at)?;
    let (items, revision) = list_objects::<R>(&scope, namespace.as_deref()).await?;
    R::SHAPE.list(&items, revision)
}

/// `GET` of an object.
pub async fn get<R: Resource>(
    State(state): State<AppState>,
    _admin: Admin,
    At(at, _): At<R>,
) -> Result<Json<Value>, ApiError> {
    let scope = R::scope(&state, &at)?;
    let (namespace, name) = R::key(&at)?;
    let object = fetch::<R>(&scope, &namespace, &name).await?;
    Ok(Json(R::SHAPE.object(&object)?))
}

/// `POST` to a collection: a new object, which names its namespace (if the kind has one).
pub async fn create<R: Writable>(
    State(state): State<AppState>,
    _admin: Admin,
    At(at, _): At<R>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body::read(body)?;
    let scope = R::scope(&state, &at)?;
    let object = R::decode(&body)?;
    let meta = object.meta();
    let name = meta.name.clone().unwrap_or_default();
    let namespace = meta.namespace.clone().unwrap_or_default();
    if R::kind().namespaced && namespace.is_empty() {
        return Err(RestError::MissingNamespace {
            kind: R::NAME,
            name,
        }
        .into());
    }
    R::check(&state, &scope, &object).await?;
    let made = scope
        .api::<R>()
        .create(&object)
        .await
        .map_err(scope.failed::<R>(Action::Create, &namespace, &name))?;
    Ok((StatusCode::CREATED, Json(R::SHAPE.object(&made)?)).into_response())
}

/// The body of a write to the object the URL names: read, and keyed as the URL says.
fn body_for<R: Writable>(
    body: &[u8],
    scope: &Scope,
    namespace: &str,
    name: &str,
) -> Result<R::Object, RestError> {
    let mut object = R::decode(body)?;
    let namespace = R::kind().namespaced.then_some(namespace);
    body::key_from_url(
        object.meta_mut(),
        namespace,
        name,
        scope.place.noun(R::NAME),
    )?;
    Ok(object)
}

/// `PUT` of an existing object. A body without a resourceVersion replaces whatever is stored.
pub async fn replace<R: Writable>(
    State(state): State<AppState>,
    _admin: Admin,
    At(at, _): At<R>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body::read(body)?;
    let scope = R::scope(&state, &at)?;
    let (namespace, name) = R::key(&at)?;
    let object = body_for::<R>(&body, &scope, &namespace, &name)?;
    R::check(&state, &scope, &object).await?;
    let replaced = scope
        .api::<R>()
        .replace(&object)
        .await
        .map_err(scope.failed::<R>(Action::Update, &namespace, &name))?;
    Ok(Json(R::SHAPE.object(&replaced)?))
}

/// `PUT` that creates the object (201) or replaces it (200), with Kubernetes' semantics: the UID
/// is the server's (another incarnation's is a conflict), a body without a resourceVersion
/// replaces whatever is stored, and the status and finalizers are the server's.
pub async fn put<R: Writable>(
    State(state): State<AppState>,
    _admin: Admin,
    At(at, _): At<R>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body::read(body)?;
    let scope = R::scope(&state, &at)?;
    let (namespace, name) = R::key(&at)?;
    let mut object = body_for::<R>(&body, &scope, &namespace, &name)?;
    let api = scope.api::<R>();
    let current = api.get(&namespace, &name).await.map_err(scope.failed::<R>(
        Action::Get,
        &namespace,
        &name,
    ))?;
    let meta = object.meta_mut();
    match &current {
        Some(current) => {
            let stored = current.meta();
            let uid = meta.uid.as_deref().filter(|u| !u.is_empty());
            if uid.is_some_and(|u| Some(u) != stored.uid.as_deref()) {
                return Err(RestError::Conflict {
                    resource: R::kind().plural.to_string(),
                    name,
                }
                .into());
            }
            meta.uid = stored.uid.clone();
            if meta
                .resource_version
                .as_deref()
                .unwrap_or_default()
                .is_empty()
            {
                meta.resource_version = stored.resource_version.clone();
            }
            // The finalizers are the reconciler's: dropping its own would skip the release.
            meta.finalizers = stored.finalizers.clone();
            R::keep_status(&mut object, current);
        }
        None => {
            meta.uid = None;
            meta.resource_version = None;
            meta.finalizers = None;
        }
    }
    R::check(&state, &scope, &object).await?;
    let (status, written) = match current {
        Some(_) => (
            StatusCode::OK,
            api.replace(&object).await.map_err(scope.failed::<R>(
                Action::Update,
                &namespace,
                &name,
            ))?,
        ),
        None => (
            StatusCode::CREATED,
            api.create(&object).await.map_err(scope.failed::<R>(
                Action::Create,
                &namespace,
                &name,
            ))?,
        ),
    };
    Ok((status, Json(R::SHAPE.object(&written)?)).into_response())
}

/// `DELETE` of an object; one with finalizers is marked for deletion and goes once they are done.
pub async fn delete<R: Resource>(
    State(state): State<AppState>,
    _admin: Admin,
    At(at, _): At<R>,
) -> Result<Response, ApiError> {
    let scope = R::scope(&state, &at)?;
    let (namespace, name) = R::key(&at)?;
    let deleted = scope
        .store
        .delete(&R::kind(), &namespace, &name, &Preconditions::default())
        .await
        .map_err(scope.failed::<R>(Action::Delete, &namespace, &name))?;
    let (value, gone) = match deleted {
        Deleted::Gone(v) => (v, true),
        Deleted::Pending(v) => (v, false),
    };
    Ok(match R::DELETED {
        DeleteAnswer::AsStored => Json(R::SHAPE.value(value)).into_response(),
        DeleteAnswer::Decoded => {
            let object: R::Object =
                serde_json::from_value(value).map_err(|e| RestError::Stored {
                    kind: R::kind().kind.to_string(),
                    reason: e.to_string(),
                    cluster: scope.place.cluster().cloned(),
                })?;
            let status = if gone {
                StatusCode::OK
            } else {
                StatusCode::ACCEPTED
            };
            (status, Json(R::SHAPE.object(&object)?)).into_response()
        }
    })
}
