//! The code cell: a small, documented subset of Python (docs/python-cell.md)
//! read without a Python runtime. [`parse`] turns text into statements;
//! [`steps`] turns each top-level statement into the engine commands it
//! stands for, or a message saying what the cell understands.
//!
//! Layers: `lex` → `parse` (with `ast`) → `value` (what an expression
//! stands for; `names`, `ops`, `library`, `keras`) → `training` (a loop
//! becomes `train`) → `translate` (a statement becomes commands).

mod ast;
mod eval;
mod keras;
mod lex;
mod library;
mod names;
mod ops;
mod parse;
mod scope;
mod training;
mod translate;
mod value;

use crate::command::Command;
use crate::types::Framework;
use serde::{Deserialize, Serialize};

/// A line the cell cannot read or run, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellError {
    /// 1-based.
    pub line: usize,
    pub message: String,
}

impl CellError {
    pub fn new(line: usize, message: impl Into<String>) -> Self {
        CellError {
            line,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for CellError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// One top-level statement of the cell and what it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The lines it spans, 1-based and inclusive.
    pub lines: (usize, usize),
    /// Its source text.
    pub source: String,
    /// The commands it stands for (none for an import or a comment-free
    /// statement that changes no memory), or why it cannot run.
    pub commands: Result<Vec<Command>, CellError>,
}

/// The cell's statements, in order, each with its commands. A syntax error
/// anywhere is the one error; a statement that cannot run stops the list
/// there (what follows may depend on it).
pub fn steps(source: &str, framework: Framework) -> Result<Vec<Step>, CellError> {
    let statements = parse::parse(source)?;
    let lines: Vec<&str> = source.lines().collect();
    let mut t = translate::Translator {
        names: names::Names::default(),
        framework,
    };
    let mut out = Vec::new();
    for s in &statements {
        let commands = t.statement(s, translate::Context::default());
        if let Ok(cmds) = &commands {
            t.names.follow(cmds);
        }
        let failed = commands.is_err();
        out.push(Step {
            lines: (s.line, s.end_line),
            source: lines[s.line - 1..s.end_line].join("\n"),
            commands,
        });
        if failed {
            break;
        }
    }
    Ok(out)
}

/// The framework the code is written for, when it names exactly one.
pub fn framework(source: &str) -> Option<Framework> {
    let mut found = Vec::new();
    for t in lex::tokens(source).ok()? {
        let lex::Tok::Name(n) = t.tok else { continue };
        let f = match n.as_str() {
            "torch" | "nn" => Framework::Pytorch,
            "tf" | "tensorflow" | "keras" => Framework::Tensorflow,
            "jax" | "jnp" => Framework::Jax,
            _ => continue,
        };
        if !found.contains(&f) {
            found.push(f);
        }
    }
    match found[..] {
        [f] => Some(f),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
