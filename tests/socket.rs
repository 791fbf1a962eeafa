//! A websocket client's side of the protocol, for the tests that drive the
//! server through something in front of it (a proxy, a balancer).

use futures::StreamExt;
use serde_json::Value;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Socket = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// The next message of type `kind`, or the next error, skipping others.
pub async fn next(ws: &mut Socket, kind: &str) -> Value {
    // One deadline for the message asked for, however many others come.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| panic!("no {kind:?} message in 30 s"))
            .expect("open")
            .unwrap();
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["type"] == kind || v["type"] == "error" {
                return v;
            }
        }
    }
}
