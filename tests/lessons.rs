//! Every lesson file, played through the real `vramlab run` binary, checked
//! exactly against its expectations, and identical to the engine in-process.

use std::process::Command;
use vramlab_shared::lesson::check_lesson;
use vramlab_shared::{Engine, StepRecord};
use vramlab_tests::{lesson_files, vramlab_bin};

/// The binary's output lines (each checked to be a step record), its
/// errors, and whether it succeeded.
fn run_binary(path: &std::path::Path) -> (Vec<String>, String, bool) {
    let out = Command::new(vramlab_bin())
        .args(["run", "--check", "--device", "sim"])
        .arg(path)
        .output()
        .expect("vramlab runs");
    let lines: Vec<String> = String::from_utf8(out.stdout)
        .expect("utf-8 output")
        .lines()
        .map(str::to_string)
        .collect();
    for l in &lines {
        let _: StepRecord = serde_json::from_str(l).expect("each output line is a step record");
    }
    (
        lines,
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

#[test]
fn every_lesson_passes_through_the_binary() {
    let files = lesson_files();
    assert!(
        files.len() >= 5,
        "expected the lesson files, found {files:?}"
    );
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let (records, stderr, ok) = run_binary(&path);
        assert!(ok, "{}: {stderr}", path.display());
        let commands = text.lines().filter(|l| !l.trim().is_empty()).count();
        assert_eq!(
            records.len(),
            commands,
            "{}: one line per command",
            path.display()
        );

        // The same lesson in-process gives the same records, and its
        // expectations hold there too.
        let mut engine = Engine::new_simulated();
        let mut in_process = Vec::new();
        let checked = check_lesson(&text, |line| {
            let r = engine.run_line(line);
            in_process.push(r.clone());
            r
        })
        .unwrap_or_else(|m| panic!("{}: {m:?}", path.display()));
        assert!(
            checked > 0,
            "{}: a lesson checks what it teaches",
            path.display()
        );
        // Compared as written (a number read back from text may differ
        // from the one written in its last bit).
        let written: Vec<String> = in_process
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        assert_eq!(records, written, "{}", path.display());
    }
}

#[test]
fn the_required_lessons_exist() {
    let names: Vec<String> = lesson_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for topic in [
        "del-vs-empty-cache",
        "cycle-needs-gc",
        "tensorflow-pool-stays",
        "jax-preallocation",
        "fragmentation-oom",
        "activations-and-batch-size",
        "optimizer-state",
        "set-to-none",
        "loss-history-leak",
        "keras-models-in-a-loop",
        "tf1-session-close",
        "last-exception",
        "checkpointing",
        "find-batch-size",
        "long-context-attention",
        "transformer-checkpointing",
        "cnn-image-size",
        "lora",
        "generate-kv-cache",
        "qlora",
        "vllm-kv-cache",
    ] {
        assert!(
            names.iter().any(|n| n.contains(topic)),
            "no lesson about {topic} in {names:?}"
        );
    }
}

#[test]
fn a_wrong_expectation_fails_the_check() {
    let dir = std::env::temp_dir().join(format!("vramlab-lesson-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("wrong.jsonl");
    std::fs::write(
        &path,
        "{\"cmd\":\"alloc\",\"name\":\"x\",\"bytes\":1,\"expect\":{\"reserved_bytes\":512}}\n",
    )
    .unwrap();
    let (records, stderr, ok) = run_binary(&path);
    assert!(!ok);
    assert_eq!(records.len(), 1);
    assert!(
        stderr.contains("reserved_bytes expected 512 but was 2097152"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
