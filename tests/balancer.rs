//! Three `vramlab serve` processes behind nginx, configured by the shipped
//! `deploy/nginx.conf` (its ports replaced): new clients spread over the
//! instances, reconnects and watch links reach the instance that holds the
//! session, a draining instance takes no new session but finishes its own
//! and exits, and a killed one loses only its own sessions, which its
//! clients are told. Skipped where nginx is missing, unless
//! VRAMLAB_REQUIRE_NGINX is set (the test command sets it).

mod socket;

use futures::SinkExt;
use serde_json::{json, Value};
use socket::{next, Socket};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;
use vramlab_tests::{free_port, root, serving, vramlab_bin, Process};

fn nginx() -> Option<PathBuf> {
    let found = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    if found.is_none() {
        assert!(
            std::env::var_os("VRAMLAB_REQUIRE_NGINX").is_none(),
            "the load-balancer test needs nginx (scripts/setup installs it)"
        );
        eprintln!("skip: nginx is missing");
    }
    found
}

/// `vramlab serve --instance-id NAME` on `port`, once it listens.
fn instance(name: &str, port: u16, extra: &[&str]) -> Process {
    let mut command = Command::new(vramlab_bin());
    command
        .args(["serve", "--device", "sim", "--instance-id", name, "--addr"])
        .arg(format!("127.0.0.1:{port}"))
        .args(extra);
    serving(command)
}

/// nginx with `deploy/nginx.conf`, its ports replaced by these.
fn balancer(nginx: &PathBuf, front: u16, ports: [u16; 3]) -> (Process, PathBuf) {
    let prefix = std::env::temp_dir().join(format!("vramlab-nginx-{}", std::process::id()));
    std::fs::create_dir_all(&prefix).unwrap();
    let mut conf = std::fs::read_to_string(root().join("deploy/nginx.conf")).unwrap();
    conf = conf.replace("127.0.0.1:8080", &format!("127.0.0.1:{front}"));
    for (i, port) in ports.iter().enumerate() {
        conf = conf.replace(
            &format!("127.0.0.1:900{}", i + 1),
            &format!("127.0.0.1:{port}"),
        );
    }
    std::fs::write(prefix.join("nginx.conf"), conf).unwrap();
    let child = Command::new(nginx)
        .arg("-p")
        .arg(&prefix)
        .args(["-c", "nginx.conf", "-e", "stderr"])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", front)).is_err() {
        assert!(Instant::now() < deadline, "nginx did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (Process(child), prefix)
}

/// Connects through the balancer; the first `hello` (or error).
async fn connect(front: u16, query: &str) -> (Socket, Value) {
    let (mut ws, _) = connect_async(format!("ws://127.0.0.1:{front}/ws{query}"))
        .await
        .unwrap();
    let first = next(&mut ws, "hello").await;
    (ws, first)
}

fn instance_of(id: &Value) -> String {
    id.as_str().unwrap().split('-').next().unwrap().to_string()
}

async fn readyz(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out[9..12].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_behind_nginx() {
    let Some(nginx) = nginx() else { return };
    let ports = [free_port(), free_port(), free_port()];
    let _i1 = instance("i1", ports[0], &[]);
    let mut i2 = instance("i2", ports[1], &[]);
    let mut i3 = instance(
        "i3",
        ports[2],
        &["--drain-secs", "30", "--session-ttl-secs", "1"],
    );
    let front = free_port();
    let (_nginx, prefix) = balancer(&nginx, front, ports);

    // New clients spread over the instances; each id names its instance.
    let mut owners = Vec::new();
    for _ in 0..6 {
        let (ws, hello) = connect(front, "").await;
        owners.push((ws, hello["session_id"].clone(), hello["watch_id"].clone()));
    }
    let mut used: Vec<String> = owners.iter().map(|o| instance_of(&o.1)).collect();
    used.sort();
    used.dedup();
    assert_eq!(used, ["i1", "i2", "i3"]);

    // Every reconnect and every watch link lands where its session lives.
    for (ws, id, watch) in &mut owners {
        let (mut again, hello) =
            connect(front, &format!("?session={}", id.as_str().unwrap())).await;
        assert_eq!(
            (hello["resumed"].as_bool(), &hello["session_id"]),
            (Some(true), &*id)
        );
        let (mut watcher, seen) =
            connect(front, &format!("?watch={}", watch.as_str().unwrap())).await;
        assert_eq!(seen["role"], "watcher");
        let alloc =
            json!({"type":"command","id":1,"command":{"cmd":"alloc","name":"x","bytes":1000}});
        again
            .send(Message::Text(alloc.to_string().into()))
            .await
            .unwrap();
        let result = next(&mut watcher, "result").await;
        assert_eq!(result["stats"]["allocated_bytes"], 1024);
        let _ = ws.close(None).await;
        let _ = again.close(None).await;
        let _ = watcher.close(None).await;
    }

    // i3 drains: not ready, no new session there, its own still reachable.
    let on_i3 = owners
        .iter()
        .find(|o| instance_of(&o.1) == "i3")
        .unwrap()
        .1
        .clone();
    let pid = i3.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while readyz(ports[2]).await != "503" {
        assert!(Instant::now() < deadline, "i3 never said it drains");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..6 {
        let (_ws, hello) = connect(front, "").await;
        assert_ne!(instance_of(&hello["session_id"]), "i3", "{hello}");
    }
    let (resumed, hello) = connect(front, &format!("?session={}", on_i3.as_str().unwrap())).await;
    assert_eq!(hello["resumed"], true, "{hello}");
    drop(resumed);
    // Its sessions end (TTL 1 s after their owners left): it exits.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = i3.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the drained instance did not exit"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status}");

    // i2 is killed: its clients are told their session is gone; i1's live on.
    i2.0.kill().unwrap();
    i2.0.wait().unwrap();
    for (_, id, _) in &owners {
        let (_ws, hello) = connect(front, &format!("?session={}", id.as_str().unwrap())).await;
        match instance_of(id).as_str() {
            "i1" => assert_eq!(hello["resumed"], true, "{hello}"),
            _ => assert_eq!(hello["error"]["kind"], "unknown_session", "{hello}"),
        }
    }
    let _ = std::fs::remove_dir_all(prefix);
}
