//! Users behind an authenticating reverse proxy (`--user-header`,
//! `--trusted-proxy`): the test client plays the proxy on loopback. A
//! session belongs to the user who made it, others may only watch it, the
//! owner hears who watches, and requests around the proxy are refused.

mod socket;

use serde_json::json;
use socket::{next, Socket};
use tokio::net::TcpStream;
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use vramlab_backend::{select, DeviceChoice};
use vramlab_http::http::{build, serve, ServeOptions};

const HEADER: &str = "x-forwarded-user";

async fn start(trusted: &str, max_per_user: usize) -> String {
    let mut options = ServeOptions::default();
    options.access.user_header = Some(HEADER.into());
    options.access.trusted_proxies = vec![trusted.parse::<std::net::IpAddr>().unwrap().into()];
    options.max_sessions_per_client = max_per_user;
    let server = build(&options, select(DeviceChoice::Sim, 0).unwrap()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { serve(listener, server).await });
    addr.to_string()
}

/// Connects as `user` (no header when `None`); the refusal's text on error.
async fn connect(addr: &str, query: &str, user: Option<&str>) -> Result<Socket, String> {
    let mut request = format!("ws://{addr}/ws{query}")
        .into_client_request()
        .unwrap();
    if let Some(user) = user {
        request.headers_mut().insert(HEADER, user.parse().unwrap());
    }
    // Bounded: a stalled handshake fails here, named, instead of hanging.
    tokio::time::timeout(std::time::Duration::from_secs(30), connect_async(request))
        .await
        .unwrap_or_else(|_| panic!("no websocket handshake in 30 s for {user:?} {query}"))
        .map(|(ws, _)| ws)
        .map_err(|e| e.to_string())
}

async fn refusals(addr: &str) -> u64 {
    let body = reqwest_get(addr, "/metrics").await;
    body.lines()
        .find(|l| l.starts_with("vramlab_refused_total{reason=\"user\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap()
}

async fn reqwest_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        stream.read_to_string(&mut out),
    )
    .await
    .unwrap_or_else(|_| panic!("GET {path}: no whole answer in 30 s"))
    .unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_belongs_to_its_user_and_others_only_watch() {
    let addr = start("127.0.0.1", 2).await;
    // Around the proxy: no user header.
    let refused = connect(&addr, "", None).await.unwrap_err();
    assert!(refused.contains("401"), "{refused}");

    let mut alice = connect(&addr, "", Some("alice")).await.unwrap();
    let hello = next(&mut alice, "hello").await;
    assert_eq!(hello["user"], "alice");
    assert_eq!(hello["owner"], "alice");
    let (id, watch) = (hello["session_id"].clone(), hello["watch_id"].clone());
    let (id, watch) = (id.as_str().unwrap(), watch.as_str().unwrap());

    // Bob cannot take it over with its id...
    let mut bob = connect(&addr, &format!("?session={id}"), Some("bob"))
        .await
        .unwrap();
    let error = next(&mut bob, "error").await;
    assert_eq!(error["error"]["kind"], "not_yours");
    // ...but may watch it, and alice hears so.
    let mut watcher = connect(&addr, &format!("?watch={watch}"), Some("bob"))
        .await
        .unwrap();
    let seen = next(&mut watcher, "hello").await;
    assert_eq!(
        (
            seen["role"].as_str(),
            seen["owner"].as_str(),
            seen["user"].as_str()
        ),
        (Some("watcher"), Some("alice"), Some("bob"))
    );
    assert_eq!(
        next(&mut alice, "watchers").await["watchers"],
        json!(["bob"])
    );
    tokio::time::timeout(std::time::Duration::from_secs(30), watcher.close(None))
        .await
        .expect("the watcher's close in 30 s")
        .unwrap();
    assert_eq!(next(&mut alice, "watchers").await["watchers"], json!([]));

    // Alice comes back to her own session.
    drop(alice);
    let mut again = connect(&addr, &format!("?session={id}"), Some("alice"))
        .await
        .unwrap();
    let hello = next(&mut again, "hello").await;
    assert_eq!(
        (hello["role"].as_str(), hello["resumed"].as_bool()),
        (Some("owner"), Some(true))
    );

    // Two sessions per user, even all from the proxy's one address.
    let _second = connect(&addr, "", Some("alice")).await.unwrap();
    let mut third = connect(&addr, "", Some("alice")).await.unwrap();
    assert_eq!(
        next(&mut third, "error").await["error"]["kind"],
        "session_limit"
    );
    let mut carol = connect(&addr, "", Some("carol")).await.unwrap();
    assert_eq!(next(&mut carol, "hello").await["user"], "carol");
    assert_eq!(refusals(&addr).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_header_from_an_untrusted_address_is_refused() {
    let addr = start("10.0.0.1", 8).await;
    let refused = connect(&addr, "", Some("mallory")).await.unwrap_err();
    assert!(refused.contains("401"), "{refused}");
    assert_eq!(refusals(&addr).await, 1);
}
