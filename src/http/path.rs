//! Path parameters whose rejection is an API error like any other: a segment that is not UTF-8
//! once percent-decoded (`ippools/%FF%FE`) names no object, so it is a 404 in the error shape
//! rather than axum's plain-text 400.

use axum::{
    extract::{FromRequestParts, Path},
    http::request::Parts,
};
use serde::de::DeserializeOwned;

use super::ApiError;

pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(ApiPath(v)),
            Err(_) => Err(ApiError::NotFound {
                path: parts.uri.path().to_string(),
            }),
        }
    }
}
