//! The websocket protocol against the real server on an ephemeral port, with
//! a tokio-tungstenite client.

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{connect_async, MaybeTlsStream, WebSocketStream};
use vramlab_backend::{select, DeviceChoice};
use vramlab_http::access::Access;
use vramlab_http::http::{build, serve, ServeOptions};
use vramlab_shared::{Engine, StepRecord};
use vramlab_tests::lesson_files;

const WAIT: Duration = Duration::from_secs(30);

async fn start(options: ServeOptions) -> String {
    let server = build(&options, select(DeviceChoice::Sim, 0).unwrap()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { serve(listener, server).await });
    format!("127.0.0.1:{}", addr.port())
}

struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    hello: Value,
}

impl Client {
    async fn connect(addr: &str, query: &str) -> Client {
        Self::try_connect(addr, query, None)
            .await
            .expect("websocket connects")
    }

    async fn try_connect(addr: &str, query: &str, origin: Option<&str>) -> Result<Client, String> {
        let mut req = format!("ws://{addr}/ws{query}")
            .into_client_request()
            .unwrap();
        if let Some(o) = origin {
            req.headers_mut().insert("origin", o.parse().unwrap());
        }
        let (ws, _) = connect_async(req).await.map_err(|e| e.to_string())?;
        let mut c = Client {
            ws,
            hello: Value::Null,
        };
        let hello = c.recv().await;
        if hello["type"] != "hello" {
            return Err(hello.to_string());
        }
        c.hello = hello;
        let snap = c.recv().await;
        assert_eq!(
            snap["type"], "snapshot",
            "a full snapshot follows the hello"
        );
        Ok(c)
    }

    async fn send(&mut self, v: Value) {
        self.ws
            .send(Message::Text(v.to_string().into()))
            .await
            .unwrap();
    }

    async fn send_text(&mut self, t: &str) {
        self.ws
            .send(Message::Text(t.to_string().into()))
            .await
            .unwrap();
    }

    async fn recv(&mut self) -> Value {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a message in time")
                .expect("the connection is open")
                .unwrap();
            if let Message::Text(t) = msg {
                return serde_json::from_str(&t).unwrap();
            }
        }
    }

    /// The next message of a type, skipping live updates.
    async fn recv_type(&mut self, kind: &str) -> Value {
        loop {
            let m = self.recv().await;
            if m["type"] == kind {
                return m;
            }
            if m["type"] == "error" && kind != "error" {
                panic!("unexpected error while waiting for {kind}: {m}");
            }
        }
    }

    /// Sends a command and waits for its result (or error).
    async fn command(&mut self, id: u64, cmd: Value) -> Value {
        self.send(json!({"type":"command","id":id,"command":cmd}))
            .await;
        loop {
            let m = self.recv().await;
            if (m["type"] == "result" || m["type"] == "error") && m["id"] == id {
                return m;
            }
        }
    }
}

fn options() -> ServeOptions {
    ServeOptions::default()
}

fn record(m: &Value) -> StepRecord {
    serde_json::from_value(m.clone()).unwrap_or_else(|e| panic!("{m}: {e}"))
}

