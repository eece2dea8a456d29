//! What the browser loads, embedded in the binary so that the dashboard works offline: the page, its script and
//! style, and uPlot (MIT, vendored from its npm package by `vendor/fetch-uplot.sh`, which checks the tarball's
//! sha256). Each is served with an ETag: a browser revalidates and gets a 304 instead of the bytes again.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The page; `{{query}}` in its asset links becomes the token query (`?token=...`) the page was opened with, so that
/// the browser's requests for the assets pass the same guard.
const PAGE: &str = include_str!("page/index.html");

/// One embedded file, served at `/ui/assets/<name>`.
pub struct Asset {
    pub name: &'static str,
    pub content_type: &'static str,
    pub body: &'static str,
}

/// Every asset the page links.
pub const ASSETS: [Asset; 4] = [
    Asset {
        name: "dashboard.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("page/dashboard.js"),
    },
    Asset {
        name: "dashboard.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("page/dashboard.css"),
    },
    Asset {
        name: "uPlot.iife.min.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("vendor/uPlot.iife.min.js"),
    },
    Asset {
        name: "uPlot.min.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("vendor/uPlot.min.css"),
    },
];

/// The page, its asset links carrying `?token=` when the request did.
pub fn page(query: &HashMap<String, String>) -> Response {
    let carried = query
        .get("token")
        .map(|t| format!("?token={}", percent_encoded(t)))
        .unwrap_or_default();
    let body = PAGE.replace("{{query}}", &carried);
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// The asset `name`, or 404; 304 when the request's `If-None-Match` is its ETag.
pub fn asset(name: &str, headers: &HeaderMap) -> Response {
    let Some(asset) = ASSETS.iter().find(|a| a.name == name) else {
        return (StatusCode::NOT_FOUND, format!("no dashboard asset '{name}'\n")).into_response();
    };
    let etag = etag(asset.body);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let cached = [
        (header::ETAG, etag.clone()),
        (header::CACHE_CONTROL, "no-cache".to_string()),
    ];
    if fresh {
        return (StatusCode::NOT_MODIFIED, cached).into_response();
    }
    (cached, [(header::CONTENT_TYPE, asset.content_type)], asset.body).into_response()
}

/// A strong ETag of `body`: its hash, the same for the same binary.
fn etag(body: &str) -> String {
    let mut hasher = std::hash::DefaultHasher::new();
    body.hash(&mut hasher);
    format!("\"{:016x}\"", hasher.finish())
}

/// `text` with every byte but ASCII letters, digits and `-._~` percent-encoded: safe in a URL and in HTML.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_its_assets_weigh_under_200_kb() {
        let total = PAGE.len() + ASSETS.iter().map(|a| a.body.len()).sum::<usize>();
        assert!(total < 200_000, "{total} bytes");
        for asset in &ASSETS {
            assert!(
                PAGE.contains(&format!("/ui/assets/{}{{{{query}}}}", asset.name)),
                "the page links {}",
                asset.name
            );
        }
    }

    #[test]
    fn the_token_is_carried_encoded_into_the_asset_links() {
        let query: HashMap<String, String> = [("token".to_string(), "a b&\"<".to_string())].into();
        let response = page(&query);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(percent_encoded("a b&\"<"), "a%20b%26%22%3C");
    }

    #[test]
    fn an_asset_revalidates_by_etag() {
        let first = asset("dashboard.js", &HeaderMap::new());
        assert_eq!(first.status(), StatusCode::OK);
        let tag = first.headers()[header::ETAG].clone();
        let mut again = HeaderMap::new();
        again.insert(header::IF_NONE_MATCH, tag);
        assert_eq!(asset("dashboard.js", &again).status(), StatusCode::NOT_MODIFIED);
        assert_eq!(asset("nope.js", &HeaderMap::new()).status(), StatusCode::NOT_FOUND);
    }
}
