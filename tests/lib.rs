//! Helpers for the end-to-end tests: the real `vramlab` binary and the
//! lesson files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Each crate of the workspace with its source folder (`src`), by the
/// name its modules are known by above it: the engine's layers in
/// `crates/` re-exported by `vramlab-shared` (`train::kinds`,
/// `torch_snapshot::replay`; the lowest layers' modules at its root, so
/// no prefix), then the engine, the server, the page and the planner.
pub fn crate_sources() -> Vec<(String, PathBuf)> {
    let root = root();
    let mut out: Vec<(String, PathBuf)> = ["core", "device", "process"]
        .iter()
        .map(|c| (String::new(), root.join("crates").join(c).join("src")))
        .collect();
    for (name, dir) in [
        ("torch_snapshot", "torch-snapshot"),
        ("train", "train"),
        ("hf", "hf"),
        ("", "backend"),
        ("", "http"),
    ] {
        out.push((name.to_string(), root.join("crates").join(dir).join("src")));
    }
    for c in ["shared", "server", "frontend", "planner"] {
        out.push((String::new(), root.join(c).join("src")));
    }
    out
}

/// Every file under `dir` (its folders named in `skip` left out), each
/// with its path relative to `dir` as the parts it is made of.
pub fn files_under(dir: &Path, skip: &[&str]) -> Vec<(PathBuf, Vec<String>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).expect("a readable folder") {
            let path = entry.expect("an entry").path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if path.is_dir() {
                if !skip.contains(&name.as_ref()) {
                    stack.push(path);
                }
                continue;
            }
            let parts = (path.strip_prefix(dir).expect("under dir").components())
                .map(|c| c.as_os_str().to_string_lossy().to_string())
                .collect();
            files.push((path, parts));
        }
    }
    files
}

/// Path of the `vramlab` binary, built once per test process (a no-op when
/// it is up to date).
pub fn vramlab_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "-p",
                "vramlab-server",
                "--bin",
                "vramlab",
            ])
            .current_dir(root())
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building vramlab failed");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root().join("target"));
        target
            .join("debug")
            .join(format!("vramlab{}", std::env::consts::EXE_SUFFIX))
    })
}

/// Every lesson file, sorted by name.
pub fn lesson_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("tests/lessons"))
        .expect("tests/lessons exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    files
}

/// A PyTorch memory snapshot of a vramlab training run, as
/// `torch.cuda.memory._dump_snapshot()` writes it: an MLP of `layers`
/// hidden layers trained with Adam for `steps` steps, every event kept.
pub fn training_snapshot(layers: u32, steps: u32) -> Vec<u8> {
    session_snapshot(&[
        &format!(r#"{{"cmd":"model","name":"model","layers":{layers},"width":256}}"#),
        r#"{"cmd":"data","name":"data"}"#,
        r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}"#,
        &format!(
            r#"{{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":{steps}}}"#
        ),
    ])
}

/// The session of command `lines` on the simulated GPU, exported as a
/// snapshot pickle with every event kept.
pub fn session_snapshot(lines: &[&str]) -> Vec<u8> {
    use vramlab_shared::torch_snapshot::{export, write_pickle};
    let mut engine = vramlab_shared::Engine::new_simulated();
    engine.set_event_capacity(usize::MAX);
    for line in lines {
        let record = engine.run_line(line);
        assert!(record.ok, "{line}: {:?}", record.error);
    }
    write_pickle(&export::from_session(&engine.snapshot(usize::MAX)))
}

/// Lesson `name`'s session exported into `dir` as a snapshot.
pub fn export_lesson(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let pickle = dir.join(format!("{name}.pickle"));
    let lesson = root().join(format!("tests/lessons/{name}.jsonl"));
    let status = Command::new(vramlab_bin())
        .args(["run", "--device", "sim", "--export-snapshot"])
        .arg(&pickle)
        .arg(&lesson)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    pickle
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port()
}

