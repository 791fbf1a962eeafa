//! Who may use the server: an optional access token (given once in the page
//! URL, then kept in a cookie; never logged) and, for the websocket, an
//! `Origin` allow-list that refuses cross-site connections.

use crate::metrics::Metrics;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

pub const TOKEN_COOKIE: &str = "vramlab_token";

#[derive(Clone, Debug, Default)]
pub struct Access {
    pub token: Option<String>,
    /// Origins allowed to open the websocket; empty: the server's own.
    pub allowed_origins: Vec<String>,
}

/// Compares without stopping at the first difference.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn query_token(req: &Request) -> Option<String> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "token").then(|| v.to_string())
    })
}

fn cookie_token(req: &Request) -> Option<String> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == TOKEN_COOKIE).then(|| v.to_string())
        })
}

impl Access {
    /// Whether a websocket from `origin` may connect to a server reached as `host`.
    pub fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        if self.allowed_origins.is_empty() {
            host.is_some_and(|h| {
                origin == format!("http://{h}") || origin == format!("https://{h}")
            })
        } else {
            self.allowed_origins.iter().any(|o| o == origin || o == "*")
        }
    }
}

/// What the guard needs: the rules, and the counter of refusals.
#[derive(Clone)]
pub struct Guard {
    pub access: Arc<Access>,
    pub metrics: Arc<Metrics>,
}

/// Checks the token on every request and the origin on the websocket.
pub async fn guard(State(state): State<Guard>, req: Request, next: Next) -> Response {
    let access = &state.access;
    let mut set_cookie = None;
    if let Some(token) = &access.token {
        if query_token(&req).is_some_and(|t| same(&t, token)) {
            set_cookie = Some(format!(
                "{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
            ));
        } else if !cookie_token(&req).is_some_and(|t| same(&t, token)) {
            return (
                StatusCode::UNAUTHORIZED,
                "401 Unauthorized: this vramlab server needs its access token; open the link you were given (it ends in ?token=...).\n",
            )
                .into_response();
        }
    }
    if req.uri().path() == "/ws" {
        if let Some(origin) = req
            .headers()
            .get(header::ORIGIN)
            .and_then(|o| o.to_str().ok())
        {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok());
            if !access.origin_allowed(origin, host) {
                Metrics::inc(&state.metrics.refused);
                return (
                    StatusCode::FORBIDDEN,
                    format!("403 Forbidden: websocket connections from {origin} are not allowed\n"),
                )
                    .into_response();
            }
        }
    }
    let mut response = next.run(req).await;
    if let Some(cookie) = set_cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_origin_by_default_and_allow_list_otherwise() {
        let a = Access::default();
        assert!(a.origin_allowed("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
        assert!(!a.origin_allowed("http://evil.example", Some("127.0.0.1:8080")));
        let a = Access {
            token: None,
            allowed_origins: vec!["https://class.example".into()],
        };
        assert!(a.origin_allowed("https://class.example", Some("x")));
        assert!(!a.origin_allowed("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
    }

    #[test]
    fn constant_time_compare() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
    }
}
