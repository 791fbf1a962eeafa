//! Who may use the server: an optional access token (given once in the page
//! URL, then kept in a cookie; never logged), the `Host` names it answers to
//! (a loopback server answers only to loopback names, so a DNS-rebound page
//! cannot reach it), and, for the websocket, an `Origin` allow-list that
//! refuses cross-site connections. Behind an authenticating reverse proxy,
//! the user it names in a header (only when the request comes from one of
//! the configured proxy addresses).

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
    pub allowed_hosts: AllowedHosts,
    /// The header an authenticating proxy names the user in (lower case);
    /// `None`: users are not known.
    pub user_header: Option<String>,
    /// The proxies whose user header is believed: addresses or networks.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The server listens on loopback alone: its clients are this
    /// machine's users, not limited per address (a server others reach
    /// counts loopback too: a proxy there speaks for everyone).
    pub local_only: bool,
}

/// The longest user name taken from a proxy header.
const MAX_USER: usize = 256;

/// The `Host` names (without port) the server answers to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AllowedHosts {
    /// A server on the network, reached by whatever name.
    #[default]
    Any,
    /// Only these (compared without case).
    Only(Vec<String>),
}

/// The names a loopback address is reached by.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

impl AllowedHosts {
    /// For a server listening on `addr`: loopback names (and `extra`) for a
    /// loopback address; `extra` alone, or any name, otherwise.
    pub fn for_listener(addr: std::net::SocketAddr, extra: &[String]) -> Self {
        let mut names: Vec<String> = extra.iter().map(|h| h.to_ascii_lowercase()).collect();
        if addr.ip().is_loopback() {
            names.extend(LOOPBACK_HOSTS.iter().map(|h| h.to_string()));
        } else if names.is_empty() {
            return AllowedHosts::Any;
        }
        AllowedHosts::Only(names)
    }