/// A record as a client reads it from its text (a number read back may
/// differ from the one written in its last bit).
fn as_read(r: &StepRecord) -> StepRecord {
    serde_json::from_str(&serde_json::to_string(r).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lesson_over_the_socket_gives_the_same_results_as_vramlab_run() {
    let addr = start(options()).await;
    for path in lesson_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut c = Client::connect(&addr, "").await;
        let mut engine = Engine::new_simulated();
        for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
            let expected = engine.run_line(line);
            let got = c
                .command(i as u64, serde_json::from_str(line).unwrap())
                .await;
            assert_eq!(got["type"], "result", "{}: {got}", path.display());
            let expected = as_read(&expected);
            assert_eq!(record(&got), expected, "{} line {i}", path.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_clients_at_once_get_correct_independent_results() {
    let addr = start(options()).await;
    let lesson = std::fs::read_to_string(&lesson_files()[4]).unwrap();
    let expected: Vec<StepRecord> = {
        let mut e = Engine::new_simulated();
        lesson.lines().map(|l| e.run_line(l)).collect()
    };
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (addr, lesson, expected) = (addr.clone(), lesson.clone(), expected.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(&addr, "").await;
            let id = c.hello["session_id"].as_str().unwrap().to_string();
            for (i, line) in lesson.lines().enumerate() {
                let got = c
                    .command(i as u64, serde_json::from_str(line).unwrap())
                    .await;
                assert_eq!(record(&got), expected[i]);
            }
            id
        }));
    }
    let mut ids = std::collections::BTreeSet::new();
    for t in tasks {
        ids.insert(t.await.unwrap());
    }
    assert_eq!(ids.len(), 50, "every client had its own session");
}

async fn setup_training(c: &mut Client) {
    for (i, cmd) in [
        json!({"cmd":"model","name":"model","layers":2,"width":256}),
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
        json!({"cmd":"data","name":"data"}),
    ]
    .into_iter()
    .enumerate()
    {
        let r = c.command(100 + i as u64, cmd).await;
        assert_eq!(r["ok"], true, "{r}");
    }
}

fn long_train(steps: u64) -> Value {
    json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":steps,"batch_size":64})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_in_the_middle_of_train_then_resume() {
    let addr = start(options()).await;
    let mut c = Client::connect(&addr, "").await;
    let session = c.hello["session_id"].as_str().unwrap().to_string();
    setup_training(&mut c).await;
    c.send(json!({"type":"command","id":7,"command":long_train(200_000)}))
        .await;
    let progress = c.recv_type("progress").await;
    assert_eq!(progress["id"], 7);
    drop(c);

    let mut again = Client::connect(&addr, &format!("?session={session}")).await;
    assert_eq!(again.hello["resumed"], true);
    assert_eq!(again.hello["session_id"], session.as_str());
    // The command kept running; its result arrives on the new connection.
    again.send(json!({"type":"stop"})).await;
    let result = loop {
        let m = again.recv().await;
        if m["type"] == "result" && m["id"] == 7 {
            break m;
        }
    };
    assert_eq!(result["ok"], true);
    assert_eq!(result["value"]["stopped"], true);
    let done = result["value"]["steps"].as_array().unwrap().len();
    assert!(done > 0 && done < 200_000, "{done}");
    // And the session goes on.
    let r = again.command(8, json!({"cmd":"gc"})).await;
    assert_eq!(r["ok"], true);
}

async fn metric(addr: &str, name: &str) -> u64 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} in {body}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_releases_its_device_memory() {
    let mut o = options();
    o.limits.session_ttl_seconds = 1;
    let addr = start(o).await;
    assert_eq!(metric(&addr, "vramlab_device_used_bytes").await, 0);
    let mut c = Client::connect(&addr, "").await;
    let session = c.hello["session_id"].as_str().unwrap().to_string();
    let r = c
        .command(1, json!({"cmd":"alloc","name":"x","bytes": 1u64 << 30}))
        .await;
    assert_eq!(r["ok"], true);
    assert!(metric(&addr, "vramlab_device_used_bytes").await >= 1 << 30);
    drop(c);
    // Within the TTL the session (and its memory) stays.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(metric(&addr, "vramlab_sessions").await, 1);
    // After it, the session goes (the reaper looks four times a second).
    let deadline = std::time::Instant::now() + WAIT;
    while metric(&addr, "vramlab_sessions").await != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the session never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric(&addr, "vramlab_device_used_bytes").await,
        0,
        "back to the baseline"
    );
    let gone = Client::try_connect(&addr, &format!("?session={session}"), None).await;
    assert!(gone.err().unwrap().contains("unknown_session"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_get_errors_and_change_nothing() {
    let addr = start(options()).await;
    let mut c = Client::connect(&addr, "").await;
    c.command(1, json!({"cmd":"alloc","name":"x","bytes":1000}))
        .await;
    c.send(json!({"type":"snapshot"})).await;
    let before = c.recv_type("snapshot").await["snapshot"]["stats"].clone();
    let cases: [(&str, &str, &str); 8] = [
        ("{not json", "bad_message", "not a client message"),
        ("{\"type\":\"launch\"}", "bad_message", "unknown variant `launch`"),
        ("{\"type\":\"command\",\"command\":{\"cmd\":\"gc\"}}", "bad_message", "missing field `id`"),
        ("{\"type\":\"command\",\"id\":\"one\",\"command\":{}}", "bad_message", "invalid type"),
        ("{\"type\":\"command\",\"id\":5,\"command\":{\"cmd\":\"fly\"}}", "invalid_command", "unknown command \"fly\""),
        ("{\"type\":\"command\",\"id\":6,\"command\":{\"cmd\":\"alloc\",\"name\":\"y\",\"bytes\":-1}}", "invalid_command", "invalid value"),
        ("{\"type\":\"command\",\"id\":7,\"command\":{\"cmd\":\"del\",\"name\":\"nobody\"}}", "name_error", "'nobody'"),
        ("[1,2,3]", "bad_message", "not a client message"),
    ];
    for (text, kind, needle) in cases {
        c.send_text(text).await;
        let m = loop {
            let m = c.recv().await;
            if m["type"] == "error" || m["type"] == "result" {
                break m;
            }
        };
        // A command error comes as a result; a message error as an error.
        let err = &m["error"];
        assert_eq!(err["kind"], kind, "{text}: {m}");
        assert!(
            err["message"].as_str().unwrap().contains(needle),
            "{text}: {m}"
        );
    }
    // A message that is not valid but has an id gets its error under it.
    c.send_text("{\"type\":\"command\",\"id\":9,\"bogus\":1,\"command\":{\"cmd\":\"gc\"}}")
        .await;
    let m = c.recv_type("error").await;
    assert_eq!(
        (m["id"].clone(), m["error"]["kind"].clone()),
        (json!(9), json!("bad_message"))
    );
    let big = format!(
        "{{\"type\":\"ping\",\"nonce\":1,\"pad\":\"{}\"}}",
        "x".repeat(70_000)
    );
    c.send_text(&big).await;
    let m = c.recv_type("error").await;
    assert_eq!(m["error"]["kind"], "too_large");
    // Still open, still the same session.
    c.send(json!({"type":"ping","nonce":42})).await;
    assert_eq!(c.recv_type("pong").await["nonce"], 42);
    c.send(json!({"type":"snapshot"})).await;
    let after = c.recv_type("snapshot").await["snapshot"]["stats"].clone();
    assert_eq!(after["allocated_bytes"], before["allocated_bytes"]);
    assert_eq!(after["reserved_bytes"], before["reserved_bytes"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quota_and_the_session_limit_hold() {
    let mut o = options();
    o.limits.session_quota_bytes = Some(64 << 20);
    o.max_sessions = 2;
    let addr = start(o).await;
    let mut a = Client::connect(&addr, "").await;
    let r = a
        .command(1, json!({"cmd":"alloc","name":"x","bytes": 100u64 << 20}))
        .await;
    assert_eq!(r["ok"], false);
    assert_eq!(r["error"]["kind"], "out_of_memory");
    let r = a
        .command(2, json!({"cmd":"alloc","name":"x","bytes": 60u64 << 20}))
        .await;
    assert_eq!(r["ok"], true);
    let _b = Client::connect(&addr, "").await;
    let third = Client::try_connect(&addr, "", None).await;
    let err = third.err().expect("a third session is refused");
    assert!(err.contains("session_limit"), "{err}");
}

/// On a server others reach, loopback is a client like any other (a proxy
/// on the same host spoke for every client with no limit): its sessions
/// keep to the per-client limit, and its wrong tokens are throttled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_counts_as_one_client_on_a_server_others_reach() {
    let mut o = options();
    o.max_sessions_per_client = 2;
    o.access.local_only = false;
    let addr = start(o).await;
    let _a = Client::connect(&addr, "").await;
    let _b = Client::connect(&addr, "").await;
    let third = Client::try_connect(&addr, "", None).await;
    assert!(third.err().expect("refused").contains("session_limit"));
    let mut o = options();
    o.access = Access {
        token: Some("letmein".into()),
        ..Access::default()
    };
    let addr = start(o).await;
    for _ in 0..vramlab_http::access::TokenGuesses::LIMIT {
        let wrong = Client::try_connect(&addr, "?token=nope", None).await;
        assert!(wrong.err().unwrap().contains("401"));
    }
    let throttled = Client::try_connect(&addr, "?token=nope", None).await;
    assert!(throttled.err().unwrap().contains("429"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_and_missing_or_wrong_tokens_are_refused() {
    let mut o = options();
    o.access = Access {
        token: Some("letmein".into()),
        ..Access::default()
    };
    let addr = start(o).await;
    let no_token = Client::try_connect(&addr, "", None).await;
    assert!(no_token.err().unwrap().contains("401"));
    let wrong = Client::try_connect(&addr, "?token=nope", None).await;
    assert!(wrong.err().unwrap().contains("401"));
    let evil = Client::try_connect(&addr, "?token=letmein", Some("http://evil.example")).await;
    assert!(evil.err().unwrap().contains("403"));
    let own = format!("http://{addr}");
    assert!(Client::try_connect(&addr, "?token=letmein", Some(&own))
        .await
        .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_sees_everything_and_changes_nothing() {
    let addr = start(options()).await;
    let mut owner = Client::connect(&addr, "").await;
    let watch = owner.hello["watch_id"].as_str().unwrap().to_string();
    let mut watcher = Client::connect(&addr, &format!("?watch={watch}")).await;
    assert_eq!(watcher.hello["role"], "watcher");
    assert!(watcher.hello.get("watch_id").is_none());
    // The watcher never learns the owner's id: reconnecting with the id it
    // was given makes it a watcher again, not the owner.
    let given = watcher.hello["session_id"].as_str().unwrap().to_string();
    assert_eq!(given, watch);
    assert_ne!(given, owner.hello["session_id"].as_str().unwrap());
    let again = Client::try_connect(&addr, &format!("?session={given}"), None).await;
    assert!(again.is_err() || again.unwrap().hello["role"] != "owner");
    let r = watcher
        .command(1, json!({"cmd":"alloc","name":"x","bytes":1000}))
        .await;
    assert_eq!(r["type"], "error");
    assert_eq!(r["error"]["kind"], "read_only");
    watcher.send(json!({"type":"stop"})).await;
    assert_eq!(
        watcher.recv_type("error").await["error"]["kind"],
        "read_only"
    );
    owner.send(json!({"type":"snapshot"})).await;
    let stats = owner.recv_type("snapshot").await["snapshot"]["stats"].clone();
    assert_eq!(
        stats["allocated_bytes"], 0,
        "the owner's session is unchanged"
    );
    // What the owner does, the watcher sees.
    let r = owner
        .command(9, json!({"cmd":"alloc","name":"x","bytes":1000}))
        .await;
    let seen = loop {
        let m = watcher.recv().await;
        if m["type"] == "result" && m["id"] == 9 {
            break m;
        }
    };
    assert_eq!(seen["stats"], r["stats"]);
    // The owner's page goes to the watcher; a watcher cannot send one; too
    // many a second are refused.
    let view = json!({"type":"presenter","view":{"cell":"del x","lesson":[0, 3, [true, "ok"]],"controls":{"batch":"2048"}}});
    owner.send(view.clone()).await;
    let got = watcher.recv_type("presenter").await;
    assert_eq!(got["view"]["cell"], "del x");
    assert_eq!(got["view"]["controls"]["batch"], "2048");
    assert_eq!(got["view"]["lesson"], json!([0, 3, [true, "ok"]]));
    watcher.send(view.clone()).await;
    assert_eq!(
        watcher.recv_type("error").await["error"]["kind"],
        "read_only"
    );
    for _ in 0..30 {
        owner.send(view.clone()).await;
    }
    assert_eq!(
        owner.recv_type("error").await["error"]["kind"],
        "rate_limited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_wait_in_order_and_none_is_lost() {
    let mut o = options();
    o.max_queue = 3;
    let addr = start(o).await;
    let mut c = Client::connect(&addr, "").await;
    setup_training(&mut c).await;
    c.send(json!({"type":"command","id":1,"command":long_train(100_000)}))
        .await;
    for id in 2..=8u64 {
        c.send(json!({"type":"command","id":id,"command":{"cmd":"alloc","name":format!("t{id}"),"bytes":id}})).await;
    }
    c.send(json!({"type":"stop"})).await;
    let mut results = Vec::new();
    let mut busy = Vec::new();
    while results.len() + busy.len() < 8 {
        let m = c.recv().await;
        match m["type"].as_str() {
            Some("result") => results.push(m["id"].as_u64().unwrap()),
            Some("error") => {
                assert_eq!(m["error"]["kind"], "busy", "{m}");
                busy.push(m["id"].as_u64().unwrap());
            }
            _ => {}
        }
    }
    let mut sorted = results.clone();
    sorted.sort();
    assert_eq!(results, sorted, "results come in order");
    assert!(!busy.is_empty(), "a full queue refuses with busy");
    assert_eq!(results.len() + busy.len(), 8, "every command got an answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_deltas_carry_every_peak() {
    let mut o = options();
    o.limits.snapshot_interval_ms = 1;
    let addr = start(o).await;
    let mut c = Client::connect(&addr, "").await;
    setup_training(&mut c).await;
    let r = c.command(1, long_train(50)).await;
    let steps = r["value"]["steps"].as_array().unwrap();
    let true_peak = steps
        .iter()
        .map(|s| s["peak_allocated_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    // A fresh client subscribed from the start sees the same peak in its deltas.
    let mut w = Client::connect(
        &addr,
        &format!("?watch={}", c.hello["watch_id"].as_str().unwrap()),
    )
    .await;
    c.send(json!({"type":"command","id":2,"command":long_train(50)}))
        .await;
    // The result and the last delta may come in either order: read until
    // both came (a missing peak times out and fails).
    let (mut seen, mut done) = (0, false);
    while !(done && seen == true_peak) {
        let m = w.recv().await;
        if m["type"] == "delta" {
            seen = seen.max(m["peak_allocated_bytes"].as_u64().unwrap());
            assert!(
                m["peak_allocated_bytes"].as_u64().unwrap()
                    >= m["stats"]["allocated_bytes"].as_u64().unwrap()
            );
        }
        done |= m["type"] == "result" && m["id"] == 2;
    }
    assert_eq!(seen, true_peak);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_commands_a_second_are_refused() {
    let mut o = options();
    o.limits.commands_per_second = 5;
    let addr = start(o).await;
    let mut c = Client::connect(&addr, "").await;
    for id in 0..20u64 {
        c.send(json!({"type":"command","id":id,"command":{"cmd":"gc"}}))
            .await;
    }
    let mut limited = 0;
    let mut answered = 0;
    while answered < 20 {
        let m = c.recv().await;
        if m["type"] == "error" {
            assert_eq!(m["error"]["kind"], "rate_limited");
            limited += 1;
            answered += 1;
        } else if m["type"] == "result" {
            answered += 1;
        }
    }
    assert!(limited >= 10, "{limited}");
}

/// A `commands` message (the code cell's lines) counts once against the
/// session's commands a second: sixty lines in four messages all run, in
/// order, each answered under its own id; a watcher's are refused one by
/// one, and a batch past the most a message holds is refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_commands_counts_once_and_each_is_answered() {
    let mut o = options();
    o.limits.commands_per_second = 5;
    let addr = start(o).await;
    let mut c = Client::connect(&addr, "").await;
    for batch in 0..4u64 {
        let commands: Vec<Value> = (0..15)
            .map(|i| json!({"cmd":"alloc","name":format!("t{}", batch * 15 + i),"bytes":1024}))
            .collect();
        c.send(json!({"type":"commands","first_id":batch * 15,"commands":commands}))
            .await;
    }
    let mut ids = Vec::new();
    while ids.len() < 60 {
        let m = c.recv().await;
        assert_ne!(m["type"], "error", "{m}");
        if m["type"] == "result" {
            assert_eq!(m["ok"], true, "{m}");
            ids.push(m["id"].as_u64().unwrap());
        }
    }
    assert_eq!(ids, (0..60).collect::<Vec<_>>());
    let too_many: Vec<Value> = (0..65).map(|_| json!({"cmd":"gc"})).collect();
    c.send(json!({"type":"commands","first_id":100,"commands":too_many}))
        .await;
    let m = c.recv_type("error").await;
    assert_eq!(m["error"]["kind"], "bad_message", "{m}");
    assert!(
        m["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1 to 64 commands"),
        "{m}"
    );
    let watch = c.hello["watch_id"].as_str().unwrap().to_string();
    let mut watcher = Client::connect(&addr, &format!("?watch={watch}")).await;
    watcher
        .send(json!({"type":"commands","first_id":7,"commands":[{"cmd":"gc"},{"cmd":"gc"}]}))
        .await;
    for id in [7, 8] {
        let m = watcher.recv_type("error").await;
        assert_eq!(
            (m["id"].as_u64(), &m["error"]["kind"]),
            (Some(id), &json!("read_only")),
            "{m}"
        );
    }
}

/// A watcher asking for snapshots as fast as it can spends the watchers'
/// budget, not the owner's: the owner's commands still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_cannot_spend_the_owners_budget() {
    let mut o = options();
    o.limits.commands_per_second = 5;
    let addr = start(o).await;
    let mut owner = Client::connect(&addr, "").await;
    let watch = owner.hello["watch_id"].as_str().unwrap().to_string();
    let mut watcher = Client::connect(&addr, &format!("?watch={watch}")).await;
    for _ in 0..30 {
        watcher.send(json!({"type":"snapshot"})).await;
    }
    // The watchers' budget ran out...
    let (mut limited, mut answered) = (0, 0);
    while answered < 30 {
        let m = watcher.recv().await;
        let refused = m["type"] == "error" && m["error"]["kind"] == "rate_limited";
        answered += usize::from(m["type"] == "snapshot" || refused);
        limited += usize::from(refused);
    }
    assert!(limited >= 20, "{limited}");
    // ...and the owner's is whole: five commands, five results.
    for id in 0..5u64 {
        owner
            .send(json!({"type":"command","id":id,"command":{"cmd":"gc"}}))
            .await;
    }
    let mut results = 0;
    while results < 5 {
        let m = owner.recv().await;
        assert_ne!(m["type"], "error", "{m}");
        results += usize::from(m["type"] == "result");
    }
}

/// DNS rebinding: a page served from `evil.example:PORT`, whose name now
/// resolves to 127.0.0.1, connects with `Host` and `Origin` both
/// `evil.example:PORT`. A loopback server answers only to loopback names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_host_is_refused_by_a_loopback_server() {
    let mut o = options();
    o.access.allowed_hosts =
        vramlab_http::access::AllowedHosts::for_listener("127.0.0.1:0".parse().unwrap(), &[]);
    let addr = start(o).await;
    let port = addr.rsplit(':').next().unwrap();
    let mut req = format!("ws://{addr}/ws").into_client_request().unwrap();
    let evil = format!("evil.example:{port}");
    req.headers_mut().insert("host", evil.parse().unwrap());
    req.headers_mut()
        .insert("origin", format!("http://{evil}").parse().unwrap());
    let err = connect_async(req).await.unwrap_err().to_string();
    assert!(err.contains("403"), "{err}");
    // The same server by its own name works.
    assert!(
        Client::try_connect(&addr, "", Some(&format!("http://{addr}")))
            .await
            .is_ok()
    );
}

/// A client that sends nothing, not even a pong to the server's pings, is
/// closed after the idle time, so it cannot keep its session alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_after_the_idle_time() {
    let mut o = options();
    o.keepalive = vramlab_http::app::Keepalive {
        ping_every: std::time::Duration::from_millis(100),
        idle: std::time::Duration::from_millis(300),
    };
    let addr = start(o).await;
    let req = format!("ws://{addr}/ws").into_client_request().unwrap();
    let (mut ws, _) = connect_async(req).await.unwrap();
    // Read nothing (so no pong goes back) for well over the idle time.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let (mut pings, mut closed) = (0, false);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(std::time::Duration::from_secs(1), ws.next()).await {
            Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Ping(_)))) => pings += 1,
            Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Close(_))))
            | Ok(None)
            | Ok(Some(Err(_))) => {
                closed = true;
                break;
            }
            Ok(Some(Ok(_))) => {}
            Err(_) => break,
        }
    }
    assert!(pings >= 1, "the server pinged");
    assert!(closed, "the server closed the silent connection");
}

/// Stopping the server (SIGTERM or Ctrl-C end `serve_until`'s future): a
/// running command is stopped and answered, one queued behind it and one
/// sent after the stop are answered unrun (`shutting_down`), none is lost,
/// then the connection gets a close frame with 1001 (going away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_server_answers_running_commands_and_says_going_away() {
    let server = build(&options(), select(DeviceChoice::Sim, 0).unwrap()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(vramlab_http::http::serve_until(listener, server, async {
        let _ = stopped.await;
    }));
    let mut c = Client::connect(&addr, "").await;
    for (id, cmd) in [
        (1, json!({"cmd":"model","name":"m","layers":2,"width":512})),
        (
            2,
            json!({"cmd":"optimizer","name":"o","model":"m","kind":"adam"}),
        ),
        (3, json!({"cmd":"data","name":"d"})),
    ] {
        assert_eq!(c.command(id, cmd).await["ok"], true);
    }
    c.send(json!({"type":"command","id":4,"command":
        {"cmd":"train","model":"m","optimizer":"o","data":"d","steps":1000000,"batch_size":64}}))
        .await;
    // Wait until the run is under way, queue a command behind it, then
    // stop the server and send one more.
    loop {
        if c.recv().await["type"] == "progress" {
            break;
        }
    }
    c.send(json!({"type":"command","id":5,"command":{"cmd":"gc"}}))
        .await;
    stop.send(()).unwrap();
    c.send(json!({"type":"command","id":6,"command":{"cmd":"gc"}}))
        .await;
    let (mut result, mut unrun) = (None, Vec::new());
    while result.is_none() || unrun.len() < 2 {
        let m = c.recv().await;
        match (m["type"].as_str(), m["id"].as_u64()) {
            (Some("result"), Some(4)) => result = Some(m),
            (Some("error"), Some(id)) => {
                assert_eq!(m["error"]["kind"], "shutting_down", "{m}");
                unrun.push(id);
            }
            (Some("result"), Some(id)) => panic!("command {id} ran during the shutdown: {m}"),
            _ => {}
        }
    }
    assert_eq!(result.unwrap()["value"]["stopped"], true);
    unrun.sort();
    assert_eq!(unrun, [5, 6]);
    let close = loop {
        match tokio::time::timeout(WAIT, c.ws.next())
            .await
            .expect("in time")
        {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("no close frame: {other:?}"),
        }
    };
    assert_eq!(u16::from(close.expect("a close frame").code), 1001);
    tokio::time::timeout(WAIT, serving)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
}

/// `GET /healthz` sent whole on `c`: the reply, within `wait`.
async fn healthz(mut c: TcpStream, wait: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    tokio::time::timeout(wait, c.read_to_string(&mut reply))
        .await
        .expect("served in time")
        .unwrap();
    reply
}

/// Half-sent requests cannot hold the server: with room for two
/// connections, two clients that send half a request are closed after the
/// idle time, and a third gets its `/healthz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_are_closed_and_others_get_through() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut o = options();
    o.connections = vramlab_http::listener::ConnectionLimits {
        max_connections: 2,
        read_idle: Duration::from_millis(400),
        ..Default::default()
    };
    let addr = start(o).await;
    let mut stuck = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .unwrap();
        stuck.push(s);
    }
    let started = std::time::Instant::now();
    let reply = healthz(TcpStream::connect(&addr).await.unwrap(), WAIT).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it waited for a slot"
    );
    for mut s in stuck {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(WAIT, s.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the half-sent connection was closed");
    }
}

