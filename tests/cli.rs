//! The `vramlab` command line: bad input never stops a run nor changes the
//! engine, standard input works, options and errors are clear.

use std::process::{Command, Stdio};
use vramlab_shared::StepRecord;
use vramlab_tests::{run_stdin, vramlab_bin};

#[test]
fn every_malformed_line_is_an_error_that_names_the_problem_and_changes_nothing() {
    let cases: [(&str, &str, &str); 12] = [
        ("this is not json", "parse_error", "not JSON"),
        (
            "{\"cmd\":\"launch_rockets\"}",
            "invalid_command",
            "unknown command \"launch_rockets\"",
        ),
        ("{\"name\":\"x\"}", "invalid_command", "missing field `cmd`"),
        (
            "{\"cmd\":\"alloc\",\"bytes\":5}",
            "invalid_command",
            "missing field `name`",
        ),
        (
            "{\"cmd\":\"alloc\",\"name\":\"y\",\"bytes\":\"lots\"}",
            "invalid_command",
            "invalid type: string \"lots\"",
        ),
        (
            "{\"cmd\":\"alloc\",\"name\":\"y\",\"bytes\":-5}",
            "invalid_command",
            "invalid value: integer `-5`",
        ),
        (
            "{\"cmd\":\"alloc\",\"name\":\"y\",\"bytes\":4611686018427387904}",
            "out_of_memory",
            "Tried to allocate more than 1EB memory.",
        ),
        (
            "{\"cmd\":\"alloc\",\"name\":\"y\",\"bytes\":1e30}",
            "invalid_command",
            "invalid type: floating point",
        ),
        (
            "{\"cmd\":\"del\",\"name\":\"ghost\"}",
            "name_error",
            "name 'ghost' is not defined",
        ),
        (
            "{\"cmd\":\"hold\",\"name\":\"h\",\"items\":[\"x\",\"ghost\"]}",
            "name_error",
            "'ghost'",
        ),
        (
            "{\"cmd\":\"gc\",\"deep\":true}",
            "invalid_command",
            "unknown field `deep`",
        ),
        (
            "{\"cmd\":\"restart\",\"per_process_memory_fraction\":2}",
            "invalid_value",
            "Invalid fraction value: 2.0. Allowed range: 0~1",
        ),
    ];
    let mut input = String::from("{\"cmd\":\"alloc\",\"name\":\"x\",\"bytes\":1000}\n");
    for (line, _, _) in &cases {
        input.push_str(line);
        input.push('\n');
    }
    input.push_str("{\"cmd\":\"del\",\"name\":\"x\"}\n");
    let (lines, _, code) = run_stdin(&input, &[]);
    assert_eq!(code, 0);
    assert_eq!(
        lines.len(),
        cases.len() + 2,
        "the run went on after every error"
    );
    let first: StepRecord = serde_json::from_value(lines[0].clone()).unwrap();
    for (i, (line, kind, text)) in cases.iter().enumerate() {
        let r: StepRecord = serde_json::from_value(lines[i + 1].clone()).unwrap();
        assert!(!r.ok, "{line}");
        let err = r.error.unwrap();
        assert_eq!(
            serde_json::to_value(err.kind).unwrap(),
            serde_json::json!(kind),
            "{line}: {}",
            err.message
        );
        assert!(err.message.contains(text), "{line}: {}", err.message);
        assert_eq!(r.stats, first.stats, "{line} changed the engine");
        assert_eq!(r.step, i as u64 + 1);
    }
    let last: StepRecord = serde_json::from_value(lines.last().unwrap().clone()).unwrap();
    assert!(last.ok, "x survived every bad line");
    assert_eq!(last.stats.allocated_bytes, 0);
}

#[test]
fn snapshot_flag_prints_the_segment_map() {
    let (lines, _, code) = run_stdin(
        "{\"cmd\":\"alloc\",\"name\":\"x\",\"bytes\":1000}\n",
        &["--snapshot"],
    );
    assert_eq!(code, 0);
    assert_eq!(lines.len(), 2);
    let snap = &lines[1];
    // A block is [address, size, requested_size, state, owner, category].
    assert_eq!(snap["segments"][0]["blocks"][0][4], "x");
    assert_eq!(snap["segments"][0]["blocks"][0][3], "active_allocated");
    assert_eq!(snap["segments"][0]["pool"], "small");
    assert_eq!(snap["events"][1]["action"], "alloc");
}