    /// Whether a request's `Host` header (with or without a port) is one.
    pub fn allows(&self, host: Option<&str>) -> bool {
        let AllowedHosts::Only(names) = self else {
            return true;
        };
        let Some(host) = host else {
            return false;
        };
        let name = match host.rfind(':') {
            Some(i) if !host[i..].contains(']') => &host[..i],
            _ => host,
        };
        names.iter().any(|n| n.eq_ignore_ascii_case(name))
    }
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

/// Whether a proxy in front says the client spoke HTTPS.
fn behind_https(req: &Request) -> bool {
    req.headers()
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"))
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
    /// The user a request comes from: `Ok(None)` when the server does not
    /// know users; the proxy's header when the request comes through a
    /// trusted proxy; refused otherwise (a request around the proxy, or
    /// one the proxy did not authenticate).
    pub fn user(
        &self,
        headers: &axum::http::HeaderMap,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Option<String>, String> {
        let Some(name) = &self.user_header else {
            return Ok(None);
        };
        if !peer.is_some_and(|p| self.trusted_proxies.iter().any(|n| n.contains(&p))) {
            return Err("this server takes its users from an authenticating proxy, and this request did not come through it".into());
        }
        // One header, one name: a second header or a list means a client's
        // value reached the proxy's (one appends rather than replaces).
        let mut values = headers.get_all(name.as_str()).iter();
        let (first, more) = (values.next(), values.next().is_some());
        if more {
            return Err(format!(
                "the proxy sent {name} more than once: one user per request"
            ));
        }
        // Surrounding blanks are not part of a header's value (RFC 9110).
        let user = first.and_then(|v| v.to_str().ok()).map(str::trim);
        match user {
            Some(u) if u.contains(',') => Err(format!(
                "the proxy's {name} names several users: one user per request"
            )),
            Some(u) if !u.is_empty() && u.len() <= MAX_USER && !u.chars().any(char::is_control) => {
                Ok(Some(u.to_string()))
            }
            _ => Err(format!("the proxy sent no user in {name}")),
        }
    }

    /// The client a request comes from, as the per-address limits count
    /// it: behind a trusted proxy, the address that proxy saw (the last
    /// `X-Forwarded-For` entry, the one it added); otherwise the peer's;
    /// none for this machine's users of a server that listens on loopback
    /// alone.
    pub fn client(
        &self,
        headers: &axum::http::HeaderMap,
        peer: Option<std::net::IpAddr>,
    ) -> Option<std::net::IpAddr> {
        let peer = peer.filter(|p| !(self.local_only && p.is_loopback()))?;
        if !self.trusted_proxies.iter().any(|n| n.contains(&peer)) {
            return Some(peer);
        }
        let forwarded = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .last()
            .and_then(|ip| ip.trim().parse().ok());
        Some(forwarded.unwrap_or(peer))
    }

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
    pub guesses: Arc<TokenGuesses>,
}

/// Wrong tokens per client (an IPv4 address, an IPv6 /64): past
/// [`TokenGuesses::LIMIT`] in a [`TokenGuesses::WINDOW`], that client gets
/// 429 until the window ends, the right token too (were it let through, a
/// guesser would tell it from a wrong one at full speed); loopback too;
/// behind a trusted proxy, the address it forwards.
#[derive(Debug, Default)]
pub struct TokenGuesses {
    failures:
        std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, (u32, std::time::Instant)>>,
}

impl TokenGuesses {
    pub const LIMIT: u32 = 10;
    pub const WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

    /// Whether `ip` may try a token now.
    fn allowed(&self, ip: std::net::IpAddr, now: std::time::Instant) -> bool {
        let failures = self.failures.lock().expect("guesses lock");
        failures
            .get(&ip)
            .is_none_or(|&(n, since)| n < Self::LIMIT || now.duration_since(since) >= Self::WINDOW)
    }

    /// A wrong token from `ip`.
    fn failed(&self, ip: std::net::IpAddr, now: std::time::Instant) {
        let mut failures = self.failures.lock().expect("guesses lock");
        if failures.len() > 10_000 {
            failures.retain(|_, &mut (_, since)| now.duration_since(since) < Self::WINDOW);
        }
        let entry = failures.entry(ip).or_insert((0, now));
        if now.duration_since(entry.1) >= Self::WINDOW {
            *entry = (0, now);
        }
        entry.0 += 1;
    }
}

/// The client's address ([`Access::client`]: behind a trusted proxy, the
/// one it forwards).
fn client_ip(access: &Access, req: &Request) -> Option<std::net::IpAddr> {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<crate::listener::Peer>>()
        .map(|c| c.0 .0.ip());
    access.client(req.headers(), peer)
}

/// Checks the token on every request and the origin on the websocket.
pub async fn guard(State(state): State<Guard>, req: Request, next: Next) -> Response {
    let access = &state.access;
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    if !access.allowed_hosts.allows(host) {
        Metrics::inc(&state.metrics.refused.host);
        return (
            StatusCode::FORBIDDEN,
            format!(
                "403 Forbidden: this vramlab server does not answer to the host {}; start it with --allowed-host to add a name\n",
                host.unwrap_or("(none)")
            ),
        )
            .into_response();
    }
    let mut set_cookie = None;
    if let Some(token) = &access.token {
        let ip = client_ip(access, &req).map(crate::network::client_key);
        let now = std::time::Instant::now();
        if ip.is_some_and(|ip| !state.guesses.allowed(ip, now)) {
            Metrics::inc(&state.metrics.refused.token);
            return (
                StatusCode::TOO_MANY_REQUESTS,
                "429 Too Many Requests: too many wrong access tokens from your address; wait a minute\n",
            )
                .into_response();
        }
        if query_token(&req).is_some_and(|t| same(&t, token)) {
            // Behind a TLS-terminating proxy the cookie is sent over HTTPS only.
            let secure = if behind_https(&req) { "; Secure" } else { "" };
            set_cookie = Some(format!(
                "{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}"
            ));
        } else if !cookie_token(&req).is_some_and(|t| same(&t, token)) {
            Metrics::inc(&state.metrics.refused.token);
            if let Some(ip) = ip {
                state.guesses.failed(ip, now);
            }
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
                Metrics::inc(&state.metrics.refused.origin);
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
            allowed_origins: vec!["https://class.example".into()],
            ..Access::default()
        };
        assert!(a.origin_allowed("https://class.example", Some("x")));
        assert!(!a.origin_allowed("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
    }

    /// DNS rebinding: a page at `evil.example:8080` whose name now points at
    /// 127.0.0.1 sends `Host: evil.example:8080` (and a matching `Origin`).
    #[test]
    fn a_loopback_server_answers_only_to_loopback_names() {
        let lo = AllowedHosts::for_listener("127.0.0.1:8080".parse().unwrap(), &[]);
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(lo.allows(Some(ok)), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "evil.example",
            "127.0.0.1.evil.example:8080",
        ] {
            assert!(!lo.allows(Some(bad)), "{bad}");
        }
        assert!(!lo.allows(None));
        let all: std::net::SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(AllowedHosts::for_listener(all, &[]), AllowedHosts::Any);
        let lab = AllowedHosts::for_listener(all, &["Lab.Example".into()]);
        assert!(lab.allows(Some("lab.example:8080")));
        assert!(!lab.allows(Some("evil.example:8080")));
    }

    #[test]
    fn wrong_tokens_from_one_address_are_throttled_for_a_window() {
        let guesses = TokenGuesses::default();
        let (a, b): (std::net::IpAddr, std::net::IpAddr) = (
            "203.0.113.9".parse().unwrap(),
            "198.51.100.2".parse().unwrap(),
        );
        let t0 = std::time::Instant::now();
        for _ in 0..TokenGuesses::LIMIT {
            assert!(guesses.allowed(a, t0));
            guesses.failed(a, t0);
        }
        assert!(!guesses.allowed(a, t0));
        assert!(guesses.allowed(b, t0));
        assert!(guesses.allowed(a, t0 + TokenGuesses::WINDOW));
    }

    /// One user per request from the proxy: a repeated header or a list
    /// is refused (the first value won, and `alice, bob` was one name);
    /// blanks around a value are not part of it.
    #[test]
    fn the_proxys_user_header_names_exactly_one_user() {
        let a = Access {
            user_header: Some("x-forwarded-user".into()),
            trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
            ..Access::default()
        };
        let proxy = Some("127.0.0.1".parse().unwrap());
        let user = |values: &[&str]| {
            let mut h = axum::http::HeaderMap::new();
            for v in values {
                h.append("x-forwarded-user", v.parse().unwrap());
            }
            a.user(&h, proxy)
        };
        assert_eq!(user(&["alice"]), Ok(Some("alice".into())));
        assert_eq!(user(&[" alice "]), Ok(Some("alice".into())));
        assert!(user(&["alice", "bob"])
            .unwrap_err()
            .contains("more than once"));
        assert!(user(&["alice, bob"]).unwrap_err().contains("several users"));
        assert!(user(&[]).unwrap_err().contains("no user"));
        assert!(user(&["  "]).unwrap_err().contains("no user"));
    }

    /// Who the per-address limits count: this machine's users of a
    /// loopback server are not counted; on a server others reach, loopback
    /// is a client like any other; behind a trusted proxy, the address it
    /// forwards (the last entry, the one it added; a client's own entries
    /// before it are not believed), never from an untrusted peer.
    #[test]
    fn the_client_is_the_peer_or_what_a_trusted_proxy_forwards() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let forwarded = |v: &str| {
            let mut h = axum::http::HeaderMap::new();
            h.insert("x-forwarded-for", v.parse().unwrap());
            h
        };
        let none = axum::http::HeaderMap::new();
        let local = Access {
            local_only: true,
            ..Access::default()
        };
        assert_eq!(local.client(&none, Some(ip("127.0.0.1"))), None);
        assert_eq!(local.client(&none, Some(ip("::1"))), None);
        let public = Access::default();
        assert_eq!(
            public.client(&none, Some(ip("127.0.0.1"))),
            Some(ip("127.0.0.1"))
        );
        let spoofed = forwarded("198.51.100.1");
        assert_eq!(
            public.client(&spoofed, Some(ip("203.0.113.9"))),
            Some(ip("203.0.113.9"))
        );
        let proxied = Access {
            trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
            ..Access::default()
        };
        let chain = forwarded("198.51.100.1, 203.0.113.5");
        assert_eq!(
            proxied.client(&chain, Some(ip("127.0.0.1"))),
            Some(ip("203.0.113.5"))
        );
        assert_eq!(
            proxied.client(&none, Some(ip("127.0.0.1"))),
            Some(ip("127.0.0.1"))
        );
    }

    #[test]
    fn constant_time_compare() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
    }
}
