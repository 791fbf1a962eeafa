//! `vramlab serve` as a user starts it: the real binary on a free port,
//! answering `/healthz` and serving the web app.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use vramlab_tests::http_get as get;
use vramlab_tests::{free_port, http_get_bytes, root, serving, vramlab_bin, Process};

/// `vramlab serve` with `--dist`, or (`None`) with the web app built in,
/// started in a folder without one.
fn start(dist: Option<&std::path::Path>) -> (Process, u16) {
    start_with(dist, &[])
}

/// As [`start`], with more arguments.
fn start_with(dist: Option<&std::path::Path>, more: &[&str]) -> (Process, u16) {
    let port = free_port();
    let mut command = Command::new(vramlab_bin());
    command.args([
        "serve",
        "--addr",
        &format!("127.0.0.1:{port}"),
        "--device",
        "sim",
    ]);
    command.args(more);
    match dist {
        Some(dist) => command.arg("--dist").arg(dist),
        None => command.current_dir(std::env::temp_dir()),
    };
    (serving(command), port)
}

#[test]
fn healthz_reports_version_and_simulated_device() {
    let dir = std::env::temp_dir().join(format!("vramlab-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("index.html"), "<title>vramlab</title>").unwrap();
    let (_server, port) = start(Some(&dir));
    let (status, body) = get(port, "/healthz");
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["device"]["kind"], "simulated");
    assert_eq!(v["backend"], "sim");
    let (status, body) = get(port, "/");
    assert_eq!(status, 200);
    assert!(body.contains("<title>vramlab</title>"));
    let (status, _) = get(port, "/some/deep/link");
    assert_eq!(status, 200, "unknown paths fall back to the app");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn serves_the_built_web_app() {
    let dist = root().join("dist");
    if !dist.join("index.html").exists() {
        assert!(
            std::env::var_os("VRAMLAB_REQUIRE_BROWSER").is_none(),
            "dist/ is not built: run scripts/build-web"
        );
        eprintln!("skip: dist/ is not built (scripts/build-web)");
        return;
    }
    for dist in [Some(dist.as_path()), None] {
        let (_server, port) = start(dist);
        let (status, body) = get(port, "/");
        assert_eq!(status, 200);
        let wasm = body
            .split('"')
            .find(|s| s.ends_with("_bg.wasm"))
            .expect("index.html names the wasm module")
            .trim_start_matches("./");
        // "Will it fit?" is a page of its own under plan/.
        let (status, page) = get(port, "/plan/");
        assert_eq!(status, 200);
        assert!(
            page.contains("<title>Will it fit? — vramlab</title>"),
            "{page}"
        );
        // Your snapshot too; named without its slash, the folder is
        // where it goes.
        let (status, page) = get(port, "/snapshots/");
        assert_eq!(status, 200);
        assert!(
            page.contains("<title>Your snapshot — vramlab</title>"),
            "{page}"
        );
        let (status, head, _) = http_get_bytes(port, "/snapshots");
        assert_eq!(status, 307, "{head}");
        assert!(head.contains("location: /snapshots/"), "{head}");
        let (status, head, served) = http_get_bytes(port, &format!("/{wasm}"));
        assert_eq!(status, 200, "{wasm}");
        assert!(head.contains("content-type: application/wasm"), "{head}");
        // The very module scripts/build-web wrote, whether read from the
        // folder or carried inside the binary.
        assert!(served == std::fs::read(root().join("dist").join(wasm)).unwrap());
        // The app's own routes get index.html.
        let (status, body) = get(port, "/lessons/1");
        assert_eq!((status, body.contains("_bg.wasm")), (200, true));
    }
}

/// Probes and Prometheus reach `/healthz`, `/readyz` and `/metrics` on the
/// admin port without the access token; the public port still asks for it.
#[test]
fn the_admin_port_answers_probes_without_the_token() {
    let admin = free_port();
    let admin_addr = format!("127.0.0.1:{admin}");
    let (_server, port) = start_with(
        Some(&std::env::temp_dir()),
        &["--token", "s3cret", "--admin-addr", &admin_addr],
    );
    assert_eq!(get(port, "/metrics").0, 401);
    assert_eq!(get(port, "/readyz").0, 401);
    assert_eq!(get(admin, "/readyz"), (200, "ready\n".to_string()));
    let (status, body) = get(admin, "/metrics");
    assert_eq!(status, 200);
    // The refused request above is counted.
    assert!(
        body.contains("vramlab_refused_total{reason=\"token\"} 2"),
        "{body}"
    );
    let (status, body) = get(admin, "/healthz");
    assert_eq!(
        (status, body.contains("\"version\"")),
        (200, true),
        "{body}"
    );
    // Only the probes: no web app, no websocket there.
    assert_eq!(get(admin, "/ws").0, 404);
    assert_eq!(get(admin, "/").0, 404);
}

#[test]
fn json_logs_are_one_json_object_per_line() {
    let port = free_port();
    let mut child = Command::new(vramlab_bin())
        .args([
            "serve",
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--device",
            "sim",
        ])
        .args(["--log-format", "json"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("vramlab serve starts");
    let lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines {
        let line = line.unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"));
        let message = v["fields"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        seen.push(message.clone());
        if message.contains("serving on") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.iter().any(|m| m.contains("simulated GPU")), "{seen:?}");
}
