//! The capacity dashboard and GraphiQL, served from the binary: every file they load is
//! embedded here (`host/dashboard/`, its libraries pinned in `vendor/` by
//! `package-lock.json`), so a browser needs nothing but this server, air-gapped or not.
//! The pages hold no data: they ask `/graphql` with the key the user signs in with.
//!
//! `/` redirects to `/ui/`. Files are revalidated on every load (`no-cache` with an ETag),
//! so a new binary's files are never hidden behind a stale cache.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use sha2::{Digest as _, Sha256};

use crate::{App, Error};

/// Where the dashboard lives.
pub const UI_PATH: &str = "/ui/";

macro_rules! assets {
    ($($path:literal,)*) => {
        &[$(($path, include_bytes!(concat!("../dashboard/", $path)) as &[u8]),)*]
    };
}

/// Every embedded file by its path under `host/dashboard/`.
const FILES: &[(&str, &[u8])] = assets![
    "index.html",
    "graphiql.html",
    "app.css",
    "graphiql.css",
    "js/main.js",
    "js/api.js",
    "js/format.js",
    "js/overview.js",
    "js/timeline.js",
    "js/timeline-canvas.js",
    "js/reservations.js",
    "js/policies.js",
    "js/graphiql.js",
    "vendor/graphql-ws.min.js",
    "vendor/uPlot.iife.min.js",
    "vendor/uPlot.min.css",
    "vendor/react.production.min.js",
    "vendor/react-dom.production.min.js",
    "vendor/graphiql.min.js",
    "vendor/graphiql.min.css",
    "vendor/licenses/graphiql.LICENSE",
    "vendor/licenses/graphql-ws.LICENSE.md",
    "vendor/licenses/react.LICENSE",
    "vendor/licenses/react-dom.LICENSE",
    "vendor/licenses/uplot.LICENSE",
];

/// One embedded file, ready to serve.
struct Asset {
    body: &'static [u8],
    content_type: &'static str,
    etag: HeaderValue,
}

fn assets() -> &'static HashMap<&'static str, Asset> {
    static ASSETS: OnceLock<HashMap<&'static str, Asset>> = OnceLock::new();
    ASSETS.get_or_init(|| {
        FILES
            .iter()
            .map(|(path, body)| {
                let digest = Sha256::digest(body);
                let etag = format!("\"{}\"", hex::encode(&digest[..12]));
                let asset = Asset {
                    body,
                    content_type: content_type(path),
                    etag: HeaderValue::from_str(&etag).expect("hex is a valid header value"),
                };
                (*path, asset)
            })
            .collect()
    })
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("md") => "text/markdown; charset=utf-8",
        _ => "text/plain; charset=utf-8",
    }
}

/// `/` (a redirect), `/ui/` and the files under it.
pub fn router() -> Router<Arc<App>> {
    Router::new()
        .route("/", get(|| async { Redirect::to(UI_PATH) }))
        .route("/ui", get(|| async { Redirect::to(UI_PATH) }))
        .route(UI_PATH, get(|headers: HeaderMap| async move { serve("index.html", &headers) }))
        .route(
            "/ui/{*path}",
            get(|Path(path): Path<String>, headers: HeaderMap| async move {
                serve(&path, &headers)
            }),
        )
}

/// The GraphiQL page, for a browser's GET of `/graphql`.
pub fn graphiql(headers: &HeaderMap) -> Response {
    serve("graphiql.html", headers)
}

/// The embedded file at `path`: 304 when the browser holds this version, 404 when there
/// is none.
fn serve(path: &str, headers: &HeaderMap) -> Response {
    let Some(asset) = assets().get(path) else {
        return Error::NotFound(format!("no dashboard file {path}")).into_response();
    };
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|tag| tag == asset.etag);
    let status = if fresh {
        StatusCode::NOT_MODIFIED
    } else {
        StatusCode::OK
    };
    let body = if fresh { &[][..] } else { asset.body };
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (header::ETAG, asset.etag.clone()),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}
