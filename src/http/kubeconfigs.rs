//! `GET /v1/harvester/kubeconfigs`: the cloud-config accounts this service issued, as a steve-style
//! collection (`type: collection`, `data`, `revision`), paged with steve's `limit` and `continue`
//! (`pagination.next` is the next page's URL). Admins only; no token value is ever in it.

use axum::{
    Json,
    extract::{RawQuery, State},
};
use serde_json::{Value, json};

use super::{Admin, ApiError, AppState};
use crate::kubeconfig::accounts::{Accounts, ListQuery};

pub const KUBECONFIGS_PATH: &str = "/v1/harvester/kubeconfigs";
/// steve's type name of one account in the collection.
const ACCOUNT_TYPE: &str = "harvester.cloud-config-account";

pub async fn list(
    State(state): State<AppState>,
    _admin: Admin,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let query = ListQuery::parse(query.as_deref())?;
    let page = Accounts::new(state.store.clone()).list(&query).await?;
    let data = page
        .accounts
        .iter()
        .map(|a| {
            let mut v = serde_json::to_value(a).map_err(|e| ApiError::Encode {
                what: "cloud-config account",
                reason: e.to_string(),
            })?;
            if let Value::Object(fields) = &mut v {
                let id = format!("{}/{}", a.namespace, a.service_account);
                let mut out = serde_json::Map::new();
                out.insert("id".into(), Value::from(id));
                out.insert("type".into(), Value::from(ACCOUNT_TYPE));
                out.append(fields);
                return Ok(Value::Object(out));
            }
            Ok(v)
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let mut pagination = json!({ "limit": page.limit });
    let mut body = json!({
        "type": "collection",
        "resourceType": ACCOUNT_TYPE,
        "revision": page.revision,
    });
    if let Some(token) = &page.continue_token {
        // Namespaces are DNS labels and the token is base64url: neither needs escaping.
        let mut next = format!("{KUBECONFIGS_PATH}?limit={}&continue={token}", page.limit);
        if let Some(ns) = &query.namespace {
            next.push_str(&format!("&namespace={ns}"));
        }
        pagination["next"] = Value::from(next);
        body["continue"] = Value::from(token.as_str());
    }
    body["pagination"] = pagination;
    body["data"] = Value::from(data);
    Ok(Json(body))
}
