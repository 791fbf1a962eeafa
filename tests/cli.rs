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
    let pickle = vramlab_tests::export_lesson(&dir, "05-fragmentation-oom");
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
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("add --what-if, --gpu, --events or --around-peak"));
    memory_viz_reads(&[&pickle, &what_if]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `vramlab replay --events I..J`: a stretch of a recording replays as a
/// recording of its own (its state at I rebuilt from the recording), and
/// written out it is a file memory_viz opens and `replay` follows
/// exactly, wherever the stretch starts and ends.
#[test]
fn a_window_of_a_recording_replays_as_a_recording_of_its_own() {
    let dir = std::env::temp_dir().join(format!("vramlab-window-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pickle = vramlab_tests::export_lesson(&dir, "07-optimizer-state");
    windows_replay_exactly(&dir, &pickle);
    // The same run with expandable segments, written by a what-if: a
    // window from its middle starts with mapped ranges, seeded where they
    // were.
    let expandable = dir.join("expandable.pickle");
    let what_if = ["--what-if", "expandable_segments=true", "--export-snapshot"];
    let out = replay(
        &pickle,
        &[&what_if[..], &[expandable.to_str().unwrap()]].concat(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    windows_replay_exactly(&dir, &expandable);
    // A session run with expandable segments is written as PyTorch writes
    // one (`segment_map`, expandable ranges): lesson 15's.
    windows_replay_exactly(
        &dir,
        &vramlab_tests::export_lesson(&dir, "15-expandable-segments"),
    );
    // Around the peak: the window holds the whole recording's peak (its
    // events numbered from the window's first).
    let peak_line = |text: &str| {
        let line = text.lines().find(|l| l.contains("peak allocated"))?;
        let (before, after) = line.split_once(" (event ")?;
        Some(format!("{before}{}", after.split_once(')')?.1))
    };
    let whole = String::from_utf8(replay(&pickle, &[]).stdout).unwrap();
    let around = String::from_utf8(replay(&pickle, &["--around-peak", "5"]).stdout).unwrap();
    assert!(
        around.starts_with("events ")
            && around.contains("around the peak of allocated memory at event"),
        "{around}"
    );
    assert!(around.contains("exact replay: exact:"), "{around}");
    assert_eq!(peak_line(&around), peak_line(&whole));
    let out = replay(&pickle, &["--events", "100000.."]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hold none of the trace's"));
    let out = replay(&pickle, &["--events", "5..5"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("events are I..J or I.."));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Windows from the start, the middle and the end of the recording
/// `pickle` replay exactly, and written out, exactly again.
fn windows_replay_exactly(dir: &std::path::Path, pickle: &std::path::Path) {
    let lesson = pickle.display();
    let out = replay(pickle, &["--json"]);
    let events = String::from_utf8(out.stdout).unwrap().lines().count() - 1;
    assert!(events > 20, "{lesson}: {events} events");
    let window = dir.join("window.pickle");
    for (i, j) in [
        (0, 10),
        (10, events / 2),
        (events / 3, events),
        (events - 5, events + 100),
    ] {
        let range = format!("{i}..{j}");
        let out = replay(
            pickle,
            &[
                "--events",
                &range,
                "--export-snapshot",
                window.to_str().unwrap(),
            ],
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let shown = j.min(events) - i;
        assert!(
            text.starts_with(&format!("CUDA device 0: {shown} trace events")),
            "{lesson} {range}: {text}"
        );
        assert!(
            text.contains("exact replay: exact:"),
            "{lesson} {range}: {text}"
        );
        let text = String::from_utf8(replay(&window, &[]).stdout).unwrap();
        assert!(
            text.contains("exact replay: exact:"),
            "{lesson} {range}: {text}"
        );
        memory_viz_reads(&[&window]);
    }
}

/// A recording of two GPUs replays the one that ran out of memory unless
/// `--cuda-device` says otherwise, and lists both; fragmentation is read
/// at that out-of-memory. A what-if too small for what a mid-run
/// recording holds at its start says the smallest device to try.
#[test]
fn replay_opens_the_gpu_that_ran_out_and_says_what_a_small_what_if_needs() {
    use vramlab_shared::torch_snapshot;
    let dir = std::env::temp_dir().join(format!("vramlab-devices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let one = torch_snapshot::read(&vramlab_tests::training_snapshot(4, 3)).unwrap();
    let events = one.device_traces[0].len();
    let two = dir.join("two.pickle");
    let written = torch_snapshot::write_pickle(&vramlab_tests::two_gpus(&one));
    std::fs::write(&two, written).unwrap();
    let text = String::from_utf8(replay(&two, &[]).stdout).unwrap();
    let lines: Vec<&str> = text.lines().take(2).collect();
    assert_eq!(
        lines,
        [
            format!(
                "CUDA device 1: {} trace events, {} segments at the dump",
                events + 1,
                one.segments.len()
            ),
            format!(
                "  traced devices (--cuda-device): 0 ({} events), 1 ({} events, 1 out-of-memory)",
                events + 2,
                events + 1
            ),
        ]
    );
    assert!(
        text.contains(&format!("at the out-of-memory (event {events})")),
        "{text}"
    );
    let text = String::from_utf8(replay(&two, &["--cuda-device", "0"]).stdout).unwrap();
    assert!(text.starts_with("CUDA device 0:"), "{text}");
    assert!(text.contains("at the peak allocated (event "), "{text}");

    // One GPU traced (the others' traces empty): no list.
    let mut lone = vramlab_tests::two_gpus(&one);
    lone.device_traces[1] = Vec::<torch_snapshot::TraceEntry>::new().into();
    lone.segments.retain(|s| s.device == 0);
    let lone_file = dir.join("lone.pickle");
    std::fs::write(&lone_file, torch_snapshot::write_pickle(&lone)).unwrap();
    let text = String::from_utf8(replay(&lone_file, &[]).stdout).unwrap();
    assert!(
        text.starts_with("CUDA device 0:") && !text.contains("traced devices"),
        "{text}"
    );

    let mid = torch_snapshot::window::window(&one, 0, events / 2..events).unwrap();
    let mid_file = dir.join("mid.pickle");
    std::fs::write(&mid_file, torch_snapshot::write_pickle(&mid)).unwrap();
    let out = replay(&mid_file, &["--what-if", "device_total_bytes=1048576"]);
    assert!(!out.status.success());
    let said = String::from_utf8(out.stderr).unwrap();
    assert!(
        said.contains("live when the recording starts do not fit"),
        "{said}"
    );
    assert!(
        said.contains("on this 1 MiB device. The smallest that holds them: "),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `vramlab lesson-python`: a lesson of two kernels printed as two
/// files' code, each with the line that runs it, or written to a folder;
/// the files are what the page opens (`tests/lessons/*.kN.py`).
#[test]
fn lesson_python_writes_a_file_per_kernel() {
    let lesson = vramlab_tests::root().join("tests/lessons/07-optimizer-state.jsonl");
    let out = Command::new(vramlab_bin())
        .arg("lesson-python")
        .arg(&lesson)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let heads: Vec<&str> = text.lines().filter(|l| l.starts_with("# ---- ")).collect();
    assert_eq!(heads.len(), 2, "{text}");
    assert!(
        heads[0].starts_with("# ---- 07-optimizer-state.k1.py, steps 1-9: vramlab python --settings '{\"framework\":\"pytorch\""),
        "{}",
        heads[0]
    );
    assert!(
        text.contains("opt = torch.optim.Adam(model.parameters())"),
        "{text}"
    );
    let dir = std::env::temp_dir().join(format!("vramlab-lesson-python-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(vramlab_bin())
        .arg("lesson-python")
        .arg(&lesson)
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    for k in 1..=2 {
        let name = format!("07-optimizer-state.k{k}.py");
        let written = std::fs::read_to_string(dir.join(&name)).unwrap();
        let kept = std::fs::read_to_string(lesson.with_file_name(&name)).unwrap();
        assert_eq!(written, kept, "{name}");
    }
    let missing = Command::new(vramlab_bin())
        .args(["lesson-python", "no-such-lesson.jsonl"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read no-such-lesson.jsonl"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A recording of CUDA graphs (a captured step, on an H100): replay says
/// which private pool holds what at the dump, and replays it exactly.
#[test]
fn replay_names_the_cuda_graphs_private_pools() {
    let golden = vramlab_tests::root().join("tests/golden/snapshot-graph.pickle");
    let text = String::from_utf8(replay(&golden, &[]).stdout).unwrap();
    let lines: Vec<&str> = text.lines().take(3).collect();
    assert_eq!(
        lines,
        [
            "CUDA device 0: 337 trace events, 13 segments at the dump",
            "  CUDA graphs' private pools at the dump: (1, 0): 6 segments, 90.00 MiB reserved, 65.00 MiB allocated",
            "exact replay: exact: every segment_alloc, segment_free and block placement as recorded",
        ]
    );
}

/// A file over the 4 GB read is refused from its size, before it is read
/// (a sparse file: nothing is written to disk).
#[test]
fn replay_refuses_a_file_over_the_limit_before_reading_it() {
    let path = std::env::temp_dir().join(format!("vramlab-huge-{}.pickle", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    file.set_len((4 << 30) + 1).unwrap();
    let out = replay(&path, &[]);
    std::fs::remove_file(&path).ok();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the file is 4096 MB; snapshots of up to 4096 MB are read"),
        "{err}"
    );
}

/// `vramlab replay --fix`: the fragmentation lesson's recording runs
/// through in its room with expandable segments or `max_split_size_mb`
/// (and not with `roundup_power2_divisions`, whose rounding of the 700 MiB
/// tensor alone is too big); a recording whose live tensors alone exceed
/// the room gets the shortfall and the frames holding it; one with no
/// out-of-memory has nothing to fix.
#[test]
fn replay_fix_names_the_settings_that_avoid_the_out_of_memory() {
    let dir = std::env::temp_dir().join(format!("vramlab-fix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let export = |lesson: &str| vramlab_tests::export_lesson(&dir, lesson);
    let fragmented = export("05-fragmentation-oom");
    let text = String::from_utf8(replay(&fragmented, &["--fix"]).stdout).unwrap();
    for line in [
        "fix for the out-of-memory at event 17 (a request of 150.00 MiB):",
        "  room: 724.00 MiB, what the process held and the driver still had free",
        "  the recorded settings in that room: out of memory at event 17",
        "    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: peak reserved 700.00 MiB",
        "    PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128: peak reserved 700.00 MiB",
        "  still out of memory: roundup_power2_divisions=4 (event 1), roundup_power2_divisions=8 (event 10)",
        "  garbage_collection_threshold: not tried: PyTorch collects by it only under torch.cuda.set_per_process_memory_fraction, and this process ran without one",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
    assert!(!text.contains("no allocator setting runs it"), "{text}");
    // A what-if with no card or size replays in the room the fix searched
    // in, and so agrees with it: roundup_power2_divisions=4 runs out at
    // event 1 there (on memory as large as it needs, it ran through).
    let text =
        String::from_utf8(replay(&fragmented, &["--what-if", "roundup_power2_divisions=4"]).stdout)
            .unwrap();
    assert!(
        text.contains("2 out-of-memory error(s), the first at event 1: CUDA out of memory."),
        "{text}"
    );
    let out = replay(&fragmented, &["--fix", "--json"]);
    let last: serde_json::Value = serde_json::from_str(
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(last["fix"]["recorded"]["out_of_memory_at"], 17, "{last}");
    assert_eq!(last["fix"]["room_bytes"], 724u64 << 20);
    assert_eq!(
        last["fix"]["candidates"][0]["alloc_conf"],
        "expandable_segments:True"
    );
    assert_eq!(last["fix"]["candidates"][0]["runs"], true);
    // Recorded on an H100 under a 2 GiB memory fraction: the live tensors
    // alone and the request exceed the most the process held.
    let golden = vramlab_tests::root().join("tests/golden/snapshot-oom.pickle");
    let text = String::from_utf8(replay(&golden, &["--fix"]).stdout).unwrap();
    for line in [
        "  room: 1.98 GiB, the most the process held: it hit a limit of its own (a memory fraction), so at least this",
        "  no allocator setting runs it: the live tensors (1.63 GiB) and the request (512.00 MiB) exceed the room by 152.72 MiB; the frames holding the most then:",
        "    641.00 MiB  forward (tests/reference/step_trace.py:114)",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
    assert!(
        text.contains("as recorded, on a GPU with more room: the smallest, t4"),
        "{text}"
    );
    // The same in plain words first: where it ran out, what it asked for
    // with how much live, that no setting helps and by how much, the GPU
    // that runs it, the user's lines holding the most.
    assert!(
        text.lines().any(|l| l.starts_with("Ran out of memory at forward (tests/reference/step_trace.py:114) asking for 512.00 MiB with 1.63 GiB live, of at least 1.98 GiB the process could hold. No allocator setting helps: the live tensors and the request exceed the room by 152.72 MiB; hold less (a smaller batch, gradient checkpointing, freeing what the step no longer needs) or use a GPU with more room (t4 runs it). Held most by forward (tests/reference/step_trace.py:114) (641.00 MiB), ")),
        "{text}"
    );
    // Under its own fraction, PyTorch's garbage collection of cached
    // blocks is tried too; it cannot make room the live tensors take.
    assert!(
        text.contains("garbage_collection_threshold=0.6,per_process_memory_fraction="),
        "{text}"
    );
    let calm = export("01-del-vs-empty-cache");
    let text = String::from_utf8(replay(&calm, &["--fix"]).stdout).unwrap();
    assert!(
        text.contains("fix: the recording shows no out-of-memory; nothing to fix"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `vramlab diff A B` on exports of two sessions that differ in one line:
/// the batch doubled puts the difference in the batch and the activations
/// it scales; `total_loss += loss` against `.item()` in one tensor alive
/// at B's peak only.
#[test]
fn diff_attributes_the_peak_difference_to_the_frames_that_make_it() {
    let dir = std::env::temp_dir().join(format!("vramlab-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let export = |name: &str, train: &str| {
        let pickle = dir.join(format!("{name}.pickle"));
        let lines = [
            r#"{"cmd":"model","name":"model","layers":2,"width":1024,"input_dim":784,"classes":10}"#,
            r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}"#,
            r#"{"cmd":"data","name":"data","samples":4096,"features":784,"classes":10}"#,
            train,
        ];
        let mut child = Command::new(vramlab_bin())
            .args(["run", "-", "--device", "sim", "--export-snapshot"])
            .arg(&pickle)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(lines.join("\n").as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success());
        pickle
    };
    let train = |extra: &str| {
        format!(
            r#"{{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":2{extra}}}"#
        )
    };
    let small = export("b64", &train(r#","steps":2,"batch_size":64"#));
    let large = export("b128", &train(r#","steps":2,"batch_size":128"#));
    let out = Command::new(vramlab_bin())
        .arg("diff")
        .arg(&small)
        .arg(&large)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("B's peak is 452.50 KiB higher; 100% of it is in:"),
        "{text}"
    );
    assert!(
        text.contains("  +196.00 KiB  x (A 196.00 KiB, B 392.00 KiB)"),
        "{text}"
    );
    let out = Command::new(vramlab_bin())
        .args(["diff", "--json"])
        .arg(&small)
        .arg(&large)
        .output()
        .unwrap();
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (a, b) = (
        d["a"]["allocated_bytes"].as_u64().unwrap(),
        d["b"]["allocated_bytes"].as_u64().unwrap(),
    );
    let explained: i64 = (d["explaining"].as_array().unwrap().iter())
        .map(|f| f["b_bytes"].as_i64().unwrap() - f["a_bytes"].as_i64().unwrap())
        .sum();
    assert!(explained as f64 >= 0.9 * (b - a) as f64, "{d}");
    assert!(!d["a"]["timeline"].as_array().unwrap().is_empty());
    let item = export(
        "item",
        &train(r#","steps":20,"batch_size":64,"loss_history":"item""#),
    );
    let tensor = export(
        "tensor",
        &train(r#","steps":20,"batch_size":64,"loss_history":"tensor""#),
    );
    let out = Command::new(vramlab_bin())
        .arg("diff")
        .arg(&item)
        .arg(&tensor)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("  +512 bytes  total_loss (A 0 bytes, B 512 bytes)"),
        "{text}"
    );
    assert!(text.contains("  B only: 512 bytes  total_loss"), "{text}");
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

/// `vramlab plan`: a shipped shape and a config.json file answer the
/// question, as text (the verdict, the parts at the peak, the Python) and
/// as JSON; a batch that does not fit exits 1 and says where it ran out;
/// what is not modelled is refused by name.
#[test]
fn plan_answers_will_it_fit_for_a_shipped_shape_and_a_config_file() {
    let plan = |args: &[&str]| {
        Command::new(vramlab_bin())
            .arg("plan")
            .args(args)
            .output()
            .unwrap()
    };
    let out = plan(&[
        "Llama-3.1-8B",
        "--gpu",
        "rtx-4090",
        "--batch",
        "1",
        "--prompt",
        "512",
        "--new-tokens",
        "64",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.starts_with("Llama-3.1-8B (LlamaForCausalLM, 8.03B parameters) in bfloat16 on NVIDIA GeForce RTX 4090"),
        "{text}"
    );
    assert!(text.contains("\nFits: peak allocated "), "{text}");
    assert!(text.contains("  weights: 14.96 GiB\n"), "{text}");
    assert!(
        text.contains("config = AutoConfig.from_pretrained(\"meta-llama/Llama-3.1-8B\")"),
        "{text}"
    );
    // The peak by forward: the prefill's, then new tokens' up to the last.
    assert!(
        text.contains("\nPeak allocated by forward: prefill "),
        "{text}"
    );
    assert!(text.contains(", token 63 "), "{text}");
    // The shipped shapes, each with the config.json it copies.
    let list = String::from_utf8(plan(&["--list"]).stdout).unwrap();
    assert_eq!(list.lines().count(), 12, "{list}");
    assert!(list.contains("Llama-3.1-8B     LlamaForCausalLM   https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json"), "{list}");

    let out = plan(&[
        "Llama-3.1-8B",
        "--gpu",
        "rtx-4090",
        "--batch",
        "64",
        "--prompt",
        "2048",
        "--new-tokens",
        "8",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("Does not fit: out of memory in the prefill"),
        "{text}"
    );

    let dir = std::env::temp_dir().join(format!("vramlab-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        r#"{"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
            "tie_word_embeddings": true, "torch_dtype": "bfloat16"}"#,
    )
    .unwrap();
    let out = plan(&[
        config.to_str().unwrap(),
        "--gpu",
        "t4",
        "--json",
        "--new-tokens",
        "16",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["fits"], true, "{v}");
    // Qwen2.5-0.5B's 494,032,768 bfloat16 parameters and its two float32
    // frequency buffers, in 512-byte blocks.
    assert!(v["weights_bytes"].as_u64().unwrap() >= 988_065_536, "{v}");
    assert!(v["largest_batch"].as_u64().unwrap() > 1, "{v}");
    std::fs::remove_dir_all(&dir).ok();

    // The PyTorch release decides the products' cuBLAS workspaces: kept
    // from the first call in 2.11 (32 MiB on an H100), one a call in 2.15.
    let out = plan(&[
        "Qwen3-0.6B",
        "--gpu",
        "h100-80gb",
        "--batch",
        "4",
        "--prompt",
        "128",
        "--new-tokens",
        "8",
        "--torch",
        "2.11",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["torch"], "2.11", "{v}");
    assert_eq!(v["at_peak"]["cuBLAS workspaces"], 32 << 20, "{v}");
    assert!(v["python"].as_str().unwrap().contains("# 2.11"), "{v}");
    let out = plan(&["Qwen3-0.6B", "--torch", "2.12"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("torch"), "{err}");

    // Near the limit whether a batch fits alternates; the answer says so.
    let out = plan(&[
        "Qwen2.5-0.5B",
        "--gpu",
        "rtx-4090",
        "--dtype",
        "bfloat16",
        "--prompt",
        "512",
        "--new-tokens",
        "256",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(
            "Largest batch that fits: 864 (863 does not: near the limit whether it fits alternates)"
        ),
        "{text}"
    );

    // Fine-tuning an 8B model on a 24 GB card: every parameter with AdamW
    // does not fit (its state alone is twice the weights); LoRA with
    // gradient checkpointing does, and says how far it goes.
    let out = plan(&["Llama-3.1-8B", "--task", "train"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("Does not fit: out of memory while AdamW makes its state"),
        "{text}"
    );
    // It says what fits instead, cheapest first, and that not even a batch
    // of 1 fits as asked.
    assert!(
        text.contains("Largest batch that fits: none (not even 1)"),
        "{text}"
    );
    let offered = text
        .split("What fits instead, cheapest first (each planned):\n")
        .nth(1)
        .unwrap_or_default();
    let first: Vec<&str> = offered.lines().take(3).collect();
    assert!(
        first[0].starts_with("  LoRA of rank 16 (--task lora): peak reserved ")
            && first[1]
                .starts_with("  QLoRA: 4-bit weights and LoRA (--task qlora): peak reserved ")
            && first[2].starts_with(
                "  a GPU with more memory: NVIDIA A100-SXM4-80GB (--gpu a100-80gb): peak reserved "
            ),
        "{text}"
    );
    let out = plan(&[
        "Llama-3.1-8B",
        "--task",
        "lora",
        "--seq",
        "2048",
        "--checkpointing",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["task"].as_str(), v["fits"].as_bool()),
        (Some("lora"), Some(true)),
        "{v}"
    );
    // Rank 16 on q_proj and v_proj: 6,815,744 float32 parameters, their
    // `exp_avg` and `exp_avg_sq`.
    assert_eq!(v["optimizer_state_bytes"], 54_525_952, "{v}");
    assert!(v["at_peak"].get("KV cache").is_none(), "{v}");
    assert!(v["longest_seq"].as_u64().unwrap() > 2048, "{v}");
    let python = v["python"].as_str().unwrap();
    assert!(python.contains("gradient_checkpointing_enable"), "{python}");
    assert!(python.contains("LoraConfig(r=16"), "{python}");

    // bitsandbytes' AdamW8bit: every state in 8 bits with a float32
    // maximum per block of 256, and no foreach temporaries.
    let out = plan(&[
        "Llama-3.1-8B",
        "--task",
        "train",
        "--gpu",
        "h100-80gb",
        "--json",
    ]);
    let adamw: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let out = plan(&[
        "Llama-3.1-8B",
        "--task",
        "train",
        "--gpu",
        "h100-80gb",
        "--optimizer",
        "adamw8bit",
        "--json",
    ]);
    let eight: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(eight["optimizer"], "adamw8bit", "{eight}");
    let state = |v: &serde_json::Value| v["optimizer_state_bytes"].as_u64().unwrap();
    // torch.optim.AdamW keeps two bfloat16 states of bfloat16 weights: 4
    // bytes an element against about 2.03.
    assert!(state(&eight) * 100 < state(&adamw) * 51, "{eight}\n{adamw}");
    assert!(
        eight["python"]
            .as_str()
            .unwrap()
            .contains("bnb.optim.AdamW8bit"),
        "{eight}"
    );

    // QLoRA on the same card: 4-bit linear layers, the embeddings and the
    // output layer upcast to float32 by `prepare_model_for_kbit_training`,
    // LoRA on every linear layer, reentrant checkpointing by default.
    let out = plan(&["Llama-3.1-8B", "--task", "qlora", "--seq", "2048", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["task"].as_str(), v["fits"].as_bool()),
        (Some("qlora"), Some(true)),
        "{v}"
    );
    assert_eq!(
        (v["checkpointing"].as_bool(), v["quant_type"].as_str()),
        (Some(true), Some("nf4"))
    );
    // Rank 16 on the seven linear layers of 32 decoder layers: 41,943,040
    // float32 parameters, their `exp_avg` and `exp_avg_sq`.
    assert_eq!(v["optimizer_state_bytes"], 335_544_320, "{v}");
    let weights = v["weights_bytes"].as_u64().unwrap();
    // 6,979,321,856 weights in 4 bits with their maxima, 1,050,939,392
    // upcast to float32, the adapters.
    assert!(
        (7_900_000_000..8_000_000_000).contains(&weights),
        "{weights}"
    );
    let python = v["python"].as_str().unwrap();
    assert!(
        python.contains("prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)"),
        "{python}"
    );
    assert!(
        python.contains("bnb_4bit_use_double_quant=True"),
        "{python}"
    );
    assert!(python.contains("target_modules=\"all-linear\""), "{python}");
    let text = String::from_utf8(
        plan(&[
            "Llama-3.1-8B",
            "--task",
            "qlora",
            "--double-quant",
            "false",
            "--checkpointing",
            "false",
        ])
        .stdout,
    )
    .unwrap();
    assert!(
        text.contains("QLoRA rank 16 on every linear layer, nf4 weights)"),
        "{text}"
    );
    assert!(!text.contains("gradient checkpointing"), "{text}");

    // Mixed precision: float32 weights, the forward under autocast; the
    // bfloat16 copies autocast keeps of the weights have a row of their own.
    let out = plan(&[
        "Qwen2.5-0.5B",
        "--task",
        "train",
        "--amp",
        "bfloat16",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["dtype"].as_str(), v["amp"].as_str()),
        (Some("float32"), Some("bfloat16")),
        "{v}"
    );
    assert!(v["at_peak"]["autocast's weight copies"].is_u64(), "{v}");
    let python = v["python"].as_str().unwrap();
    assert!(
        python.contains("with torch.autocast(\"cuda\", dtype=torch.bfloat16):"),
        "{python}"
    );
    // QLoRA under autocast: loaded and computing in the config's bfloat16,
    // as the recipe does; autocast's copies of the float32 weights it
    // leaves (the output layer's, LoRA's) have their row.
    let out = plan(&[
        "Llama-3.1-8B",
        "--task",
        "qlora",
        "--seq",
        "2048",
        "--amp",
        "bfloat16",
        "--json",
    ]);
    let amp: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            amp["task"].as_str(),
            amp["amp"].as_str(),
            amp["fits"].as_bool()
        ),
        (Some("qlora"), Some("bfloat16"), Some(true)),
        "{amp}"
    );
    assert_eq!(amp["dtype"], "bfloat16", "{amp}");
    let python = amp["python"].as_str().unwrap();
    assert!(
        python.contains("bnb_4bit_compute_dtype=torch.bfloat16"),
        "{python}"
    );
    assert!(
        amp["at_peak"]["autocast's weight copies"].as_u64().unwrap() > 0,
        "{amp}"
    );
    let out = plan(&["Qwen2.5-0.5B", "--amp", "bfloat16"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("`amp` is for training tasks"));

    // Served by vLLM on the default RTX 4090: at the model's 131,072
    // positions it does not start (exit 1, vLLM's own message); at 32,768
    // it does, and the same server's command line follows.
    let out = plan(&["Llama-3.1-8B", "--task", "serve"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(
            "Does not start: To serve at least one request with the model's max seq len (131072)"
        ),
        "{text}"
    );
    let out = plan(&[
        "Llama-3.1-8B",
        "--task",
        "serve",
        "--max-model-len",
        "32768",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Available KV cache memory: "), "{text}");
    assert!(
        text.ends_with("vllm serve meta-llama/Llama-3.1-8B --max-model-len 32768\n"),
        "{text}"
    );
}
