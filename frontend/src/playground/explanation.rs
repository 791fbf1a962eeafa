//! The explanation under the numbers: which numbers a command (or a
//! statement of the cell) moved, why, and where to read more.

/// The explanation shown after a command.
#[derive(Clone, Debug, PartialEq)]
pub struct Explanation {
    pub moved: String,
    pub why: String,
    pub link: (String, String),
    pub ok: bool,
}

impl Explanation {
    /// The presenter's explanation, on a watcher's page.
    pub fn mirrored(e: vramlab_shared::protocol::ExplanationView) -> Self {
        Explanation {
            moved: e.moved,
            why: e.why,
            link: e.link,
            ok: e.ok,
        }
    }
}
