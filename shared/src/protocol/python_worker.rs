//! The messages between the page and the cell's Python (the worker that
//! runs CPython in the page), declared here once. The page reads and
//! writes them through serde; `shims/vramlab_shim/messages.py`, which
//! `runner.py` builds and reads them with, is written from this declaration
//! ([`python_module`]), and a test holds the file to it. The worker's
//! JavaScript only passes them on. Each message is read field by field
//! (`from_json`), not by serde's derive for tagged enums, whose buffering
//! would add about 12 KB to the page's first load.

use crate::types::Framework;
use serde::{Deserialize, Serialize};

/// Declares a message enum (each variant a `"type"` and its fields) and
/// [`Shape`]s of its variants, for the Python module.
macro_rules! worker_messages {
    ($(#[$m:meta])* $name:ident {
        $( $(#[$vm:meta])* $variant:ident = $tag:literal {
            $( $(#[$fm:meta])* $field:ident : $ty:ty ),* $(,)?
        } ),* $(,)?
    }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, Serialize)]
        #[serde(tag = "type")]
        pub enum $name {
            $( $(#[$vm])* #[serde(rename = $tag)] $variant { $( $(#[$fm])* $field: $ty ),* } ),*
        }

        impl $name {
            /// Each message's `"type"` and fields, in order.
            pub const SHAPES: &'static [Shape] = &[
                $( Shape { tag: $tag, fields: &[$(stringify!($field)),*] } ),*
            ];

            /// The message `value` is, by its `"type"`: none where a field
            /// is missing, of another kind, or not the message's.
            pub fn from_json(value: serde_json::Value) -> Option<Self> {
                let serde_json::Value::Object(mut map) = value else {
                    return None;
                };
                let tag = map.remove("type")?;
                $( if tag == $tag {
                    let message = $name::$variant {
                        $( $field: serde_json::from_value(map.remove(stringify!($field))?).ok()? ),*
                    };
                    return map.is_empty().then_some(message);
                } )*
                None
            }
        }
    };
}

/// A message's `"type"` and its fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub tag: &'static str,
    pub fields: &'static [&'static str],
}

/// Where a print went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// An exception a statement raised, as Python prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Raised {
    /// The traceback, the cell's frames only.
    pub text: String,
    /// The cell's line it was raised at (0: none of the cell's).
    pub line: u64,
    /// The exception's class (`NameError`).
    #[serde(rename = "type")]
    pub class: String,
}

worker_messages! {
    /// What the page asks the cell's Python.
    ToPython {
        /// Parse `code` and start the engine afresh with `settings` (the
        /// session's, as JSON).
        Load = "load" { code: String, settings: serde_json::Value },
        /// Run up to `count` of the statements not yet run.
        Step = "step" { count: u64 },
    }
}

worker_messages! {
    /// What the cell's Python tells the page.
    FromPython {
        /// Pyodide has loaded: the bytes over the wire (the browser's
        /// count), the milliseconds since the worker started, and
        /// CPython's and Pyodide's versions.
        Loaded = "loaded" { bytes: u64, ms: u64, version: String },
        /// The code parsed: each top-level statement's first and last
        /// line, and the framework it imports.
        Statements = "statements" { spans: Vec<(u64, u64)>, framework: Framework },
        /// The code does not parse.
        SyntaxError = "syntax_error" { line: u64, message: String },
        /// Statement `statement` starts.
        Begin = "begin" { statement: u64 },
        /// A command line the statement ran on the worker's engine, for the
        /// session.
        Line = "line" { line: String },
        /// `text` printed at the cell's line `at` (0: outside the cell).
        Print = "print" { text: String, stream: Stream, at: u64 },
        /// Statement `statement` ended, with the exception it raised.
        End = "end" { statement: u64, error: Option<Raised> },
        /// Python waits, the next statement to run being `next`.
        Idle = "idle" { next: u64 },
    }
}

/// `shims/vramlab_shim/messages.py`: a function per message the Python
/// sends, building it, and each message it reads with its fields.
pub fn python_module() -> String {
    let mut s = String::from(
        "\"\"\"The messages between the page and the cell's Python, written from\n\
         their declaration (the engine's `protocol::python_worker`): do not\n\
         edit; a test holds this file to it.\"\"\"\n",
    );
    for shape in FromPython::SHAPES {
        let fields = shape.fields.join(", ");
        let mut body = format!("{{\"type\": \"{}\"", shape.tag);
        for f in shape.fields {
            body.push_str(&format!(", \"{f}\": {f}"));
        }
        s.push_str(&format!(
            "\n\ndef {}({fields}):\n    return {body}}}\n",
            shape.tag
        ));
    }
    s.push_str("\n\n# What the page sends: each message's type and its fields.\nTO_PYTHON = {\n");
    for shape in ToPython::SHAPES {
        let fields: Vec<String> = shape.fields.iter().map(|f| format!("\"{f}\"")).collect();
        let comma = if fields.len() == 1 { "," } else { "" };
        s.push_str(&format!(
            "    \"{}\": ({}{comma}),\n",
            shape.tag,
            fields.join(", ")
        ));
    }
    s.push_str("}\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_reads_back_as_written() {
        let raised = Raised {
            text: "Traceback …\nNameError: name 'nn' is not defined\n".into(),
            line: 3,
            class: "NameError".into(),
        };
        let messages = [
            FromPython::Statements {
                spans: vec![(1, 1), (2, 4)],
                framework: Framework::Pytorch,
            },
            FromPython::End {
                statement: 1,
                error: Some(raised),
            },
            FromPython::Print {
                text: "42\n".into(),
                stream: Stream::Stderr,
                at: 2,
            },
        ];
        for m in messages {
            let value = serde_json::to_value(&m).unwrap();
            assert_eq!(FromPython::from_json(value), Some(m));
        }
        let end = r#"{"type": "end", "statement": 0, "error": null}"#;
        assert_eq!(
            FromPython::from_json(serde_json::from_str(end).unwrap()),
            Some(FromPython::End {
                statement: 0,
                error: None
            })
        );
    }

    #[test]
    fn a_message_of_another_shape_is_refused() {
        for text in [
            r#"{"type": "begin"}"#,
            r#"{"type": "begin", "statement": 0, "extra": 1}"#,
            r#"{"type": "nope"}"#,
            r#"{"begin": 0}"#,
        ] {
            let value = serde_json::from_str(text).unwrap();
            assert_eq!(FromPython::from_json(value), None, "{text}");
        }
    }

    #[test]
    fn the_python_module_builds_each_message_with_its_fields() {
        let module = python_module();
        assert!(module.contains(
            "def end(statement, error):\n    return {\"type\": \"end\", \"statement\": statement, \"error\": error}\n"
        ));
        assert!(module.contains("    \"step\": (\"count\",),\n"));
        assert_eq!(module.matches("\ndef ").count(), FromPython::SHAPES.len());
    }
}
