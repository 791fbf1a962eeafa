//! The page's clock: milliseconds from `performance.now()` (0 where the
//! browser has none), for the times the page shows, and work put off until
//! the browser has painted what a message changed.

pub fn now_ms() -> f64 {
    web_sys::window()
        .and_then(|w| w.performance())
        .map_or(0.0, |p| p.now())
}

/// Runs `f` after the browser painted its next frame: for what may wait
/// until the numbers a message changed are on screen.
pub fn after_paint(f: impl FnOnce() + 'static) {
    leptos::prelude::request_animation_frame(move || {
        leptos::prelude::set_timeout(f, std::time::Duration::ZERO)
    });
}
