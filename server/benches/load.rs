//! The hosted tool under a crowd: `vramlab serve` (this build, its own
//! process) with N sessions at once, each a client that, like the page,
//! follows its live snapshots and trains the default model (4 x 1024, Adam,
//! shape-only) one step per command, as fast as its answers come. Prints,
//! per N: the command-to-result round trip (p50, p99), steps per second in
//! all, the server's resident memory idle and per session, and after the
//! sessions ended.
//!
//! With watchers (VRAMLAB_LOAD_WATCHERS=0,20,100: W read-only connections
//! following each training session, as a team demo's audience does) and
//! VRAMLAB_LOAD_EXPORT=1 (one more session's owner exporting its session
//! as a memory snapshot over and over), it also prints another session's
//! round trip: a probe session allocating and freeing a tensor a command,
//! as a learner in another tab does.
//!
//! `cargo bench -p vramlab-server --bench load` (VRAMLAB_LOAD_SESSIONS=50,200,
//! VRAMLAB_LOAD_WATCHERS=0 and VRAMLAB_LOAD_SECS=15 by default)

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The server's resident memory in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn start_server(sessions: usize) -> (Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args(["serve", "--device", "sim", "--addr"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--max-sessions", &(sessions + 8).to_string()])
        .args(["--max-sessions-per-client", "0"])
        .args(["--max-connections", "4096"])
        .args(["--max-connections-per-address", "0"])
        .args(["--session-ttl-secs", "1", "--log-format", "json"])
        // As fast as answers come: the server's capacity, not the limit.
        .args(["--commands-per-second", "1000000"])
        .env("VRAMLAB_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, port)
}

async fn next(ws: &mut Ws) -> Value {
    loop {
        if let Message::Text(t) = ws.next().await.unwrap().unwrap() {
            return serde_json::from_str(&t).unwrap();
        }
    }
}

/// Sends a command and reads (snapshots included) until its result.
async fn command(ws: &mut Ws, id: u64, cmd: Value) -> Value {
    let msg = json!({"type":"command","id":id,"command":cmd}).to_string();
    ws.send(Message::Text(msg.into())).await.unwrap();
    loop {
        let m = next(ws).await;
        if m["type"] == "result" && m["id"] == id {
            return m;
        }
        assert_ne!(m["type"], "error", "{m}");
    }
}

/// A connection; the hello's watch id when it owns its session.
async fn connect(url: String) -> (Ws, Option<String>) {
    let (mut ws, _) = connect_async(url).await.unwrap();
    let hello = next(&mut ws).await;
    (ws, hello["watch_id"].as_str().map(str::to_string))
}

/// A watcher following the session until the connection closes.
async fn watch(port: u16, id: String) {
    let (mut ws, _) = connect(format!("ws://127.0.0.1:{port}/ws?watch={id}")).await;
    while let Some(Ok(_)) = ws.next().await {}
}

/// A probe session: `x = torch.empty(...)`, `del x`, as fast as its
/// answers come until `until`; the round trip of each command.
async fn probe_until(port: u16, until: Instant) -> Vec<f64> {
    let (mut ws, _) = connect(format!("ws://127.0.0.1:{port}/ws")).await;
    let mut rtt = Vec::new();
    let mut id = 0;
    while Instant::now() < until {
        for cmd in [
            json!({"cmd":"alloc","name":"x","bytes":1 << 20}),
            json!({"cmd":"del","name":"x"}),
        ] {
            let t = Instant::now();
            let r = command(&mut ws, id, cmd).await;
            assert_eq!(r["ok"], true, "{r}");
            rtt.push(t.elapsed().as_secs_f64() * 1e3);
            id += 1;
        }
    }
    rtt
}

/// A session that trained a few steps, exporting itself over and over
/// until `until`; how many exports it got.
async fn export_until(port: u16, until: Instant) -> usize {
    let (mut ws, _) = session(port).await;
    let step = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":20});
    assert_eq!(command(&mut ws, 50, step).await["ok"], true);
    let mut exports = 0;
    while Instant::now() < until {
        let ask = json!({"type":"export_snapshot"}).to_string();
        ws.send(Message::Text(ask.into())).await.unwrap();
        loop {
            let m = next(&mut ws).await;
            if m["type"] == "memory_snapshot" {
                break;
            }
            if m["type"] == "error" {
                // Its budget of requests a second: wait for the next.
                tokio::time::sleep(Duration::from_millis(100)).await;
                break;
            }
        }
        exports += 1;
    }
    exports
}

