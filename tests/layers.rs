//! The module graph of each crate has no cycle at any depth: among the
//! modules of one parent (the crate's top-level modules, `train`'s,
//! `cell`'s …), what one names (through `crate::a::b`, `super::b`,
//! `self::b`, in `use` lists too; test code aside) must not lead back to it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use vramlab_tests::{crate_sources, files_under, root};

type Module = Vec<String>;

/// Every source file's module path (`train/kinds/step.rs` is
/// `train::kinds::step`, a `mod.rs` its folder's), with its non-test code.
fn sources(src: &Path) -> Vec<(Module, String)> {
    let mut files = Vec::new();
    for (path, mut module) in files_under(src, &[]) {
        let name = module.last().cloned().unwrap_or_default();
        // Test modules (`tests.rs`, `*_tests.rs`) may use anything.
        if !name.ends_with(".rs") || name.ends_with("tests.rs") {
            continue;
        }
        let stem = module.pop().unwrap_or_default();
        let stem = stem.trim_end_matches(".rs");
        if !matches!(stem, "mod" | "lib" | "main") {
            module.push(stem.to_string());
        }
        let text = std::fs::read_to_string(&path).expect("readable source");
        files.push((module, without_test_items(&text)));
    }
    files
}

/// `text` with each `#[cfg(test)]` item taken out (a `mod tests;`, a
/// `mod tests { … }`, a test-only `impl` or `fn` wherever it sits), and
/// nothing else: the code after a test item is read too.
fn without_test_items(text: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let item = &rest[at + MARK.len()..];
        let (brace, semi) = (item.find('{'), item.find(';'));
        let end = match (brace, semi) {
            (Some(b), Some(s)) if s < b => s + 1,
            (None, Some(s)) => s + 1,
            (Some(b), _) => {
                let mut depth = 0;
                (item[b..].char_indices())
                    .find(|&(_, c)| {
                        depth += match c {
                            '{' => 1,
                            '}' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .map_or(item.len(), |(j, _)| b + j + 1)
            }
            (None, None) => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// The paths `code` names from `module`, made absolute: `crate::a::b`,
/// `super::b`, `self::b`, each entry of a `{…}` list.
fn named_paths(module: &Module, code: &str) -> Vec<Module> {
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        for (i, _) in code.match_indices(start) {
            let before = i.checked_sub(1).map(|j| bytes[j] as char);
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let base: Module = match start {
                "crate::" => Vec::new(),
                "self::" => module.clone(),
                _ => module[..module.len().saturating_sub(1)].to_vec(),
            };
            parse_path(&code[i + start.len()..], base, &mut paths, module);
        }
    }
    paths
}

/// Reads `a::b::{c, d::e}` from `text` onto `base`, pushing each path.
fn parse_path(text: &str, mut base: Module, out: &mut Vec<Module>, module: &Module) {
    let mut rest = text;
    loop {
        if let Some(inner) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = inner
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(inner.len(), |(j, _)| j);
            let mut level = 0;
            let mut from = 0;
            let list = &inner[..end];
            for (j, c) in list.char_indices().chain([(list.len(), ',')]) {
                match c {
                    '{' => level += 1,
                    '}' => level -= 1,
                    ',' if level == 0 => {
                        parse_path(list[from..j].trim(), base.clone(), out, module);
                        from = j + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        match name.as_str() {
            "" => break,
            "super" => {
                base.pop();
            }
            "self" => {}
            _ => base.push(name.clone()),
        }
        rest = &rest[name.len()..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    if !base.is_empty() && base != *module {
        out.push(base);
    }
}

/// For each parent module, the graph among its children: child → the
/// siblings whose code its own code (at any depth below it) names.
fn sibling_graphs(src: &Path) -> BTreeMap<Module, BTreeMap<String, BTreeSet<String>>> {
    let files = sources(src);
    let modules: BTreeSet<Module> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graphs: BTreeMap<Module, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for m in &modules {
        if let Some((child, parent)) = m.split_last() {
            graphs
                .entry(parent.to_vec())
                .or_default()
                .entry(child.clone())
                .or_default();
        }
    }
    for (module, code) in &files {
        for path in named_paths(module, code) {
            // The deepest module the path names.
            let Some(target) = (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|p| modules.contains(p))
            else {
                continue;
            };
            // Where `module` and `target` part: both below one parent.
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common < module.len() && common < target.len() {
                let parent = module[..common].to_vec();
                let (from, to) = (module[common].clone(), target[common].clone());
                graphs
                    .entry(parent)
                    .or_default()
                    .entry(from)
                    .or_default()
                    .insert(to);
            }
        }
    }
    graphs
}

/// A cycle in the graph, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(pos) = path.iter().position(|n| n == node) {
            return Some(path[pos..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if graph.contains_key(next) {
                if let Some(cycle) = visit(next, graph, path, done) {
                    return Some(cycle);
                }
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_crate_has_an_import_cycle_at_any_depth() {
    let mut cycles = Vec::new();
    for (_, src) in crate_sources() {
        let krate = src.parent().expect("a crate's folder").display();
        assert!(!sources(&src).is_empty(), "{krate}: sources found");
        let graphs = sibling_graphs(&src);
        for (parent, graph) in &graphs {
            if let Some(cycle) = find_cycle(graph) {
                let at = parent.iter().map(|p| format!("{p}::")).collect::<String>();
                let cycle: Vec<String> = cycle.iter().map(|c| format!("{at}{c}")).collect();
                cycles.push(format!("{krate}: {}", cycle.join(" -> ")));
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "modules depend on each other in a loop:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn paths_are_read_from_any_depth() {
    let module: Module = vec!["cell".into(), "value".into()];
    let code = "use super::{names::Names, ops};\nuse crate::train::{kinds::step::Op, spec};\nself::inner::f();";
    let mut paths = named_paths(&module, code);
    paths.sort();
    let expect: Vec<Module> = [
        "cell::names::Names",
        "cell::ops",
        "cell::value::inner::f",
        "train::kinds::step::Op",
        "train::spec",
    ]
    .iter()
    .map(|p| p.split("::").map(str::to_string).collect())
    .collect();
    assert_eq!(paths, expect);
}

/// The engine runs commands; the Python text each stands for is written
/// above it (`python`), read by the page and the tests, never by the
/// engine.
#[test]
fn the_engine_does_not_depend_on_the_python_writer() {
    let graphs = sibling_graphs(&root().join("shared").join("src"));
    let engine = &graphs[&Vec::new()]["engine"];
    assert!(!engine.contains("python"), "engine names: {engine:?}");
}

/// Code after a test item is read (a test `impl` above a module's
/// imports once hid `backend -> cuda -> cli` from this test).
#[test]
fn only_test_items_are_left_out() {
    let text = "use crate::a;\n#[cfg(test)]\nimpl X { fn f() { if y { crate::t::z(); } } }\nfn g() { crate::b::c(); }\n#[cfg(test)]\nmod tests;\nuse crate::d;\n#[cfg(test)]\nmod inner {\n    use crate::e;\n}\n";
    let code = without_test_items(text);
    let mut named: Vec<String> = named_paths(&vec!["m".to_string()], &code)
        .iter()
        .map(|p| p.join("::"))
        .collect();
    named.sort();
    assert_eq!(named, ["a", "b::c", "d"]);
}

/// A circle planted in a fixture crate (`tests/fixtures/circle`: `a`
/// names `b`, and `b` names `a` from a module nested in it behind a
/// feature) is found.
#[test]
fn a_planted_circle_is_found() {
    let graphs = sibling_graphs(&root().join("tests/fixtures/circle/src"));
    let cycle = find_cycle(&graphs[&Vec::new()]).expect("the planted circle");
    let mut cycle = cycle;
    cycle.sort();
    assert_eq!(cycle, ["a", "b"]);
}

/// The crates in their layers, lowest first: each depends (in its
/// Cargo.toml, so Cargo holds it) only on crates before it.
const LAYERS: [(&str, &str); 12] = [
    ("vramlab-core", "crates/core"),
    ("vramlab-device", "crates/device"),
    ("vramlab-process", "crates/process"),
    ("vramlab-torch-snapshot", "crates/torch-snapshot"),
    ("vramlab-train", "crates/train"),
    ("vramlab-hf", "crates/hf"),
    ("vramlab-shared", "shared"),
    ("vramlab-backend", "crates/backend"),
    ("vramlab-http", "crates/http"),
    ("vramlab-server", "server"),
    ("vramlab-planner", "planner"),
    ("vramlab-frontend", "frontend"),
];

#[test]
fn each_crate_depends_only_on_the_layers_below() {
    let mut up = Vec::new();
    for (at, (name, dir)) in LAYERS.iter().enumerate() {
        let manifest = std::fs::read_to_string(root().join(dir).join("Cargo.toml")).unwrap();
        let deps = manifest.split("[dependencies]").nth(1).unwrap_or_default();
        let deps = deps.split("\n[").next().unwrap_or_default();
        for line in deps.lines() {
            let dep = line.split(['=', '.', ' ']).next().unwrap_or_default();
            if let Some(below) = LAYERS.iter().position(|(n, _)| *n == dep) {
                if below >= at {
                    up.push(format!("{name} depends on {dep}"));
                }
            }
        }
    }
    let crates = std::fs::read_dir(root().join("crates")).unwrap().count();
    assert_eq!(crates, 8, "every crate of crates/ is in LAYERS");
    assert!(
        up.is_empty(),
        "a crate depends on one above it:\n{}",
        up.join("\n")
    );
}

/// The CUDA backend (`vramlab-backend`) and the HTTP server
/// (`vramlab-http`) are crates below the binary's (`vramlab-server`, whose
/// `cli` module is the command line): Cargo holds that they never read it,
/// and they are given their configuration, built once in `main`.
#[test]
fn the_backend_and_the_http_server_never_read_the_command_line() {
    let at = |name: &str| LAYERS.iter().position(|(n, _)| *n == name).unwrap();
    for below in ["vramlab-backend", "vramlab-http"] {
        assert!(
            at(below) < at("vramlab-server"),
            "{below} is below the binary"
        );
        let dir = root().join(LAYERS[at(below)].1).join("src");
        let graphs = sibling_graphs(&dir);
        assert!(
            !graphs[&Vec::new()].contains_key("cli"),
            "{below} has no cli"
        );
    }
    let server = sibling_graphs(&root().join("server").join("src"));
    assert!(
        server[&Vec::new()].contains_key("cli"),
        "the binary's cli is a module"
    );
}

#[test]
fn a_cycle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
    .collect();
    assert_eq!(find_cycle(&graph).map(|c| c.len()), Some(3));
}

/// A newcomer reads a file in one sitting: none of the crates' source files
/// is over 600 lines, its inline `mod tests { … }` and test files aside.
#[test]
fn no_source_file_is_over_600_lines() {
    let mut long = Vec::new();
    for (_, src) in crate_sources() {
        let mut stack = vec![src];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("source folder") {
                let path = entry.expect("entry").path();
                let name = path.file_name().unwrap().to_string_lossy().to_string();
                if path.is_dir() {
                    stack.push(path);
                } else if name.ends_with(".rs") && !name.ends_with("tests.rs") {
                    let text = std::fs::read_to_string(&path).expect("readable source");
                    let code = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or("");
                    let lines = code.lines().count();
                    if lines > 600 {
                        long.push(format!("{}: {lines} lines", path.display()));
                    }
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "files too long to read in one sitting:\n{}",
        long.join("\n")
    );
}

/// The shims' modules (`keras.model`, `torch.nn.engine` …) and what each
/// imports, at any depth of its code (an import inside a function too: it
/// only puts a circle off until the call). A module reading its own
/// package (`import torch` in `torch.nn`) is not counted: the package
/// defines what it reads before it imports the module.
fn shim_imports() -> BTreeMap<String, BTreeSet<String>> {
    let mut modules = BTreeMap::new();
    for (path, mut parts) in files_under(&root().join("shims"), &[]) {
        let Some(stem) = parts
            .pop()
            .and_then(|n| n.strip_suffix(".py").map(str::to_string))
        else {
            continue;
        };
        if stem != "__init__" {
            parts.push(stem);
        }
        modules.insert(parts.join("."), std::fs::read_to_string(&path).unwrap());
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, text) in &modules {
        let edges = graph.entry(module.clone()).or_default();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            let mut targets = Vec::new();
            if let Some(rest) = line.strip_prefix("from ") {
                let Some((base, names)) = rest.split_once(" import ") else {
                    continue;
                };
                for name in names.trim_matches(['(', ')', ' ']).split(',') {
                    let name = name.split(" as ").next().unwrap_or("").trim();
                    let sub = format!("{}.{name}", base.trim());
                    targets.push(match modules.contains_key(&sub) {
                        true => sub,
                        false => base.trim().to_string(),
                    });
                }
            } else if let Some(rest) = line.strip_prefix("import ") {
                for name in rest.split(',') {
                    targets.push(name.split(" as ").next().unwrap_or("").trim().to_string());
                }
            }
            for t in targets {
                let own_package = module.starts_with(&format!("{t}."));
                if modules.contains_key(&t) && t != *module && !own_package {
                    edges.insert(t);
                }
            }
        }
    }
    graph
}

/// No circle among the shims' modules (`keras.model`, `keras.losses` and
/// `tensorflow.tape` were one, held apart by imports inside functions).
#[test]
fn the_shims_import_no_circle() {
    let graph = shim_imports();
    assert!(graph.len() > 30, "{} shim modules found", graph.len());
    assert!(graph["keras.losses"].contains("keras.tensor"));
    assert_eq!(find_cycle(&graph), None);
}

/// The shims build every command through one helper
/// (`vramlab_shim.command`), and name only commands the engine's command
/// table declares (`Command::NAMES`).
#[test]
fn the_shims_send_only_commands_the_engine_declares() {
    let mut sent = BTreeSet::new();
    let mut by_hand = Vec::new();
    for (path, parts) in files_under(&root().join("shims"), &[]) {
        if !parts.last().is_some_and(|n| n.ends_with(".py")) {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a readable shim");
        let shown = parts.join("/");
        for (i, _) in text.match_indices(r#"{"cmd": "#) {
            let line = text[..i].lines().count();
            if shown != "vramlab_shim/__init__.py" || !text[i..].starts_with(r#"{"cmd": cmd"#) {
                by_hand.push(format!("{shown}:{line}"));
            }
        }
        for piece in text.split("command(\"").skip(1) {
            sent.insert(piece.split('"').next().unwrap_or_default().to_string());
        }
    }
    assert!(by_hand.is_empty(), "commands built by hand: {by_hand:?}");
    assert!(sent.len() > 20, "commands the shims send: {sent:?}");
    let unknown: Vec<&String> = (sent.iter())
        .filter(|n| !vramlab_shared::Command::NAMES.contains(&n.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "the engine declares no such command: {unknown:?}"
    );
}
