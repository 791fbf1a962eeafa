//! Fuzzers, run briefly by the test command (`VRAMLAB_FUZZ_CASES` runs
//! more): random command sequences through the engine, and random frames
//! (mangled messages, commands with extreme fields, binary, oversize) to
//! the real server over several websockets. Neither may panic, abort or
//! stop answering; every engine invariant is checked after every command
//! (debug builds).

use futures::{SinkExt, StreamExt};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;
use vramlab_backend::{select, DeviceChoice};
use vramlab_http::http::{build, serve, ServeOptions};
use vramlab_shared::command::{self as c, Command};
use vramlab_shared::Engine;

/// Every command, and one that does not exist.
fn commands() -> Vec<&'static str> {
    Command::NAMES.iter().copied().chain(["nonsense"]).collect()
}

/// The fields a command's reader takes, asked of the reader itself
/// (the readers written by hand list theirs).
fn own_fields(cmd: &str) -> &'static [&'static str] {
    // `tf_session` and `close` take `del`'s one name.
    let cmd = match cmd {
        "tf_session" | "close" => "del",
        cmd => cmd,
    };
    match c::FIELDS_BY_HAND.iter().find(|(name, _)| *name == cmd) {
        Some((_, fields)) => fields,
        None if cmd == "restart" => vramlab_shared::framework::RESTART_FIELDS,
        None => &[],
    }
}

/// Every field of every command, and the lesson annotations.
fn all_fields() -> Vec<&'static str> {
    let mut fields: Vec<&'static str> = commands()
        .into_iter()
        .flat_map(own_fields)
        .copied()
        .collect();
    fields.extend(c::ANNOTATION_KEYS);
    fields.sort_unstable();
    fields.dedup();
    fields
}

const NAMES: &[&str] = &["x", "y", "h", "model", "opt", "data", "sess", "loss", ""];

/// Values at the edges: zero, powers of two, the integer limits, negative,
/// fractional, huge floats, names, framework and GPU words, lists.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        prop::sample::select(vec![
            json!(0),
            json!(1),
            json!(2),
            json!(7),
            json!(64),
            json!(1000),
            json!(1u64 << 20),
            json!(1u64 << 31),
            json!(1u64 << 40),
            json!(1u64 << 53),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(-1),
            json!(0.5),
            json!(1e308),
            json!(-0.0),
            json!(true),
            json!(false),
            Value::Null,
            json!("pytorch"),
            json!("tensorflow"),
            json!("jax"),
            json!("t4"),
            json!("adam"),
            json!("sgd"),
            json!("float16"),
            json!("bfloat16"),
            json!("transformer"),
            json!("cnn"),
            json!("mlp"),
            json!("sdpa"),
            json!("eager"),
            json!("rmsnorm"),
            json!("list"),
            json!("[256:1,>:8]"),
            json!(":4096:8"),
            json!("é\u{0}\u{202e}"),
        ]),
        prop::sample::select(NAMES).prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(Value::Array)
    })
}

/// A command object: a known (or unknown) `cmd` and a few fields, nine in
/// ten of them its own.
fn command() -> impl Strategy<Value = Value> {
    prop::sample::select(commands()).prop_flat_map(|cmd| {
        let field = prop_oneof![
            9 => prop::sample::select(match own_fields(cmd) {
                [] => all_fields(),
                own => own.to_vec(),
            }),
            1 => prop::sample::select(all_fields()),
        ];
        prop::collection::vec((field, value()), 0..6).prop_map(move |fields| {
            let mut object = Map::new();
            object.insert("cmd".into(), json!(cmd));
            for (key, value) in fields {
                object.insert(key.into(), value);
            }
            Value::Object(object)
        })
    })
}

/// Half the sequences start with a model (an MLP, a transformer or a CNN),
/// an optimizer and data shaped for it, so that training commands find
/// them.
fn sequence() -> impl Strategy<Value = Vec<Value>> {
    let setup = prop_oneof![3 => Just(None), 1 => Just(Some(0usize)), 1 => Just(Some(1)), 1 => Just(Some(2))];
    (setup, prop::collection::vec(command(), 1..16)).prop_map(|(setup, mut cmds)| {
        let models = [
            (json!({"cmd":"model","name":"model"}), 784, 10),
            (
                json!({"cmd":"model","name":"model","kind":"transformer","layers":2,"width":32,"heads":2,"seq_len":16,"vocab":64}),
                16,
                64,
            ),
            (
                json!({"cmd":"model","name":"model","kind":"cnn","channels":1,"image_size":16,"blocks":2,"width":8,"classes":10}),
                256,
                10,
            ),
        ];
        if let Some((model, features, classes)) = setup.map(|i| models[i].clone()) {
            let setup = [
                model,
                json!({"cmd":"optimizer","name":"opt","model":"model"}),
                json!({"cmd":"data","name":"data","features":features,"classes":classes}),
            ];
            cmds.splice(0..0, setup);
        }
        cmds
    })
}

