//! Keyboard shortcuts, outside text fields: each presses the button it
//! names, so a shortcut does exactly what the click does (refusals
//! included).

use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// Each key and the id of the button it presses.
pub const KEYS: &[(&str, &str, &str)] = &[
    ("n", "lesson-do", "the lesson's next step"),
    ("d", "btn-del", "del"),
    ("g", "btn-gc", "gc.collect()"),
    ("e", "btn-empty-cache", "empty_cache()"),
    ("c", "btn-clear-session", "clear_session()"),
    ("p", "projector", "projector mode"),
];

fn in_a_field(e: &web_sys::KeyboardEvent) -> bool {
    e.target()
        .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
        .is_some_and(|el| matches!(el.tag_name().as_str(), "INPUT" | "TEXTAREA" | "SELECT"))
}

/// Listens for the shortcuts on the whole page.
pub fn install() {
    let Some(window) = web_sys::window() else {
        return;
    };
    let on_key = Closure::<dyn Fn(web_sys::KeyboardEvent)>::new(|e: web_sys::KeyboardEvent| {
        if e.ctrl_key() || e.meta_key() || e.alt_key() || in_a_field(&e) {
            return;
        }
        let Some((_, id, _)) = KEYS.iter().find(|(k, _, _)| *k == e.key()) else {
            return;
        };
        let button = web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.get_element_by_id(id))
            .and_then(|b| b.dyn_into::<web_sys::HtmlElement>().ok());
        if let Some(b) = button.filter(|b| b.offset_parent().is_some()) {
            e.prevent_default();
            b.click();
        }
    });
    let _ = window.add_event_listener_with_callback("keydown", on_key.as_ref().unchecked_ref());
    on_key.forget();
}
