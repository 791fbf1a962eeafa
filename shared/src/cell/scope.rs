//! What the cell's expressions are evaluated against: the names it knows,
//! the framework, and the line (for errors). `eval` evaluates them; the
//! library, the operators and Keras read it.

use super::names::Names;
use super::CellError;
use crate::types::Framework;

/// An evaluation's context.
pub struct Eval<'a> {
    pub names: &'a Names,
    pub framework: Framework,
    pub line: usize,
}

impl Eval<'_> {
    pub fn err(&self, message: impl Into<String>) -> CellError {
        CellError::new(self.line, message)
    }
}