/// A client's Close is answered with the server's (the closing handshake),
/// not a bare TCP close that clients report as 1006.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_close_is_answered() {
    use tokio_tungstenite::tungstenite::protocol::{frame::coding::CloseCode, CloseFrame};
    let addr = start(options()).await;
    let (mut ws, _) = connect_async(format!("ws://{addr}/ws")).await.unwrap();
    let close = CloseFrame {
        code: CloseCode::Normal,
        reason: "done".into(),
    };
    ws.send(Message::Close(Some(close))).await.unwrap();
    let mut answered = None;
    while let Ok(Some(m)) = tokio::time::timeout(WAIT, ws.next()).await {
        match m {
            Ok(Message::Close(frame)) => {
                answered = Some(frame.map(|f| f.code));
                break;
            }
            Ok(_) => continue,
            Err(e) => panic!("the connection ended without the server's close: {e}"),
        }
    }
    assert_eq!(answered, Some(Some(CloseCode::Normal)));
}

/// A request sent a byte at a time, each within the idle time, is closed
/// at its headers' deadline (it held a slot for as long as it trickled),
/// and the slot goes to a request that arrives whole; a websocket, once
/// upgraded, is not held to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_trickled_a_byte_at_a_time_is_closed_at_its_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut o = options();
    o.connections = vramlab_http::listener::ConnectionLimits {
        max_connections: 2,
        read_idle: Duration::from_secs(20),
        header_deadline: Duration::from_millis(600),
        ..Default::default()
    };
    let addr = start(o).await;
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .unwrap();
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    let started = std::time::Instant::now();
    let request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    let mut closed_after = None;
    for &b in request.iter() {
        if slow.write_all(&[b]).await.is_err() {
            closed_after = Some(started.elapsed());
            break;
        }
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(150), slow.read(&mut byte)).await;
        if let Ok(Ok(0) | Err(_)) = read {
            closed_after = Some(started.elapsed());
            break;
        }
    }
    let closed_after = closed_after.expect("the trickling request was closed");
    assert!(closed_after < Duration::from_secs(3), "{closed_after:?}");
    let reply = healthz(TcpStream::connect(&addr).await.unwrap(), WAIT).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // The websocket outlived the headers' deadline many times over.
    let mut ws = ws;
    let ping = r#"{"type":"ping","nonce":5}"#;
    ws.send(tokio_tungstenite::tungstenite::Message::Text(ping.into()))
        .await
        .unwrap();
    loop {
        let m = tokio::time::timeout(WAIT, ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if m.to_text().unwrap().contains("pong") {
            break;
        }
    }
}

