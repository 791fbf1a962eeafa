//! `vramlab serve`: the axum application. `/ws` (the websocket), `/healthz`,
//! `/readyz`, `/metrics`, and the built web app, behind the access guard;
//! and the same three probes without it, for an internal admin port.

use crate::access::{guard, Access, Guard};
use crate::app::{AppState, Health};
use crate::metrics::Metrics;
use crate::session::{SessionConfig, Sessions};
use axum::extract::{Request, State};
use axum::routing::get;
use axum::Json;
pub use axum::Router;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tower_http::services::{ServeDir, ServeFile};
use tower_http::trace::TraceLayer;
use vramlab_backend::Backend;
use vramlab_shared::protocol::{Limits, PROTOCOL_VERSION};

/// Everything `serve` can be told (the command line fills it in).
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// A folder to serve the web app from; `None`: the one built in.
    pub dist: Option<PathBuf>,
    pub access: Access,
    pub limits: Limits,
    pub max_sessions: usize,
    /// The most sessions one client address may hold; 0: no limit.
    pub max_sessions_per_client: usize,
    /// The most watchers one session may have.
    pub max_watchers: usize,
    pub max_queue: usize,
    pub keepalive: crate::app::Keepalive,
    pub connections: crate::listener::ConnectionLimits,
    /// Behind a load balancer: the start of every id this server hands out.
    pub instance: Option<String>,
    /// On SIGTERM, how long sessions may run on (no new ones start) before
    /// the server stops them.
    pub drain: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            dist: None,
            // Tests and embedders serve on loopback.
            access: Access {
                local_only: true,
                ..Access::default()
            },
            limits: Limits {
                max_message_bytes: 64 * 1024,
                commands_per_second: 50,
                snapshot_interval_ms: 33,
                session_ttl_seconds: 300,
                session_quota_bytes: None,
            },
            max_sessions: 64,
            max_sessions_per_client: 8,
            max_watchers: 100,
            max_queue: 64,
            keepalive: crate::app::Keepalive::default(),
            connections: crate::listener::ConnectionLimits::default(),
            instance: None,
            drain: Duration::ZERO,
        }
    }
}

/// The application and its sessions.
pub struct Server {
    pub router: Router,
    /// `/healthz`, `/readyz` and `/metrics` with no token or host check:
    /// for probes and scrapers on an internal port (`--admin-addr`).
    pub admin: Router,
    pub sessions: Arc<Sessions>,
    pub connections: crate::listener::ConnectionLimits,
    /// On SIGTERM, how long sessions may run on (no new ones start) before
    /// the server stops them.
    pub drain: Duration,
}

pub fn build(options: &ServeOptions, backend: Backend) -> anyhow::Result<Server> {
    let engine = backend.engine()?;
    let health = Health {
        status: "ok",
        version: env!("CARGO_PKG_VERSION"),
        protocol_version: PROTOCOL_VERSION,
        backend: backend.name,
        backend_reason: backend.reason.clone(),
        device: engine.device_info(),
    };
    let config = SessionConfig {
        ttl: Duration::from_secs(options.limits.session_ttl_seconds),
        snapshot_interval: Duration::from_millis(options.limits.snapshot_interval_ms),
        max_queue: options.max_queue,
        max_sessions: options.max_sessions,
        max_per_client: options.max_sessions_per_client,
        max_watchers: options.max_watchers,
        quota: options.limits.session_quota_bytes,
        limits: options.limits.clone(),
        instance: options.instance.clone(),
    };
    let sessions = Arc::new(Sessions::new(backend, config, Arc::new(Metrics::default())));
    let state = AppState {
        health: Arc::new(health),
        sessions: sessions.clone(),
        access: Arc::new(options.access.clone()),
        limits: options.limits.clone(),
        keepalive: options.keepalive,
        heavy: crate::heavy::Heavy::default(),
    };
    let admin = probes().with_state(state.clone());
    let router = probes().route("/ws", get(crate::ws::ws_handler));
    let router = match &options.dist {
        Some(dist) => router.fallback_service(
            tower::ServiceBuilder::new()
                .layer(axum::middleware::from_fn_with_state(
                    crate::dist::Root::new(dist),
                    crate::dist::guard,
                ))
                .service(
                    ServeDir::new(dist)
                        .precompressed_br()
                        .precompressed_gzip()
                        .fallback(
                            ServeFile::new(dist.join("index.html"))
                                .precompressed_br()
                                .precompressed_gzip(),
                        ),
                ),
        ),
        None => router.fallback(crate::webapp::serve),
    };
    let router = router
        .layer(axum::middleware::from_fn_with_state(
            Guard {
                access: state.access.clone(),
                metrics: state.sessions.metrics.clone(),
                guesses: Arc::default(),
            },
            guard,
        ))
        // Log the path only: the query may carry the access token.
        .layer(TraceLayer::new_for_http().make_span_with(|req: &Request| {
            tracing::info_span!("http", method = %req.method(), path = %req.uri().path())
        }))
        .with_state(state);
    let connections = options.connections.clone();
    Ok(Server {
        router,
        admin,
        sessions,
        connections,
        drain: options.drain,
    })
}

