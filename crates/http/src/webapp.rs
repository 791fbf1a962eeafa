//! The built web app inside the binary: every build carries `dist/` as it
//! was when it was built (the build script rebuilds when it changes). Each file
//! goes out with its type; hashed assets are cached for good, `index.html`
//! is revalidated, and any other path gets `index.html` (the app's own
//! routes). scripts/build-web compresses the page's files once (`.br`,
//! `.gz` beside each): a browser that accepts brotli or gzip gets those
//! bytes.

use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

#[derive(rust_embed::RustEmbed)]
#[folder = "../../dist"]
#[allow_missing = true]
struct WebApp;

/// Whether this binary carries a built web app.
pub fn is_built() -> bool {
    WebApp::get("index.html").is_some()
}

/// The encodings a request accepts that a file was compressed in, best
/// first: the suffix of the compressed copy, and its `Content-Encoding`.
fn encodings(headers: &HeaderMap) -> impl Iterator<Item = (&'static str, &'static str)> {
    let accepts = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let accepted = move |name: &str| {
        accepts.split(',').any(|part| {
            let mut it = part.split(';');
            let coding = it.next().unwrap_or_default().trim();
            let refused = it.any(|q| {
                let q = q.trim().replace(' ', "");
                (q.strip_prefix("q=").and_then(|v| v.parse::<f32>().ok())) == Some(0.0)
            });
            coding == name && !refused
        })
    };
    [(".br", "br"), (".gz", "gzip")]
        .into_iter()
        .filter(move |(_, name)| accepted(name))
}

pub async fn serve(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, "GET, HEAD")],
            "the web app's files are read with GET",
        )
            .into_response();
    }
    let path = uri.path().trim_start_matches('/');
    // A folder named without its slash (`/plan`, `/snapshots`) goes to it
    // (its page's relative links need the slash), as a folder served from
    // disk does.
    if !path.is_empty()
        && !path.ends_with('/')
        && WebApp::get(&format!("{path}/index.html")).is_some()
    {
        let to = match uri.query() {
            Some(q) => format!("/{path}/?{q}"),
            None => format!("/{path}/"),
        };
        return (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, to)]).into_response();
    }
    // A folder's page (`/`, `/plan/`) is its index.html; any other path
    // that is not a file is the playground's (a lesson's link, say).
    let wanted = if path.is_empty() || path.ends_with('/') {
        format!("{path}index.html")
    } else {
        path.to_string()
    };
    // A file that is not there (a script, a wasm) is not found: only a
    // path without an extension can be one of the app's own routes.
    let route = !wanted.rsplit('/').next().unwrap_or_default().contains('.');
    if WebApp::get(&wanted).is_none() && !route && is_built() {
        return (StatusCode::NOT_FOUND, format!("/{path}: no such file")).into_response();
    }
    let found = WebApp::get(&wanted)
        .map(|f| (f, wanted))
        .or_else(|| WebApp::get("index.html").map(|f| (f, "index.html".to_string())));
    let Some((file, name)) = found else {
        return (
            StatusCode::NOT_FOUND,
            "this vramlab was built without its web app: run scripts/build-web, then build it again (or serve a built folder with --dist)",
        )
            .into_response();
    };
    let cache = if name.ends_with("index.html") {
        "no-cache"
    } else {
        "public, max-age=31536000, immutable"
    };
    let name = name.as_str();
    let compressed = encodings(&headers)
        .find_map(|(suffix, coding)| Some((WebApp::get(&format!("{name}{suffix}"))?, coding)));
    let mut response = match compressed {
        Some((packed, coding)) => {
            ([(header::CONTENT_ENCODING, coding)], packed.data).into_response()
        }
        None => file.data.into_response(),
    };
    let h = response.headers_mut();
    let types = [
        (header::CONTENT_TYPE, file.metadata.mimetype().to_string()),
        (header::CACHE_CONTROL, cache.to_string()),
        (header::VARY, "accept-encoding".to_string()),
    ];
    for (key, value) in types {
        if let Ok(value) = value.parse() {
            h.insert(key, value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(value: &str) -> Vec<&'static str> {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT_ENCODING, value.parse().unwrap());
        encodings(&headers).map(|(_, coding)| coding).collect()
    }

    /// Only GET and HEAD read the page; a script or wasm that is not there
    /// is not found (it got the page, as text/html, with 200).
    #[tokio::test]
    async fn other_methods_and_missing_files_are_said() {
        let get =
            |m: Method, path: &'static str| serve(m, Uri::from_static(path), HeaderMap::new());
        for m in [Method::POST, Method::PUT, Method::DELETE, Method::TRACE] {
            let r = get(m, "/").await;
            assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
            assert_eq!(r.headers()[header::ALLOW], "GET, HEAD");
        }
        for path in ["/missing.js", "/engine/none_bg.wasm"] {
            assert_eq!(
                get(Method::GET, path).await.status(),
                StatusCode::NOT_FOUND,
                "{path}"
            );
        }
        if is_built() {
            let r = get(Method::GET, "/lesson/3").await;
            assert_eq!(r.status(), StatusCode::OK);
        }
    }

    #[test]
    fn the_best_encoding_the_browser_accepts_comes_first() {
        assert_eq!(accepts("gzip, deflate, br, zstd"), ["br", "gzip"]);
        assert_eq!(accepts("gzip"), ["gzip"]);
        assert_eq!(accepts("br;q=0, gzip;q=0.5"), ["gzip"]);
        assert_eq!(accepts("br;q=0.0, gzip;q=0.000"), Vec::<&str>::new());
        assert_eq!(accepts("br;q=0.1"), ["br"]);
        assert_eq!(accepts("identity"), Vec::<&str>::new());
        assert!(encodings(&HeaderMap::new()).next().is_none());
    }
}
