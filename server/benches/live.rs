//! Figures of the live server on loopback, printed as a table:
//! - command-to-result round trip (p50, p99) for tensor commands;
//! - the size of the incremental snapshots (deltas) a subscriber receives
//!   during training;
//! - CPU used while 100 clients follow a training run at 30 Hz.
//!
//! `cargo bench -p vramlab-server --bench live`

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;
use vramlab_backend::{select, DeviceChoice};
use vramlab_http::http::{build, serve, ServeOptions};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn start(options: ServeOptions) -> String {
    let server = build(&options, select(DeviceChoice::Sim, 0).unwrap()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { serve(listener, server).await });
    addr.to_string()
}

async fn connect(addr: &str, query: &str) -> (Ws, Value) {
    let (mut ws, _) = connect_async(format!("ws://{addr}/ws{query}"))
        .await
        .unwrap();
    let hello = next(&mut ws).await;
    let _snapshot = next(&mut ws).await;
    (ws, hello)
}

async fn next(ws: &mut Ws) -> Value {
    loop {
        if let Message::Text(t) = ws.next().await.unwrap().unwrap() {
            return serde_json::from_str(&t).unwrap();
        }
    }
}

async fn command(ws: &mut Ws, id: u64, cmd: Value) -> Value {
    ws.send(Message::Text(
        json!({"type":"command","id":id,"command":cmd})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    loop {
        let m = next(ws).await;
        if m["type"] == "result" && m["id"] == id {
            return m;
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// CPU seconds this process has used (user + system).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: f64 = fields
        .get(11)
        .and_then(|u| u.parse::<f64>().ok())
        .unwrap_or(0.0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0);
    ticks / 100.0
}

async fn setup_training(ws: &mut Ws) {
    for (i, cmd) in [
        json!({"cmd":"model","name":"model"}),
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
        json!({"cmd":"data","name":"data"}),
    ]
    .into_iter()
    .enumerate()
    {
        command(ws, 1000 + i as u64, cmd).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut options = ServeOptions::default();
    options.limits.commands_per_second = 1_000_000;
    options.max_sessions = 256;
    let addr = start(options).await;

    // Round trip of tensor commands.
    let (mut ws, _) = connect(&addr, "").await;
    ws.send(Message::Text(
        json!({"type":"unsubscribe"}).to_string().into(),
    ))
    .await
    .unwrap();
    let mut rtt = Vec::new();
    for i in 0..4000u64 {
        let cmd = if i % 2 == 0 {
            json!({"cmd":"alloc","name":"x","bytes": 1 + (i * 7919) % (64 << 20)})
        } else {
            json!({"cmd":"del","name":"x"})
        };
        let t = Instant::now();
        command(&mut ws, i, cmd).await;
        rtt.push(t.elapsed().as_secs_f64() * 1e3);
    }
    rtt.sort_by(f64::total_cmp);
    println!(
        "round trip (alloc/del, 4000 commands, subscribed off): p50 {:.3} ms, p99 {:.3} ms",
        percentile(&rtt, 0.5),
        percentile(&rtt, 0.99)
    );

    // Delta sizes while training, for a subscribed client.
    let (mut owner, hello) = connect(&addr, "").await;
    setup_training(&mut owner).await;
    let watch = hello["watch_id"].as_str().unwrap().to_string();
    let (mut watcher, _) = connect(&addr, &format!("?watch={watch}")).await;
    owner
        .send(Message::Text(json!({"type":"command","id":1,"command":{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":20000}}).to_string().into()))
        .await
        .unwrap();
    let mut sizes = Vec::new();
    let mut event_sizes = Vec::new();
    loop {
        let Message::Text(t) = watcher.next().await.unwrap().unwrap() else {
            continue;
        };
        let v: Value = serde_json::from_str(&t).unwrap();
        match v["type"].as_str() {
            Some("delta") => sizes.push(t.len() as f64),
            Some("events") => event_sizes.push(t.len() as f64),
            Some("result") if v["id"] == 1 => break,
            _ => {}
        }
    }
    sizes.sort_by(f64::total_cmp);
    event_sizes.sort_by(f64::total_cmp);
    println!(
        "incremental snapshots during training (20,000 steps): {} deltas, median {:.0} bytes, p90 {:.0} bytes; event batches median {:.0} bytes",
        sizes.len(),
        percentile(&sizes, 0.5),
        percentile(&sizes, 0.9),
        if event_sizes.is_empty() { 0.0 } else { percentile(&event_sizes, 0.5) },
    );

    // CPU while 100 clients follow a training run at 30 Hz, against none.
    async fn run_for(owner: &mut Ws, seconds: f64, id: u64) -> f64 {
        let c0 = cpu_seconds();
        let t0 = Instant::now();
        owner
            .send(Message::Text(json!({"type":"command","id":id,"command":{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1_000_000}}).to_string().into()))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        owner
            .send(Message::Text(json!({"type":"stop"}).to_string().into()))
            .await
            .unwrap();
        loop {
            let m = next(owner).await;
            if m["type"] == "result" && m["id"] == id {
                if m["ok"] != true {
                    println!("training failed: {m}");
                }
                break;
            }
        }
        (cpu_seconds() - c0) / t0.elapsed().as_secs_f64()
    }
    drop(watcher);
    owner
        .send(Message::Text(
            json!({"type":"unsubscribe"}).to_string().into(),
        ))
        .await
        .unwrap();
    let alone = run_for(&mut owner, 5.0, 2).await;
    let mut followers = Vec::new();
    for _ in 0..100 {
        let (w, _) = connect(&addr, &format!("?watch={watch}")).await;
        followers.push(tokio::spawn(async move {
            let mut w = w;
            let mut n = 0u64;
            while let Some(Ok(_)) = w.next().await {
                n += 1;
            }
            n
        }));
    }
    let with_100 = run_for(&mut owner, 5.0, 3).await;
    println!(
        "CPU while training with 30 Hz snapshots: {:.0}% of a core with no subscriber, {:.0}% with 100 subscribers",
        alone * 100.0,
        with_100 * 100.0
    );
    for f in followers {
        f.abort();
    }
}
