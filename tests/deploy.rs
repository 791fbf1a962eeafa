//! The shipped deployment files for one machine: `deploy/vramlab.service`
//! passes `systemd-analyze verify` without a warning (where systemd is),
//! and the commands that `deploy/vramlab.service` and `deploy/Dockerfile`
//! start, run as written (on free loopback ports), serve the web app inside
//! the binary, say they are ready, and stop cleanly on SIGTERM.

use std::process::Command;
use std::time::{Duration, Instant};
use vramlab_tests::{free_port, http_get, root, serving, vramlab_bin, Process};

const INSTALLED: &str = "/usr/local/bin/vramlab";

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap()
}

/// `ExecStart`'s arguments after the binary.
fn exec_start_args(unit: &str) -> Vec<String> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart line");
    let mut words = line.split_whitespace();
    assert_eq!(words.next(), Some(INSTALLED));
    words.map(String::from).collect()
}

/// The image's command: `ENTRYPOINT` then `CMD` (both JSON arrays), after
/// the binary.
fn image_args(dockerfile: &str) -> Vec<String> {
    let array = |keyword: &str| -> Vec<String> {
        let line = dockerfile
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(keyword))
            .unwrap_or_else(|| panic!("a {keyword} line"));
        serde_json::from_str(line.trim()).expect("a JSON array")
    };
    let mut args = array("ENTRYPOINT");
    assert_eq!(args.remove(0), INSTALLED);
    args.extend(array("CMD"));
    args
}

/// Runs `vramlab` with `args`, its listening addresses moved to free
/// loopback ports; the public port and, if there is one, the admin port.
fn run_as_shipped(args: &[String]) -> (Process, u16, Option<u16>) {
    let (port, admin) = (free_port(), free_port());
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            a.replace("0.0.0.0:8080", &format!("127.0.0.1:{port}"))
                .replace("0.0.0.0:9090", &format!("127.0.0.1:{admin}"))
        })
        .collect();
    let has_admin = args.iter().any(|a| a.contains("--admin-addr"));
    let mut command = Command::new(vramlab_bin());
    command
        .args(&args)
        .env("VRAMLAB_DEVICE", "sim")
        // The web app comes from inside the binary, not from a folder here.
        .current_dir(std::env::temp_dir());
    (serving(command), port, has_admin.then_some(admin))
}

/// Ready, serving the page, and gone with exit status 0 after SIGTERM.
fn check_serves_and_stops(mut server: Process, port: u16, probes: u16) {
    assert_eq!(http_get(probes, "/readyz"), (200, "ready\n".into()));
    let (status, page) = http_get(port, "/");
    assert_eq!(status, 200);
    if root().join("dist/index.html").exists() {
        assert!(page.contains("_bg.wasm"), "{page}");
    }
    let pid = server.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

#[test]
fn the_systemd_unit_verifies_without_warnings() {
    let Ok(status) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("skip: no systemd-analyze here");
        return;
    };
    assert!(status.status.success());
    let dir = std::env::temp_dir().join(format!("vramlab-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let local =
        read("deploy/vramlab.service").replace(INSTALLED, &vramlab_bin().display().to_string());
    let path = dir.join("vramlab.service");
    std::fs::write(&path, local).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_units_command_serves_and_stops_on_sigterm() {
    let (server, port, admin) = run_as_shipped(&exec_start_args(&read("deploy/vramlab.service")));
    check_serves_and_stops(server, port, admin.unwrap_or(port));
}

#[test]
fn the_images_command_serves_probes_on_the_admin_port_and_stops_on_sigterm() {
    let dockerfile = read("deploy/Dockerfile");
    let (server, port, admin) = run_as_shipped(&image_args(&dockerfile));
    let admin = admin.expect("the image serves probes on an admin port");
    // The ports it says it exposes are the ones it listens on.
    assert!(dockerfile.contains("EXPOSE 8080 9090"));
    check_serves_and_stops(server, port, admin);
}

/// What the image's build stage runs exists here, and its final stage
/// copies the binary that `cargo build --release` writes.
#[test]
fn the_images_build_runs_the_repositorys_own_scripts() {
    let dockerfile = read("deploy/Dockerfile");
    for script in ["scripts/setup", "scripts/build-web"] {
        assert!(
            dockerfile.contains(&format!("{script} "))
                || dockerfile.contains(&format!("{script}\n"))
        );
        assert!(root().join(script).exists(), "{script}");
    }
    assert!(dockerfile.contains("cargo build --release --locked -p vramlab-server"));
    assert!(dockerfile.contains(&format!(
        "COPY --from=build /src/target/release/vramlab {INSTALLED}"
    )));
    let ignored = read(".dockerignore");
    for heavy in ["target", "dist", "tools/node_modules"] {
        assert!(ignored.lines().any(|l| l == heavy), "{heavy}");
    }
}
