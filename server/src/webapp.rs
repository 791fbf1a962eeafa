//! The built web app inside the binary: every build carries `dist/` as it
//! was when it was built (the build script rebuilds when it changes). Each file
//! goes out with its type; hashed assets are cached for good, `index.html`
//! is revalidated, and any other path gets `index.html` (the app's own
//! routes).

use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

#[derive(rust_embed::RustEmbed)]
#[folder = "../dist"]
#[allow_missing = true]
struct WebApp;

/// Whether this binary carries a built web app.
pub fn is_built() -> bool {
    WebApp::get("index.html").is_some()
}

pub async fn serve(uri: Uri) -> Response {
    let path = uri.path().trim_start_matches('/');
    let found = (!path.is_empty())
        .then(|| WebApp::get(path).map(|f| (f, false)))
        .flatten()
        .or_else(|| WebApp::get("index.html").map(|f| (f, true)));
    let Some((file, is_index)) = found else {
        return (
            StatusCode::NOT_FOUND,
            "this vramlab was built without its web app: run scripts/build-web, then build it again (or serve a built folder with --dist)",
        )
            .into_response();
    };
    let cache = if is_index {
        "no-cache"
    } else {
        "public, max-age=31536000, immutable"
    };
    (
        [
            (header::CONTENT_TYPE, file.metadata.mimetype().to_string()),
            (header::CACHE_CONTROL, cache.to_string()),
        ],
        file.data,
    )
        .into_response()
}
