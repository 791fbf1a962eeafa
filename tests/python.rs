//! Python as people write it (`tests/python/*.py`: classes, functions,
//! `__main__` guards, loops, exceptions, prints, `try/except
//! torch.cuda.OutOfMemoryError`), run by CPython through `vramlab python`:
//! every snippet runs to its last line and prints what `NN-name.out` says
//! (the numbers PyTorch's caching allocator gives on the default T4).

use std::process::Command;
use vramlab_tests::{python_snippets, vramlab_bin};

#[test]
fn every_snippet_runs_and_prints_what_a_gpu_prints() {
    let files = python_snippets();
    assert!(files.len() >= 30, "{} snippets", files.len());
    let mut wrong = Vec::new();
    for file in &files {
        let out = Command::new(vramlab_bin())
            .args(["python", "--device", "sim"])
            .arg(file)
            .output()
            .expect("vramlab python runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let expected = std::fs::read_to_string(file.with_extension("out")).unwrap_or_default();
        if !out.status.success() || stdout != expected {
            wrong.push(format!(
                "{}: exit {:?}\n--- printed\n{stdout}--- expected\n{expected}--- stderr\n{stderr}",
                file.display(),
                out.status.code()
            ));
        }
        assert!(stderr.contains("vramlab: allocated "), "{stderr}");
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `vramlab python --device sim` on `source`, written to a file of its own.
fn run_source(name: &str, source: &str) -> std::process::Output {
    let dir = std::env::temp_dir().join(format!("vramlab-py-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.py"));
    std::fs::write(&file, source).unwrap();
    let out = Command::new(vramlab_bin())
        .args(["python", "--device", "sim"])
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    out
}

/// Brackets nested deeper than CPython's tokenizer allows get its
/// SyntaxError at once, found before the parser recurses (the page's
/// CPython overflowed its stack there and answered nothing for 90 s).
#[test]
fn brackets_nested_too_deep_are_a_syntax_error() {
    let deep = format!(
        "x = {}{}\nprint('never')\n",
        "[".repeat(2_000),
        "]".repeat(2_000)
    );
    let out = run_source("deep", &deep);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("SyntaxError: too many nested parentheses"),
        "{stderr}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let fine = format!("x = {}1{}\nprint('ok')\n", "(".repeat(150), ")".repeat(150));
    let out = run_source("nested", &fine);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
}

#[test]
fn an_uncaught_error_prints_pythons_traceback_and_fails() {
    let out = run_source(
        "oom",
        "import torch\n\ndef grow():\n    return torch.empty(1024, 1024, 1024, 64, device='cuda')\n\nprint('before')\nx = grow()\nprint('never')\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "before\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("line 7, in <module>"), "{stderr}");
    assert!(stderr.contains("line 4, in grow"), "{stderr}");
    assert!(
        stderr.contains("torch.cuda.OutOfMemoryError: CUDA out of memory."),
        "{stderr}"
    );
}

#[test]
fn a_module_vramlab_has_not_runs_as_a_stand_in_with_a_note() {
    let out = run_source(
        "missing",
        "import torch\nimport vramlab_test_logger as logger\nfrom vramlab_test_bar import bar\n\nrun = logger.init(project='demo')\nfor i in bar(range(2)):\n    x = torch.empty(1024, device='cuda')\n    run.log({'allocated': torch.cuda.memory_allocated()})\nprint(i, torch.cuda.memory_allocated())\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1 4096\n", "{stderr}");
    assert!(out.status.success(), "{stderr}");
    for module in ["vramlab_test_logger", "vramlab_test_bar"] {
        assert!(
            stderr.contains(&format!(
                "vramlab: no `{module}` here: its calls do nothing, and the numbers may differ"
            )),
            "{stderr}"
        );
    }
}

/// A step too large to compute here runs shape-only: its loss prints as
/// not computed, not as `nan` (which reads as a divergence), and a sum of
/// such losses stays so, while its memory is the GPU's.
#[test]
fn a_shape_only_loss_prints_as_not_computed() {
    let out = run_source(
        "shape-only",
        "import torch\nimport torch.nn as nn\nmodel = nn.Sequential(nn.Linear(8192, 8192), nn.ReLU(), nn.Linear(8192, 10)).cuda()\nx = torch.randn(4096, 8192, device='cuda')\ny = torch.randint(0, 10, (4096,), device='cuda')\ntotal = 0.0\nloss = nn.functional.cross_entropy(model(x), y)\nloss.backward()\ntotal += loss.item()\nprint(f'loss {loss.item():.4f}')\nprint('total', total, total != total)\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said = "nan (shape-only step: its memory is exact, its loss not computed)";
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("loss {said}\ntotal {said} True\n"),
        "{stderr}"
    );
    assert!(out.status.success(), "{stderr}");
}

/// Every lesson as Python (`tests/lessons/NN-slug.kN.py`, one file per
/// kernel, what the page's "as Python in the cell" opens): each file is
/// what `vramlab lesson-python` writes for the lesson, and, run by CPython
/// with the shims under its kernel's settings, runs to its last line and
/// ends with the numbers the lesson's own commands end that kernel with.
#[test]
fn every_lesson_runs_as_python_with_the_lessons_numbers() {
    use vramlab_server::lesson_python::{cells_of, file_name};
    let mut failed = Vec::new();
    let mut files = 0;
    for lesson in vramlab_tests::lesson_files() {
        let text = std::fs::read_to_string(&lesson).unwrap();
        let lines: Vec<_> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let stem = lesson.file_stem().unwrap().to_string_lossy();
        for (k, cell) in cells_of(&text).into_iter().enumerate() {
            files += 1;
            let file = lesson.with_file_name(file_name(&stem, k + 1));
            let code = std::fs::read_to_string(&file).unwrap_or_default();
            assert_eq!(
                code,
                cell.code,
                "{} is not what `vramlab lesson-python {} --out tests/lessons` writes",
                file.display(),
                lesson.display()
            );
            let (records, _, _) =
                vramlab_tests::run_stdin(&lines[..cell.steps.end].join("\n"), &[]);
            let stats = &records.last().unwrap()["stats"];
            let want = ["allocated_bytes", "reserved_bytes"].map(|k| stats[k].as_u64().unwrap());
            let settings = serde_json::to_string(&cell.settings).unwrap();
            let run = vramlab_tests::python_run_with(&code, &settings);
            let got = run.numbers.map(|n| [n[0], n[1]]);
            if !run.success || got != Some(want) {
                failed.push(format!(
                    "{}: want {want:?}, got {got:?}\n{}",
                    file.display(),
                    run.stderr
                ));
            }
        }
    }
    assert!(files >= 29, "{files} files");
    assert!(
        failed.is_empty(),
        "{} differ:\n{}",
        failed.len(),
        failed.join("\n-----\n")
    );
}

/// What the controls write into the cell runs again with the numbers the
/// controls' own commands gave: an MLP through every training control
/// (forward, backward, step, zero_grad, a loop with accumulation,
/// autocast and checkpointing, a forward under no_grad), vramlab's GPT
/// with fused attention and a CNN side by side, a Hugging Face model's
/// generate (the Generate panel: a type, eager attention, either cache),
/// QLoRA's statements on a config of its own (saved, then loaded in 4 bits),
/// a Hugging Face model's loop accumulating onto gradients kept by
/// `zero_grad(set_to_none=False)`,
/// and Keras's fit.
#[test]
fn the_controls_code_runs_again_with_their_numbers() {
    use vramlab_server::lesson_python::cells_of;
    let sequences = [
        r#"{"cmd":"restart","framework":"pytorch"}
{"cmd":"model","name":"model","layers":2,"width":256}
{"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}
{"cmd":"data","name":"data"}
{"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":64}
{"cmd":"backward","name":"loss"}
{"cmd":"step","optimizer":"opt"}
{"cmd":"zero_grad","optimizer":"opt","set_to_none":false}
{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":3,"batch_size":64,"accumulate":2,"amp":"bfloat16","checkpointing":true}
{"cmd":"forward","name":"val","model":"model","data":"data","batch_size":32,"no_grad":true}"#,
        r#"{"cmd":"restart","framework":"pytorch"}
{"cmd":"model","name":"model","kind":"transformer","layers":2,"width":128,"heads":4,"seq_len":256,"vocab":1000}
{"cmd":"optimizer","name":"opt","model":"model","kind":"adamw"}
{"cmd":"data","name":"data","samples":1000,"features":256,"classes":1000}
{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":2,"batch_size":4,"attention":"sdpa"}
{"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":4}
{"cmd":"backward","name":"loss"}
{"cmd":"model","name":"cnn","kind":"cnn","channels":3,"image_size":32,"blocks":2,"width":32,"classes":10}
{"cmd":"optimizer","name":"copt","model":"cnn","kind":"sgd"}
{"cmd":"data","name":"images","samples":1000,"features":3072,"classes":10}
{"cmd":"train","model":"cnn","optimizer":"copt","data":"images","steps":2,"batch_size":16}"#,
        r#"{"cmd":"restart","framework":"pytorch","gpu":"rtx-4090"}
{"cmd":"model","name":"model","kind":"hf","config":"Qwen/Qwen2.5-0.5B","dtype":"float16"}
{"cmd":"generate","name":"out","model":"model","batch_size":4,"prompt_len":256,"new_tokens":32,"cache":"static","attention":"eager"}
{"cmd":"generate","name":"out","model":"model","batch_size":8,"prompt_len":64,"new_tokens":16}"#,
        r#"{"cmd":"restart","framework":"pytorch"}
{"cmd":"model","name":"model","kind":"hf","config":{"model_type":"llama","hidden_size":256,"intermediate_size":512,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":1000},"quantization":"nf4","dtype":"bfloat16"}
{"cmd":"prepare_kbit","model":"model"}
{"cmd":"lora","model":"model","rank":8,"all_linear":true}
{"cmd":"optimizer","name":"opt","model":"model","kind":"adamw"}
{"cmd":"alloc","name":"ids","shape":[2,64],"dtype":"int64"}
{"cmd":"forward","name":"loss","model":"model","data":"","batch_size":2,"checkpointing":true,"attention":"sdpa","batch":["ids","ids"]}
{"cmd":"backward","name":"loss"}
{"cmd":"step","optimizer":"opt"}
{"cmd":"zero_grad","optimizer":"opt","set_to_none":true}"#,
        r#"{"cmd":"restart","framework":"pytorch"}
{"cmd":"model","name":"model","kind":"hf","config":{"model_type":"llama","hidden_size":256,"intermediate_size":512,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":1000}}
{"cmd":"optimizer","name":"opt","model":"model","kind":"adamw"}
{"cmd":"data","name":"data","samples":64,"features":128,"classes":1000}
{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":2,"batch_size":4,"accumulate":2,"set_to_none":false}
{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"batch_size":4}
{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":2,"batch_size":4,"loss_history":"tensor"}
{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":2,"batch_size":4,"loss_history":"list"}"#,
        r#"{"cmd":"restart","framework":"tensorflow","allow_growth":true}
{"cmd":"model","name":"model","layers":2,"width":256}
{"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}
{"cmd":"data","name":"data"}
{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":3,"batch_size":64}"#,
    ];
    for text in sequences {
        let (records, _, _) = vramlab_tests::run_stdin(text, &[]);
        assert!(records.iter().all(|r| r["ok"] == true), "{records:?}");
        let stats = &records.last().unwrap()["stats"];
        let want = [
            "allocated_bytes",
            "reserved_bytes",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
        ]
        .map(|k| stats[k].as_u64().unwrap());
        let cells = cells_of(text);
        assert_eq!(cells.len(), 1);
        let settings = serde_json::to_string(&cells[0].settings).unwrap();
        let run = vramlab_tests::python_run_with(&cells[0].code, &settings);
        assert!(run.success, "{}\n{}", cells[0].code, run.stderr);
        // A Hugging Face model's peaks too: the shims' `generate` and step
        // are the engine's.
        let compared = if text.contains("\"kind\":\"hf\"") {
            4
        } else {
            2
        };
        let got = run.numbers.map(|n| n[..compared].to_vec());
        assert_eq!(got, Some(want[..compared].to_vec()), "{}", cells[0].code);
    }
}