fn cases(default: u32) -> u32 {
    std::env::var("VRAMLAB_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Long runs stop after 20 steps, as `stop` would stop them.
fn engine() -> Engine {
    let mut engine = Engine::new_simulated();
    engine.set_progress_hook(Some(Box::new(
        |_: &mut Engine, p: &vramlab_shared::engine::Progress| p.done < 20,
    )));
    engine
}

#[test]
fn the_engine_survives_fuzzed_command_sequences() {
    let config = Config {
        cases: cases(400),
        failure_persistence: None,
        ..Config::default()
    };
    let started = Instant::now();
    let (run, ok) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let mut runner = TestRunner::new(config);
    runner
        .run(&sequence(), |sequence| {
            let mut engine = engine();
            for cmd in &sequence {
                let record = engine.run_line(&cmd.to_string());
                prop_assert!(record.ok || record.error.is_some(), "{cmd}: no result");
                if record.ok {
                    ok.set(ok.get() + 1);
                }
                run.set(run.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    println!(
        "figure: engine fuzz, {} commands in {} sequences ({} ran without error) in {:.1} s",
        run.get(),
        cases(400),
        ok.get(),
        started.elapsed().as_secs_f64()
    );
}

/// A seeded xorshift: the frames' mangling, the same every run.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// One random frame: a mangled valid message, a command with random fields,
/// a binary or empty frame, or one over the size limit.
fn frame(runner: &mut TestRunner, dice: &mut Dice, id: u64, limit: usize) -> Message {
    let cmd = command().new_tree(runner).unwrap().current();
    let valid = [
        json!({"type":"command","id":id,"command":cmd}),
        json!({"type":"snapshot"}),
        json!({"type":"export_snapshot"}),
        json!({"type":"stop"}),
        json!({"type":"subscribe"}),
        json!({"type":"ping","nonce":id}),
    ];
    let mut text = valid[dice.below(valid.len())].to_string().into_bytes();
    match dice.below(10) {
        0 => return Message::Binary(text.into()),
        1 => return Message::Text(String::new().into()),
        2 => return Message::Text("x".repeat(limit + 1).into()),
        3 => text.truncate(dice.below(text.len())),
        4 => {
            let at = dice.below(text.len());
            text[at] = dice.below(256) as u8;
        }
        _ => {}
    }
    Message::Text(String::from_utf8_lossy(&text).into_owned().into())
}

type Sink = futures::stream::SplitSink<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    Message,
>;

/// A new session's socket whose replies are read (and dropped) so the
/// server never waits on this client; `None` when the server refuses.
async fn connect(addr: std::net::SocketAddr) -> Option<Sink> {
    let (ws, _) = connect_async(format!("ws://{addr}/ws")).await.ok()?;
    let (sink, mut stream) = ws.split();
    tokio::spawn(async move { while let Some(Ok(_)) = stream.next().await {} });
    Some(sink)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_survives_fuzzed_frames() {
    let options = ServeOptions::default();
    let limit = options.limits.max_message_bytes as usize;
    let server = build(&options, select(DeviceChoice::Sim, 0).unwrap()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { serve(listener, server).await });
    let frames = u64::from(cases(400)) * 10;
    let (mut runner, mut dice) = (TestRunner::deterministic(), Dice(0x9e37_79b9_7f4a_7c15));
    let mut sockets = Vec::new();
    for _ in 0..4 {
        sockets.push(connect(addr).await);
    }
    let mut reconnects = 0;
    for id in 0..frames {
        let slot = (id % 4) as usize;
        let message = frame(&mut runner, &mut dice, id, limit);
        let sent = match sockets[slot].as_mut() {
            Some(sink) => sink.send(message).await.is_ok(),
            None => false,
        };
        if !sent {
            // The server closed this one (a bad frame may): a new one.
            reconnects += 1;
            sockets[slot] = connect(addr).await;
        }
    }
    // Still answering: health, and a fresh session's numbers.
    let health = get(&addr, "/healthz").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    drop(sockets);
    let (mut ws, _) = connect_async(format!("ws://{addr}/ws")).await.unwrap();
    let alloc = json!({"type":"command","id":1,"command":{"cmd":"alloc","name":"x","bytes":1000}});
    ws.send(Message::Text(alloc.to_string().into()))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "no result after the fuzzing");
        let next = tokio::time::timeout(Duration::from_secs(30), ws.next()).await;
        let Ok(Some(Ok(Message::Text(t)))) = next else {
            continue;
        };
        let m: Value = serde_json::from_str(&t).unwrap();
        if m["type"] == "result" && m["id"] == 1 {
            assert_eq!(m["stats"]["allocated_bytes"], 1024);
            break;
        }
    }
    println!("figure: websocket fuzz, {frames} frames over 4 connections ({reconnects} reopened), the server answering after");
}

/// A plain HTTP/1.1 GET: the status line, headers and body.
async fn get(addr: &std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}