/// A session with the default model, Adam and data, ready to train.
async fn session(port: u16) -> (Ws, Option<String>) {
    let (mut ws, watch_id) = connect(format!("ws://127.0.0.1:{port}/ws")).await;
    for (i, cmd) in [
        json!({"cmd":"model","name":"model"}),
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
        json!({"cmd":"data","name":"data"}),
    ]
    .into_iter()
    .enumerate()
    {
        let r = command(&mut ws, i as u64, cmd).await;
        assert_eq!(r["ok"], true, "{r}");
    }
    (ws, watch_id)
}

/// One client training until `until`: the round trip of each step.
async fn train_until(mut ws: Ws, until: Instant) -> Vec<f64> {
    let step = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1});
    let mut rtt = Vec::new();
    let mut id = 100;
    while Instant::now() < until {
        let t = Instant::now();
        let r = command(&mut ws, id, step.clone()).await;
        assert_eq!(r["ok"], true, "{r}");
        rtt.push(t.elapsed().as_secs_f64() * 1e3);
        id += 1;
    }
    let _ = ws.close(None).await;
    rtt
}

/// The `vramlab_sessions` gauge of the server's `/metrics`.
fn live_sessions(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("vramlab_sessions "))
        .unwrap_or("?")
        .to_string()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// What runs beside the training sessions.
#[derive(Clone, Copy)]
struct Beside {
    watchers: usize,
    export: bool,
}

async fn measure(sessions: usize, secs: u64, beside: Beside) {
    let (mut server, port) = start_server(sessions);
    let pid = server.id();
    let idle = rss_mib(pid);
    let mut clients = Vec::new();
    let mut watchers = Vec::new();
    for _ in 0..sessions {
        let (ws, watch_id) = session(port).await;
        for _ in 0..beside.watchers {
            let id = watch_id.clone().expect("an owner's hello has a watch id");
            watchers.push(tokio::spawn(watch(port, id)));
        }
        clients.push(ws);
    }
    let ready = rss_mib(pid);
    let until = Instant::now() + Duration::from_secs(secs);
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|ws| tokio::spawn(train_until(ws, until)))
        .collect();
    let probe = tokio::spawn(probe_until(port, until));
    let exporter = beside
        .export
        .then(|| tokio::spawn(export_until(port, until)));
    tokio::time::sleep(Duration::from_secs(secs) / 2).await;
    let busy = rss_mib(pid);
    let mut rtt = Vec::new();
    for task in tasks {
        rtt.extend(task.await.unwrap());
    }
    let mut probed = probe.await.unwrap();
    probed.sort_by(f64::total_cmp);
    let exports = match exporter {
        Some(e) => e.await.unwrap(),
        None => 0,
    };
    for w in watchers {
        w.abort();
    }
    // The sessions end one second after their clients left.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rss_mib(pid);
    let left = live_sessions(port);
    let _ = server.kill();
    let _ = server.wait();
    rtt.sort_by(f64::total_cmp);
    println!(
        "{sessions} sessions training, {} watchers each{}: {} steps in {secs} s ({:.0}/s), round trip p50 {:.1} ms, p99 {:.1} ms; \
         another session's p50 {:.1} ms, p99 {:.1} ms; \
         memory {idle:.0} MiB idle, {ready:.0} MiB with the sessions set up ({:.2} MiB each), {busy:.0} MiB training, {after:.0} MiB after they ended ({left} sessions left)",
        beside.watchers,
        if beside.export { format!(", an export running ({exports} made)") } else { String::new() },
        rtt.len(),
        rtt.len() as f64 / secs as f64,
        percentile(&rtt, 0.5),
        percentile(&rtt, 0.99),
        percentile(&probed, 0.5),
        percentile(&probed, 0.99),
        (ready - idle) / sessions as f64,
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let counts = std::env::var("VRAMLAB_LOAD_SESSIONS").unwrap_or_else(|_| "50,200".into());
    let secs = std::env::var("VRAMLAB_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let watchers = std::env::var("VRAMLAB_LOAD_WATCHERS").unwrap_or_else(|_| "0".into());
    let export = std::env::var("VRAMLAB_LOAD_EXPORT").is_ok_and(|v| v == "1");
    for n in counts.split(',').filter_map(|n| n.trim().parse().ok()) {
        for w in watchers.split(',').filter_map(|w| w.trim().parse().ok()) {
            measure(
                n,
                secs,
                Beside {
                    watchers: w,
                    export,
                },
            )
            .await;
        }
    }
}