/// One address cannot take every connection: with room for four, two per
/// address, a client at 127.0.0.1 that opens four half-sent requests holds
/// two (the others are closed at once), and a client at 127.0.0.2 gets its
/// `/healthz` without waiting for the idle time to free a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut o = options();
    o.connections = vramlab_http::listener::ConnectionLimits {
        max_connections: 4,
        max_per_address: 2,
        read_idle: Duration::from_secs(20),
        ..Default::default()
    };
    let addr = start(o).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    // The third and fourth are closed by the server (read: the end of the
    // stream, or a reset since the server never read what was sent).
    let mut closed = 0;
    for s in held.iter_mut() {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(500), s.read(&mut byte)).await;
        if matches!(read, Ok(Ok(0) | Err(_))) {
            closed += 1;
        }
    }
    assert_eq!(
        closed, 2,
        "two of one address's four connections were closed"
    );
    let started = std::time::Instant::now();
    let other = tokio::net::TcpSocket::new_v4().unwrap();
    other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let c = other.connect(addr.parse().unwrap()).await.unwrap();
    let reply = healthz(c, Duration::from_secs(5)).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The commands-a-second budget belongs to the session, not to each
/// connection, and snapshot requests draw on it; a session has a bounded
/// number of watchers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_budget_is_shared_and_its_watchers_bounded() {
    let mut o = options();
    // One token a second: the first connection's command spends it, and
    // only a refill (a second's delay) could serve the second's.
    o.limits.commands_per_second = 1;
    o.max_watchers = 1;
    let addr = start(o).await;
    let mut a = Client::connect(&addr, "").await;
    let id = a.hello["session_id"].as_str().unwrap().to_string();
    let mut b = Client::connect(&addr, &format!("?session={id}")).await;
    a.send(json!({"type":"command","id":0,"command":{"cmd":"gc"}}))
        .await;
    for i in 10..15u64 {
        b.send(json!({"type":"command","id":i,"command":{"cmd":"gc"}}))
            .await;
    }
    b.send(json!({"type":"snapshot"})).await;
    let mut limited = 0;
    let mut answered = 0;
    while answered < 6 {
        let m = b.recv().await;
        let mine = m["id"].as_u64().is_some_and(|i| i >= 10) || m["id"].is_null();
        if m["type"] == "error" && mine {
            assert_eq!(m["error"]["kind"], "rate_limited", "{m}");
            limited += 1;
            answered += 1;
        } else if (m["type"] == "result" && mine) || m["type"] == "snapshot" {
            answered += 1;
        }
    }
    assert!(
        limited >= 4,
        "the second connection found the budget spent: {limited}"
    );
    let watch = a.hello["watch_id"].as_str().unwrap().to_string();
    let _first = Client::connect(&addr, &format!("?watch={watch}")).await;
    let second = Client::try_connect(&addr, &format!("?watch={watch}"), None).await;
    let err = second.err().expect("a second watcher is refused");
    assert!(err.contains("session_limit"), "{err}");
}

