//! `vramlab serve`: the axum application. It serves the built web app and
//! `/healthz`.

use axum::extract::State;
use axum::routing::get;
use axum::Json;
pub use axum::Router;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use tower_http::services::{ServeDir, ServeFile};
use tower_http::trace::TraceLayer;
use vramlab_shared::device::DeviceInfo;

/// What `/healthz` answers.
#[derive(Clone, Debug, Serialize)]
pub struct Health {
    pub status: &'static str,
    pub version: &'static str,
    pub protocol_version: u32,
    /// `sim` or `cuda`.
    pub backend: &'static str,
    /// Why this backend was chosen.
    pub backend_reason: String,
    pub device: DeviceInfo,
}

#[derive(Clone)]
pub struct AppState {
    pub health: Arc<Health>,
}

/// The application: `/healthz`, then the web app's files, with
/// `index.html` for any other path (the app routes in the browser).
pub fn app(dist: &Path, state: AppState) -> Router {
    let index = ServeFile::new(dist.join("index.html"));
    Router::new()
        .route("/healthz", get(healthz))
        .fallback_service(ServeDir::new(dist).fallback(index))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Serves `router` on `listener` until the connection closes.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(listener, router).await
}

async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json((*state.health).clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    use vramlab_shared::protocol::PROTOCOL_VERSION;

    fn state() -> AppState {
        let backend = crate::backend::select(crate::backend::DeviceChoice::Sim).unwrap();
        let engine = backend.engine().unwrap();
        AppState {
            health: Arc::new(Health {
                status: "ok",
                version: env!("CARGO_PKG_VERSION"),
                protocol_version: PROTOCOL_VERSION,
                backend: backend.name,
                backend_reason: backend.reason.clone(),
                device: engine.device_info(),
            }),
        }
    }

    #[tokio::test]
    async fn healthz_names_version_and_device() {
        let dir = std::env::temp_dir();
        let resp = app(&dir, state())
            .oneshot(Request::get("/healthz").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["status"], "ok");
        assert_eq!(v["device"]["kind"], "simulated");
        assert_eq!(v["backend"], "sim");
        assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    }

    #[tokio::test]
    async fn serves_the_web_app_with_index_fallback() {
        let dir = std::env::temp_dir().join(format!("vramlab-dist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("index.html"), "<h1>vramlab</h1>").unwrap();
        for path in ["/", "/lesson/1"] {
            let resp = app(&dir, state())
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"<h1>vramlab</h1>");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
