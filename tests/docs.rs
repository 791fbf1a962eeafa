//! What the documentation names is there: every file path and every
//! vramlab module path (`hf::plan::load`, `engine::Engine`) cited
//! in backticks in README.md, ARCHITECTURE.md and docs/ names a file or a
//! module of this repository, and the items after the module in it. (A
//! citation of upstream code, `torch/cuda/memory.py`, is not ours to
//! check.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use vramlab_tests::{crate_sources, files_under, root};

/// Upstream code the docs cite by path.
const UPSTREAM: [&str; 12] = [
    "torch/",
    "vllm/",
    "tools/autograd/",
    "transformers/",
    "peft/",
    "bitsandbytes/",
    "jax/",
    "c10/",
    "aten/",
    "tensorflow/",
    "xla/",
    "keras/",
];

/// Every file of the repository (its build outputs and packages aside),
/// relative to the root.
fn repository_files() -> Vec<String> {
    let skip = ["target", "node_modules", "dist", ".git"];
    (files_under(&root(), &skip).into_iter())
        .map(|(_, parts)| parts.join("/"))
        .collect()
}

/// A crate's modules: each as its path and the source files it is
/// (its file, a folder's `mod.rs`, and its `*_tests.rs` beside it).
fn modules() -> Vec<(Vec<String>, Vec<PathBuf>)> {
    let mut out = Vec::new();
    for (name, src) in crate_sources() {
        for (path, parts) in files_under(&src, &[]) {
            let mut module: Vec<String> = name.split_terminator("::").map(str::to_string).collect();
            module.extend(parts);
            let Some(stem) = module
                .pop()
                .and_then(|n| n.strip_suffix(".rs").map(str::to_string))
            else {
                continue;
            };
            if !["mod", "lib", "main"].contains(&stem.as_str()) {
                module.push(stem.trim_end_matches("_tests").to_string());
            }
            out.push((module, vec![path]));
        }
    }
    out
}

/// Whether `parts` (a path cited from anywhere in the house) names a
/// module whose path ends so, with the rest as names in its sources.
fn resolves(parts: &[String], modules: &[(Vec<String>, Vec<PathBuf>)]) -> bool {
    (1..=parts.len()).rev().any(|k| {
        let (head, rest) = parts.split_at(k);
        let sources: Vec<&PathBuf> = (modules.iter())
            .filter(|(m, _)| m.ends_with(head))
            .flat_map(|(_, files)| files)
            .collect();
        if sources.is_empty() {
            return false;
        }
        let text: String = (sources.iter())
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect();
        rest.iter().all(|name| {
            name == "tests"
                || text
                    .match_indices(name.as_str())
                    .any(|(i, _)| is_word_at(&text, i, name.len()))
        })
    })
}

fn is_word_at(text: &str, at: usize, len: usize) -> bool {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    !word(text[..at].chars().next_back()) && !word(text[at + len..].chars().next())
}

/// The backticked spans of `text`.
fn cited(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn is_file_path(s: &str) -> bool {
    let extensions = [
        ".rs", ".py", ".sh", ".md", ".json", ".jsonl", ".toml", ".yaml", ".yml", ".html", ".js",
        ".css", ".txt", ".pickle",
    ];
    s.contains('/')
        && !s.starts_with(['/', '.', '~', '$'])
        && !s.contains("://")
        && !s.contains(char::is_whitespace)
        && !s.contains(['*', '{', '<', '?', '='])
        && extensions.iter().any(|e| s.ends_with(e))
}

fn is_module_path(s: &str, ours: &BTreeSet<String>) -> bool {
    let mut parts = s.split("::");
    let first = parts.next().unwrap_or_default();
    s.contains("::")
        && s.split("::")
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || c == '_'))
        && ours.contains(first)
}

#[test]
fn every_path_the_docs_cite_is_there() {
    let files = repository_files();
    let modules = modules();
    // Module names of ours, so that upstream paths (`torch::…`) are left.
    let mut ours: BTreeSet<String> = (modules.iter())
        .flat_map(|(m, _)| m.first().cloned())
        .collect();
    ours.extend(["vramlab_shared", "vramlab_server"].map(String::from));
    for upstream in [
        "std", "serde", "tokio", "axum", "tracing", "torch", "tf", "jax",
    ] {
        ours.remove(upstream);
    }
    let mut docs = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        let name = doc.strip_prefix(root()).unwrap().display().to_string();
        for span in cited(&text) {
            let span = span.trim_end_matches(['.', ',', ';', ':']);
            if is_file_path(span) {
                if UPSTREAM.iter().any(|u| span.starts_with(u)) || span.contains("NN-") {
                    continue;
                }
                checked += 1;
                let found = files
                    .iter()
                    .any(|f| f == span || f.ends_with(&format!("/{span}")));
                if !found {
                    missing.push(format!("{name}: the file `{span}`"));
                }
            } else if is_module_path(span, &ours) {
                checked += 1;
                let mut parts: Vec<String> = span.split("::").map(String::from).collect();
                if parts[0].starts_with("vramlab_") {
                    parts.remove(0);
                }
                if !resolves(&parts, &modules) {
                    missing.push(format!("{name}: the module path `{span}`"));
                }
            }
        }
    }
    println!("figure: {checked} paths cited in the docs, each there");
    assert!(checked > 150, "{checked} citations found");
    assert!(
        missing.is_empty(),
        "cited but not there:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_path_that_is_gone_is_found() {
    let modules = modules();
    let path = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    assert!(resolves(&path("hf::plan::load::quantize_4bit"), &modules));
    assert!(resolves(&path("torch_snapshot::pickle::machine"), &modules));
    assert!(!resolves(&path("hf::plan::load_4bit"), &modules));
    assert!(!resolves(&path("engine::no_such_module"), &modules));
    assert!(Path::new(&root())
        .join("shared/src/protocol/mod.rs")
        .exists());
}

