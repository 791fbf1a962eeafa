//! The page's clock: milliseconds from `performance.now()` (0 where the
//! browser has none), for the times the page shows.

pub fn now_ms() -> f64 {
    web_sys::window()
        .and_then(|w| w.performance())
        .map_or(0.0, |p| p.now())
}