/// `export_snapshot` gives the session as a PyTorch memory snapshot: its
/// segments now and its trace since the restart, which replays exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exported_session_is_a_snapshot_that_replays_exactly() {
    use vramlab_shared::torch_snapshot::replay::replay_exact;
    use vramlab_shared::torch_snapshot::{self, Action, MemorySnapshot};
    let addr = start(options()).await;
    let mut c = Client::connect(&addr, "").await;
    let commands = [
        json!({"cmd":"alloc","name":"x","bytes":1000}),
        json!({"cmd":"restart"}),
        json!({"cmd":"alloc","name":"a","bytes":3000000}),
        json!({"cmd":"alloc","name":"b","bytes":30000000}),
        json!({"cmd":"del","name":"a"}),
        json!({"cmd":"alloc","name":"c","bytes":2000000}),
    ];
    for (id, cmd) in commands.into_iter().enumerate() {
        assert_eq!(c.command(id as u64, cmd).await["ok"], true);
    }
    c.send(json!({"type":"export_snapshot"})).await;
    let m = c.recv_type("memory_snapshot").await;
    let exported: MemorySnapshot = torch_snapshot::from_json(m["snapshot"].clone()).unwrap();
    // After the restart: a 20 MiB segment for a, one of its own for b; c
    // takes the block a left in the cache.
    let actions: Vec<String> = exported.device_traces[0]
        .iter()
        .map(|e| e.action.name().to_string())
        .collect();
    assert_eq!(
        actions,
        [
            "segment_alloc",
            "alloc",
            "segment_alloc",
            "alloc",
            "free_requested",
            "free_completed",
            "alloc"
        ]
    );
    assert_eq!(exported.segments.len(), 2);
    assert_eq!(exported.device_traces[0].action(6), Action::Alloc);
    assert_eq!(
        exported.device_traces[0].get(6).unwrap().addr,
        exported.device_traces[0].get(1).unwrap().addr
    );
    let run = replay_exact(&exported, 0).unwrap();
    assert_eq!(run.exact, Some(true), "{:?}", run.first_difference);
}