/// A child process stopped when dropped: SIGTERM first (nginx's master
/// stops its workers only when asked), then killed after 5 s.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `vramlab serve` (as `command` says) and returns once it listens;
/// the rest of its log is read meanwhile, warnings and errors shown.
pub fn serving(mut command: Command) -> Process {
    use std::io::{BufRead, BufReader};
    let mut child = command
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("vramlab serve starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let listening = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("vramlab serving on"));
    assert!(listening, "vramlab serve exited before listening");
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if line.contains("WARN") || line.contains("ERROR") {
                eprintln!("{line}");
            }
        }
    });
    Process(child)
}

/// A plain HTTP/1.0 GET on loopback: the status, the head (lower case) and
/// the body's bytes.
pub fn http_get_bytes(port: u16, path: &str) -> (u16, String, Vec<u8>) {
    http_get_from(port, "127.0.0.1", path)
}

/// As [`http_get_bytes`], naming `host` in the `Host` header.
pub fn http_get_from(port: u16, host: &str, path: &str) -> (u16, String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(raw.len(), |i| i + 4);
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status = head[9..12].parse().unwrap();
    (status, head, raw[end..].to_vec())
}

/// As [`http_get_bytes`]: the status and the body as text.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    let (status, _, body) = http_get_bytes(port, path);
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `vramlab run - --device sim` with `input` on standard input (and `extra`
/// options): the JSON lines it printed, its standard error and exit code.
pub fn run_stdin(input: &str, extra: &[&str]) -> (Vec<serde_json::Value>, String, i32) {
    let mut child = Command::new(vramlab_bin())
        .args(["run", "-", "--device", "sim"])
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("vramlab starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let lines = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON output"))
        .collect();
    (
        lines,
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code().unwrap_or(-1),
    )
}

/// The snippets of `tests/python/` (`NN-name.py`, each with its `.out`), in order.
pub fn python_snippets() -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(root().join("tests/python"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "py"))
        .collect();
    files.sort();
    files
}

/// `vramlab python --device sim` on `source`: what it printed, and the
/// numbers it ended with (allocated, reserved, peak allocated, peak
/// reserved bytes, from its last line on standard error).
pub fn python_run(source: &str) -> (String, [u64; 4]) {
    let run = python_run_with(source, "{}");
    let numbers = run
        .numbers
        .unwrap_or_else(|| panic!("no numbers: {}", run.stderr));
    (run.stdout, numbers)
}

/// What `vramlab python` did with a source.
pub struct PythonRun {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    /// Allocated, reserved, peak allocated, peak reserved bytes at the end.
    pub numbers: Option<[u64; 4]>,
}

/// `vramlab python --device sim --settings SETTINGS` on `source`.
pub fn python_run_with(source: &str, settings: &str) -> PythonRun {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("vramlab-python-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cell.py");
    std::fs::write(&file, source).unwrap();
    let out = Command::new(vramlab_bin())
        .args(["python", "--device", "sim", "--settings", settings])
        .arg(&file)
        .output()
        .expect("vramlab python runs");
    std::fs::remove_dir_all(&dir).ok();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let numbers = stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("vramlab: "))
        .and_then(|last| {
            let n: Vec<u64> = last
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse().ok())
                .collect();
            n.try_into().ok()
        });
    PythonRun {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
        numbers,
    }
}

/// `s` recorded on two GPUs: device 0 one event busier, device 1 with an
/// out-of-memory after the same run.
pub fn two_gpus(
    s: &vramlab_shared::torch_snapshot::MemorySnapshot,
) -> vramlab_shared::torch_snapshot::MemorySnapshot {
    use vramlab_shared::torch_snapshot::{Action, TraceEntry};
    let rows: Vec<TraceEntry> = s.device_traces[0].iter().collect();
    let with = |extra: Vec<TraceEntry>| rows.iter().cloned().chain(extra).collect::<Vec<_>>();
    let mut two = s.clone();
    two.device_traces = vec![
        with(vec![TraceEntry::new(Action::Snapshot); 2]).into(),
        with(vec![TraceEntry {
            size: 1 << 40,
            ..TraceEntry::new(Action::Oom)
        }])
        .into(),
    ];
    let mut second = s.segments.clone();
    for segment in &mut second {
        segment.device = 1;
    }
    two.segments.extend(second);
    two
}
