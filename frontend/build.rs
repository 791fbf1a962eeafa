//! Builds the lesson list from tests/lessons/ so that every lesson file the
//! tests play is in the page, without a second list to keep in step: each
//! lesson's question and summary, and the versions of the files the page
//! fetches when the lesson opens (its commands, `NN-slug.jsonl`, its words
//! for the recap, `NN-slug.md`, and its Python, `NN-slug.kN.py`, which
//! scripts/build-web copies);
//! and the version of each piece of advice's code (`advice/ID.py`).

use std::fmt::Write;
use std::path::Path;

/// A lesson's words, `NN-slug.md` beside its commands: `# question`, a
/// summary, then `## What you saw` and the recap.
fn read_words(path: &Path) -> (String, String, String) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|_| {
        panic!(
            "every lesson needs its words: {} is missing",
            path.display()
        )
    });
    let (head, recap) = text
        .split_once("## What you saw")
        .unwrap_or_else(|| panic!("{}: no '## What you saw' section", path.display()));
    let head = head.trim();
    let (question, summary) = head.split_once('\n').unwrap_or((head, ""));
    let question = question
        .strip_prefix("# ")
        .unwrap_or_else(|| panic!("{}: the first line is '# question'", path.display()));
    let join = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    (join(question), join(summary), join(recap))
}

/// FNV-1a, 64 bits: a changed commands file gets a new URL (the web app's
/// files are cached for good).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/lessons");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut slugs: Vec<String> = std::fs::read_dir(&dir)
        .expect("tests/lessons exists")
        .filter_map(|e| {
            let path = e.ok()?.path();
            if path.extension()? != "jsonl" {
                return None;
            }
            Some(path.file_stem()?.to_string_lossy().into_owned())
        })
        .collect();
    slugs.sort();
    let mut out = String::from("pub const LESSONS: &[Lesson] = &[\n");
    for slug in &slugs {
        let file = dir.join(format!("{slug}.jsonl"));
        let words = dir.join(format!("{slug}.md"));
        println!("cargo:rerun-if-changed={}", file.display());
        println!("cargo:rerun-if-changed={}", words.display());
        let (question, summary, _) = read_words(&words);
        let version =
            |path: &Path| format!("{:016x}", fnv1a(&std::fs::read(path).expect("lesson file")));
        let (commands, recap) = (version(&file), version(&words));
        // The lesson as Python, a file per kernel (`NN-slug.k1.py`, …).
        let python: Vec<String> = (1..)
            .map(|k| dir.join(format!("{slug}.k{k}.py")))
            .take_while(|p| p.exists())
            .map(|p| {
                println!("cargo:rerun-if-changed={}", p.display());
                version(&p)
            })
            .collect();
        writeln!(
            out,
            "    Lesson {{ slug: {slug:?}, question: {question:?}, summary: {summary:?}, version: {commands:?}, recap: {recap:?}, python: &{python:?} }},",
        )
        .unwrap();
    }
    out.push_str("];\n");
    // Each piece of advice's code file and its version, by id.
    let advice = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/src/advice");
    println!("cargo:rerun-if-changed={}", advice.display());
    let mut files: Vec<_> = std::fs::read_dir(&advice)
        .expect("shared/src/advice exists")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "py"))
        .collect();
    files.sort();
    out.push_str("/// Where advice `id`'s code is, its version in the URL.\n");
    out.push_str("pub fn advice_url(id: &str) -> &'static str {\n    match id {\n");
    for file in files {
        println!("cargo:rerun-if-changed={}", file.display());
        let id = file.file_stem().unwrap().to_string_lossy();
        let version = format!("{:016x}", fnv1a(&std::fs::read(&file).unwrap()));
        writeln!(out, "        {id:?} => \"advice/{id}.py?v={version}\",").unwrap();
    }
    out.push_str("        _ => \"\",\n    }\n}\n");
    let target = Path::new(&std::env::var("OUT_DIR").unwrap()).join("lessons.rs");
    std::fs::write(target, out).unwrap();
}
