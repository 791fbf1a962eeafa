//! "Will it fit?" in the browser: the plan page's two calls into the
//! engine (`hf::ask`), built to wasm by `scripts/build-web` for
//! `plan/`, a page of its own, so the playground's first load stays as it
//! was.

use vramlab_shared::hf::ask;
use wasm_bindgen::prelude::wasm_bindgen;

/// A plan request (JSON) answered: the verdict and its parts, or
/// `{"error": "..."}`.
#[wasm_bindgen]
pub fn plan(request: &str) -> String {
    ask::answer_text(request)
}

/// The shipped shapes: name, class and the config.json each copies.
#[wasm_bindgen]
pub fn shapes() -> String {
    ask::shapes_text()
}
