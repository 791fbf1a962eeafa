//! Builds the lesson list from tests/lessons/ so that every lesson file the
//! tests play is in the page, without a second list to keep in step.

use std::fmt::Write;
use std::path::Path;

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
        println!("cargo:rerun-if-changed={}", file.display());
        writeln!(
            out,
            "    Lesson {{ slug: {slug:?}, text: include_str!({:?}) }},",
            file.canonicalize().expect("lesson file").display()
        )
        .unwrap();
    }
    out.push_str("];\n");
    let target = Path::new(&std::env::var("OUT_DIR").unwrap()).join("lessons.rs");
    std::fs::write(target, out).unwrap();
}