#[test]
fn missing_file_and_cuda_are_clear_errors() {
    let out = Command::new(vramlab_bin())
        .args(["run", "/no/such/file.jsonl", "--device", "sim"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open command file"));
}

#[test]
fn device_cuda_without_a_gpu_is_a_clear_error_and_auto_falls_back() {
    let out = Command::new(vramlab_bin())
        .args(["run", "-", "--device", "cuda"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        // No GPU here: the reason is given, nothing panicked.
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--device cuda:"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let out = Command::new(vramlab_bin())
        .args(["run", "/dev/null", "--device", "auto", "--snapshot"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(snap["device"]["kind"] == "simulated" || snap["device"]["kind"] == "cuda");
}

#[test]
fn help_explains_options_and_their_environment_variables() {
    let out = Command::new(vramlab_bin())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--addr",
        "VRAMLAB_ADDR",
        "--dist",
        "VRAMLAB_DIST",
        "--device",
        "VRAMLAB_DEVICE",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
    let out = Command::new(vramlab_bin())
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("standard input"), "{help}");
}

#[test]
fn device_env_var_is_honoured() {
    let out = Command::new(vramlab_bin())
        .args(["run", "-"])
        .env("VRAMLAB_DEVICE", "bogus")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus"));
}

/// A lesson's session exported as a PyTorch memory snapshot, replayed by
/// `vramlab replay`: exactly as it ran, and with expandable segments on the
/// fragmentation lesson's small GPU.
#[test]
fn an_exported_session_replays_exactly_through_the_command_line() {
    let dir = std::env::temp_dir().join(format!("vramlab-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pickle = dir.join("session.pickle");
    let lesson = vramlab_tests::root().join("tests/lessons/05-fragmentation-oom.jsonl");
    let status = Command::new(vramlab_bin())
        .args(["run", "--device", "sim", "--export-snapshot"])
        .arg(&pickle)
        .arg(&lesson)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let out = replay(
        &pickle,
        &["--json", "--what-if", "expandable_segments=true"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["exact"], true, "{last}");
    assert_eq!(last["first_difference"], serde_json::Value::Null);
    let events = last["events"].as_u64().unwrap();
    assert_eq!(lines.len() as u64, events + 1);
    assert_eq!(lines[0]["action"], "segment_alloc");
    let what_if = &last["what_if"][0];
    assert_eq!(what_if["settings"], "expandable_segments=true");
    assert!(what_if["replay"]["peak_reserved_bytes"].as_u64().unwrap() > 0);
    let out = replay(&pickle, &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("exact replay: exact: every segment_alloc, segment_free and block placement as recorded"), "{text}");
    let not_a_snapshot = dir.join("notes.txt");
    std::fs::write(&not_a_snapshot, "hello").unwrap();
    let out = replay(&not_a_snapshot, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a PyTorch memory snapshot"));
    // A what-if saved as a snapshot replays exactly under its settings.
    let what_if = dir.join("what-if.pickle");
    let out = replay(
        &pickle,
        &[
            "--what-if",
            "max_split_size_mb=40",
            "--export-snapshot",
            what_if.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = replay(&what_if, &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("exact replay: exact:"), "{text}");
    let out = replay(&pickle, &["--export-snapshot", "x.pickle"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("add --what-if or --gpu"));
    memory_viz_reads(&[&pickle, &what_if]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `vramlab replay FILE ARGS…`.
fn replay(file: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(vramlab_bin())
        .arg("replay")
        .arg(file)
        .args(args)
        .output()
        .unwrap()
}

/// `python -m torch.cuda._memory_viz stats` and `trace` read each file,
/// where a Python with PyTorch is found (`VRAMLAB_PYTHON`, else
/// `python3`); elsewhere this part is skipped and says so.
fn memory_viz_reads(files: &[&std::path::Path]) {
    let python = std::env::var("VRAMLAB_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_torch = Command::new(&python)
        .args(["-c", "import torch"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_torch {
        eprintln!("skip: no PyTorch for {python}; memory_viz not run");
        return;
    }
    for file in files {
        for view in ["stats", "trace"] {
            let out = Command::new(&python)
                .args(["-m", "torch.cuda._memory_viz", view])
                .arg(file)
                .output()
                .unwrap();
            assert!(
                out.status.success() && !out.stdout.is_empty(),
                "{view} {}: {}",
                file.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
