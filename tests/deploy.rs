//! The shipped deployment files: `deploy/vramlab.service` passes
//! `systemd-analyze verify` without a warning (where systemd is), and its
//! `ExecStart` line, run as written (on a free loopback port), serves, says
//! it is ready, and stops cleanly on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vramlab_tests::{root, vramlab_bin};

const INSTALLED: &str = "/usr/local/bin/vramlab";

fn unit() -> String {
    std::fs::read_to_string(root().join("deploy/vramlab.service")).unwrap()
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

#[test]
fn the_systemd_unit_verifies_without_warnings() {
    let Ok(status) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("skip: no systemd-analyze here");
        return;
    };
    assert!(status.status.success());
    let dir = std::env::temp_dir().join(format!("vramlab-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let local = unit().replace(INSTALLED, &vramlab_bin().display().to_string());
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let args: Vec<String> = exec_start_args(&unit())
        .into_iter()
        .map(|a| a.replace("0.0.0.0:8080", &format!("127.0.0.1:{port}")))
        .collect();
    let mut child = Command::new(vramlab_bin())
        .args(&args)
        .env("VRAMLAB_DEVICE", "sim")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    assert!(lines
        .by_ref()
        .any(|l| l.unwrap().contains("vramlab serving on")));
    std::thread::spawn(move || lines.for_each(drop));
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    assert!(
        response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
        "{response}"
    );
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}