/// Serves until the listener closes, dropping expired sessions meanwhile.
pub async fn serve(listener: tokio::net::TcpListener, server: Server) -> std::io::Result<()> {
    serve_until(listener, server, std::future::pending()).await
}

/// How long running commands get to answer when the server stops.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves until `shutdown` completes; then running commands are stopped
/// and answered (within [`SHUTDOWN_GRACE`]), every session ends, and its
/// connections close with 1001 (going away).
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    server: Server,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let sessions = server.sessions.clone();
    let reaper = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tick.tick().await;
            sessions.reap();
        }
    });
    let sessions = server.sessions.clone();
    let drain_for = server.drain;
    // Small messages go out at once (no Nagle delay behind a result).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let listener = crate::listener::Capped::new(listener, server.connections);
    let app = server
        .router
        .into_make_service_with_connect_info::<crate::listener::Peer>();
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            drain(&sessions, drain_for).await;
            let drain = move || sessions.drain_and_shut_down(SHUTDOWN_GRACE);
            let _ = tokio::task::spawn_blocking(drain).await;
        })
        .await;
    reaper.abort();
    server.sessions.shut_down_all();
    result
}

/// Draining: no new sessions, `/readyz` 503, until every session has
/// ended (its owner left and its TTL passed) or `limit` has passed.
async fn drain(sessions: &Sessions, limit: Duration) {
    if limit.is_zero() {
        return;
    }
    sessions.start_draining();
    tracing::info!(sessions = sessions.len(), "draining: no new sessions");
    let deadline = tokio::time::Instant::now() + limit;
    while !sessions.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn probes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json((*state.health).clone())
}

/// 200 while new sessions may start here; 503 while draining (a load
/// balancer sends new clients elsewhere, reconnects still come here).
async fn readyz(State(state): State<AppState>) -> (axum::http::StatusCode, &'static str) {
    if state.sessions.is_draining() {
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else {
        (axum::http::StatusCode::OK, "ready\n")
    }
}

async fn metrics(State(state): State<AppState>) -> String {
    state.sessions.metrics.render(state.sessions.gauges())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn router(dist: &std::path::Path, token: Option<&str>) -> Router {
        let backend = vramlab_backend::select(vramlab_backend::DeviceChoice::Sim, 0).unwrap();
        let options = ServeOptions {
            dist: Some(dist.to_path_buf()),
            access: Access {
                token: token.map(str::to_string),
                ..Access::default()
            },
            ..ServeOptions::default()
        };
        build(&options, backend).unwrap().router
    }

    async fn get(router: Router, path: &str) -> (StatusCode, String, Option<String>) {
        let resp = router
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let cookie = resp
            .headers()
            .get("set-cookie")
            .map(|c| c.to_str().unwrap().to_string());
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned(), cookie)
    }

    #[tokio::test]
    async fn healthz_names_version_and_device() {
        let (status, body, _) = get(router(&std::env::temp_dir(), None), "/healthz").await;
        assert_eq!(status, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
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
            let (status, body, _) = get(router(&dir, None), path).await;
            assert_eq!(status, StatusCode::OK, "{path}");
            assert_eq!(body, "<h1>vramlab</h1>");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_token_is_required_then_kept_in_a_cookie() {
        let dir = std::env::temp_dir();
        let (status, body, _) = get(router(&dir, Some("s3cret")), "/healthz").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(!body.contains("s3cret"));
        let (status, _, _) = get(router(&dir, Some("s3cret")), "/healthz?token=wrong").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _, cookie) = get(router(&dir, Some("s3cret")), "/healthz?token=s3cret").await;
        assert_eq!(status, StatusCode::OK);
        let cookie = cookie.unwrap();
        assert!(cookie.starts_with("vramlab_token=s3cret;") && cookie.contains("HttpOnly"));
        let resp = router(&dir, Some("s3cret"))
            .oneshot(
                Request::get("/metrics")
                    .header("cookie", "other=1; vramlab_token=s3cret")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }

    /// `/metrics` counts refusals by reason; behind HTTPS the token cookie
    /// is `Secure`.
    #[tokio::test]
    async fn refusals_are_counted_by_reason_and_the_cookie_follows_https() {
        let app = router(&std::env::temp_dir(), Some("s3cret"));
        let (status, _, _) = get(app.clone(), "/healthz?token=wrong").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (_, body, _) = get(app.clone(), "/metrics?token=s3cret").await;
        assert!(
            body.contains("vramlab_refused_total{reason=\"token\"} 1\n"),
            "{body}"
        );
        assert!(
            body.contains("vramlab_refused_total{reason=\"host\"} 0\n"),
            "{body}"
        );
        let resp = app
            .oneshot(
                Request::get("/healthz?token=s3cret")
                    .header("x-forwarded-proto", "https")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let cookie = resp.headers()["set-cookie"].to_str().unwrap().to_string();
        assert!(cookie.ends_with("SameSite=Strict; Secure"), "{cookie}");
    }

    #[tokio::test]
    async fn metrics_are_prometheus_text() {
        let (status, body, _) = get(router(&std::env::temp_dir(), None), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.contains("# TYPE vramlab_sessions gauge\nvramlab_sessions 0\n"),
            "{body}"
        );
        assert!(body.contains("vramlab_commands_total 0"));
    }
}
