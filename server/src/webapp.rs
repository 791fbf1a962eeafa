//! The built web app inside the binary: every build carries `dist/` as it
//! was when it was built (the build script rebuilds when it changes). Each file
//! goes out with its type; hashed assets are cached for good, `index.html`
//! is revalidated, and any other path gets `index.html` (the app's own
//! routes). scripts/build-web compresses the page's files once (`.br`,
//! `.gz` beside each): a browser that accepts brotli or gzip gets those
//! bytes.

use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

#[derive(rust_embed::RustEmbed)]
#[folder = "../dist"]
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
            let refused = it.any(|q| q.trim().replace(' ', "") == "q=0");
            coding == name && !refused
        })
    };
    [(".br", "br"), (".gz", "gzip")]
        .into_iter()
        .filter(move |(_, name)| accepted(name))
}

pub async fn serve(uri: Uri, headers: HeaderMap) -> Response {
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

    #[test]
    fn the_best_encoding_the_browser_accepts_comes_first() {
        assert_eq!(accepts("gzip, deflate, br, zstd"), ["br", "gzip"]);
        assert_eq!(accepts("gzip"), ["gzip"]);
        assert_eq!(accepts("br;q=0, gzip;q=0.5"), ["gzip"]);
        assert_eq!(accepts("identity"), Vec::<&str>::new());
        assert!(encodings(&HeaderMap::new()).next().is_none());
    }
}
