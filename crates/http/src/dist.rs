//! `serve --dist FOLDER`: a built web app served from disk, as the binary
//! serves its own (`webapp`): any path without an extension is the app's
//! (its `index.html`), a file that is not there is not found, and nothing
//! outside the folder is ever served (a link in it that leads out is not
//! followed).

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The folder served, as the file system names it.
#[derive(Clone, Debug)]
pub struct Root(Arc<PathBuf>);

impl Root {
    pub fn new(dist: &Path) -> Root {
        Root(Arc::new(
            dist.canonicalize().unwrap_or_else(|_| dist.to_path_buf()),
        ))
    }

    /// Whether the request's path may go on to the files: it is inside
    /// the folder where it exists, and an app route where it does not.
    fn allows(&self, path: &str) -> bool {
        let decoded = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
        let relative = decoded.trim_start_matches('/');
        let on_disk = self.0.join(relative);
        match on_disk.canonicalize() {
            Ok(real) => real.starts_with(&*self.0),
            Err(_) => {
                let last = relative.rsplit('/').next().unwrap_or_default();
                !last.contains('.')
            }
        }
    }
}

/// Lets a request on to the folder's files, or answers 404.
pub async fn guard(State(root): State<Root>, req: Request, next: Next) -> Response {
    if root.allows(req.uri().path()) {
        return next.run(req).await;
    }
    (
        StatusCode::NOT_FOUND,
        format!("{}: no such file", req.uri().path()),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_inside_the_folder_and_app_routes_go_on() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "no").unwrap();
        let dist = tempfile::tempdir().unwrap();
        std::fs::write(dist.path().join("index.html"), "<h1>").unwrap();
        std::fs::create_dir(dist.path().join("plan")).unwrap();
        std::fs::write(dist.path().join("plan/app.js"), "").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(
            outside.path().join("secret.txt"),
            dist.path().join("out.txt"),
        )
        .unwrap();
        let root = Root::new(dist.path());
        assert!(root.allows("/"));
        assert!(root.allows("/plan/app.js"));
        assert!(root.allows("/lesson/3"));
        assert!(!root.allows("/missing.js"));
        assert!(!root.allows("/engine/vramlab_bg.wasm"));
        #[cfg(unix)]
        assert!(!root.allows("/out.txt"));
        assert!(!root.allows("/%2e%2e/secret.txt"));
    }
}