/// The rows of the table under `heading` in `text`: each row's first cell.
fn first_cells<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    let section = text.split(heading).nth(1).unwrap_or_default();
    (section.lines().skip_while(|l| !l.starts_with('|')))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .filter_map(|l| l.split('|').nth(1))
        .collect()
}

/// docs/protocol.md's tables name every message the protocol declares
/// (`ClientMessage::TYPES`, `ServerMessage::TYPES`), and no other.
#[test]
fn the_protocol_page_names_every_message_declared() {
    use vramlab_shared::protocol::{ClientMessage, ServerMessage};
    let text = std::fs::read_to_string(root().join("docs/protocol.md")).unwrap();
    let mut client: Vec<String> = (first_cells(&text, "## Client to server").iter())
        .flat_map(|cell| cell.split(r#"{"type":""#).skip(1))
        .filter_map(|rest| rest.split('"').next())
        .map(String::from)
        .collect();
    let mut server: Vec<String> = (first_cells(&text, "## Server to client").iter())
        .map(|cell| cell.trim().trim_matches('`').to_string())
        .collect();
    let mut want_client: Vec<String> = ClientMessage::TYPES.iter().map(|t| t.to_string()).collect();
    let mut want_server: Vec<String> = ServerMessage::TYPES.iter().map(|t| t.to_string()).collect();
    for list in [&mut client, &mut server, &mut want_client, &mut want_server] {
        list.sort();
    }
    assert_eq!(client, want_client, "client messages in docs/protocol.md");
    assert_eq!(server, want_server, "server messages in docs/protocol.md");
}

/// docs/cli.md's table of commands has a row for every command the
/// command table declares (`Command::NAMES`).
#[test]
fn the_command_line_page_shows_every_command() {
    let text = std::fs::read_to_string(root().join("docs/cli.md")).unwrap();
    let shown: String = first_cells(&text, "## Commands").concat();
    let missing: Vec<&str> = (vramlab_shared::Command::NAMES.iter())
        .filter(|n| !shown.contains(&format!(r#"`{{"cmd":"{n}""#)))
        .copied()
        .collect();
    assert!(
        missing.is_empty(),
        "commands docs/cli.md does not show: {missing:?}"
    );
}

/// The page and the cell's Python speak the messages declared once in
/// `protocol::python_worker`: `shims/vramlab_shim/messages.py` is written
/// from that declaration (`VRAMLAB_WRITE_MESSAGES=1` writes it again),
/// docs/protocol.md's table names each message, and neither the shims nor
/// the worker's JavaScript build one by hand.
#[test]
fn the_cell_pythons_messages_are_declared_once() {
    use vramlab_shared::protocol::python_worker::{python_module, FromPython, ToPython};
    let path = root().join("shims/vramlab_shim/messages.py");
    let want = python_module();
    if std::env::var_os("VRAMLAB_WRITE_MESSAGES").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not what the declaration writes: run this test with VRAMLAB_WRITE_MESSAGES=1",
        path.display()
    );
    let text = std::fs::read_to_string(root().join("docs/protocol.md")).unwrap();
    let mut shown: Vec<String> = (first_cells(&text, "## The cell's Python").iter())
        .map(|cell| cell.trim().trim_matches('`').to_string())
        .collect();
    let mut declared: Vec<String> = (ToPython::SHAPES.iter().chain(FromPython::SHAPES))
        .map(|s| s.tag.to_string())
        .collect();
    shown.sort();
    declared.sort();
    assert_eq!(
        shown, declared,
        "the cell's Python's messages in docs/protocol.md"
    );
    for file in ["runner.py", "__init__.py"] {
        let code = std::fs::read_to_string(root().join("shims/vramlab_shim").join(file)).unwrap();
        assert!(!code.contains("emit({"), "{file} builds a message by hand");
    }
    let build = std::fs::read_to_string(root().join("scripts/build-web")).unwrap();
    let worker = build
        .split("python-worker.js\" <<EOF")
        .nth(1)
        .unwrap_or_default();
    let worker = worker.split("\nEOF\n").next().unwrap_or_default();
    assert!(worker.contains("emit: (m) => postMessage(m)"), "{worker}");
    assert_eq!(
        worker.matches("postMessage(").count(),
        1,
        "the worker's JavaScript writes a message: {worker}"
    );
}
