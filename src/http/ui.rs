//! The web console, `/ui/`: plain HTML, CSS and JavaScript modules from `ui/`, compiled into the
//! binary (so `cargo build` alone produces it and it cannot drift from the binary's API). The
//! console runs in the browser and calls the documented API on the same origin with the admin
//! token the user enters; the assets themselves hold nothing secret and need no token.
//!
//! Every asset is served with a strict Content-Security-Policy (scripts and styles from this
//! origin only, no inline code, no frames, DOM writes through text only), `nosniff`, and
//! `Cache-Control: no-cache` with a strong ETag of its content: browsers revalidate on every load
//! (a 304 when nothing changed) and so never run an old console against a new binary.

use std::sync::LazyLock;

use axum::{
    extract::OriginalUri,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Redirect, Response},
    routing::get,
};
use sha2::{Digest, Sha256};

use super::{ApiError, path::ApiPath};

/// `/ui` itself redirects here, so that the assets' relative URLs resolve under `/ui/`.
pub const INDEX_PATH: &str = "/ui/";
pub const BARE_PATH: &str = "/ui";
pub const ASSET_PATH: &str = "/ui/{asset}";

/// The policy every console response carries. `require-trusted-types-for 'script'` makes the
/// browser refuse any HTML string written into the DOM (`innerHTML` and the like), so data from
/// the API can only ever become text.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; \
    form-action 'self'; frame-ancestors 'none'; require-trusted-types-for 'script'; \
    trusted-types 'none'";

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $type:literal) => {
        Asset {
            name: $name,
            content_type: $type,
            body: include_bytes!(concat!("../../ui/", $name)),
        }
    };
}

/// Every file of `ui/` (a test checks that none is missing and that openapi.yaml lists them).
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("app.js", "text/javascript; charset=utf-8"),
    asset!("api.js", "text/javascript; charset=utf-8"),
    asset!("dom.js", "text/javascript; charset=utf-8"),
    asset!("ip.js", "text/javascript; charset=utf-8"),
    asset!("model.js", "text/javascript; charset=utf-8"),
    asset!("pools.js", "text/javascript; charset=utf-8"),
    asset!("loadbalancers.js", "text/javascript; charset=utf-8"),
    asset!("guests.js", "text/javascript; charset=utf-8"),
    asset!("cloudconfigs.js", "text/javascript; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
];

/// The names of the assets, in the order served.
pub fn asset_names() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|a| a.name)
}

/// Each asset's strong ETag (a SHA-256 of its bytes), computed once.
static ETAGS: LazyLock<Vec<HeaderValue>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let digest = Sha256::digest(a.body);
            HeaderValue::from_str(&format!("\"{}\"", hex::encode(&digest[..16])))
                .expect("hex is a valid header value")
        })
        .collect()
});

/// Whether `If-None-Match` names this ETag (or is `*`).
fn not_modified(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let Some(etag) = etag.to_str().ok() else {
        return false;
    };
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == "*" || tag == etag)
}

fn security_headers(headers: &mut HeaderMap) {
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-cache"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    for (name, value) in [
        ("cross-origin-opener-policy", "same-origin"),
        ("cross-origin-resource-policy", "same-origin"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

fn serve(index: usize, request: &HeaderMap) -> Response {
    let asset = &ASSETS[index];
    let etag = ETAGS[index].clone();
    let mut response = if not_modified(request, &etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            )],
            asset.body,
        )
            .into_response()
    };
    let headers = response.headers_mut();
    headers.insert(header::ETAG, etag);
    security_headers(headers);
    response
}

/// The console's routes (no token: the assets are public; the API calls they make are not).
pub(super) fn routes(routes: super::Routes) -> super::Routes {
    routes
        .add(BARE_PATH, &["GET"], get(bare))
        .add(INDEX_PATH, &["GET"], get(index))
        .add(ASSET_PATH, &["GET"], get(asset))
}

/// `GET /ui/`: the console's page.
pub async fn index(headers: HeaderMap) -> Response {
    serve(0, &headers)
}

/// `GET /ui`: to `/ui/`, where the page's relative asset URLs resolve.
pub async fn bare() -> Redirect {
    Redirect::permanent(INDEX_PATH)
}

/// `GET /ui/{asset}`: one file of the console.
pub async fn asset(
    ApiPath(name): ApiPath<String>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let index = ASSETS
        .iter()
        .position(|a| a.name == name)
        .ok_or_else(|| ApiError::NoAsset {
            path: uri.path().to_string(),
        })?;
    Ok(serve(index, &headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_headers(if_none_match: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_str(if_none_match).unwrap(),
        );
        h
    }

    #[test]
    fn if_none_match_matches_the_etag_in_a_list_weakly_or_as_a_star() {
        let etag = HeaderValue::from_static("\"abc\"");
        assert!(not_modified(&mk_headers("\"abc\""), &etag));
        assert!(not_modified(&mk_headers("\"x\", W/\"abc\""), &etag));
        assert!(not_modified(&mk_headers("*"), &etag));
        assert!(!not_modified(&mk_headers("\"abcd\""), &etag));
        assert!(!not_modified(&HeaderMap::new(), &etag));
    }

    #[test]
    fn every_file_of_ui_is_served_and_the_etags_differ() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/ui");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        on_disk.sort();
        let mut served: Vec<String> = asset_names().map(String::from).collect();
        served.sort();
        assert_eq!(served, on_disk, "ui/ and ASSETS must list the same files");
        let mut etags: Vec<&HeaderValue> = ETAGS.iter().collect();
        etags.sort_by_key(|v| v.as_bytes());
        etags.dedup();
        assert_eq!(etags.len(), ASSETS.len());
    }

    #[test]
    fn an_asset_carries_its_type_the_policy_and_its_etag_and_revalidates_to_304() {
        let at = asset_names().position(|n| n == "app.js").unwrap();
        let first = serve(at, &HeaderMap::new());
        assert_eq!(first.status(), StatusCode::OK);
        let h = first.headers();
        assert_eq!(h[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        assert_eq!(h[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY);
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(h[header::CACHE_CONTROL], "no-cache");
        let etag = h[header::ETAG].to_str().unwrap().to_string();
        let again = serve(at, &mk_headers(&etag));
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(again.headers()[header::ETAG].to_str().unwrap(), etag);
        assert!(again.headers().get(header::CONTENT_TYPE).is_none());
        assert_eq!(serve(at, &mk_headers("\"other\"")).status(), StatusCode::OK);
    }

    #[test]
    fn the_policy_allows_nothing_inline_nor_foreign() {
        for directive in [
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self'",
            "frame-ancestors 'none'",
            "object-src 'none'",
        ] {
            assert!(CONTENT_SECURITY_POLICY.contains(directive), "{directive}");
        }
        for loose in ["unsafe-", "data:", "blob:", "*", "http"] {
            assert!(!CONTENT_SECURITY_POLICY.contains(loose), "{loose}");
        }
    }

    #[test]
    fn openapi_lists_exactly_the_assets() {
        let spec: serde_json::Value =
            yaml_serde::from_str(include_str!("../../openapi/openapi.yaml")).unwrap();
        let listed: Vec<&str> = spec["paths"]["/ui/{asset}"]["parameters"][0]["schema"]["enum"]
            .as_array()
            .expect("the asset parameter is an enum")
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(listed, asset_names().collect::<Vec<_>>());
    }
}
