//! Allocated, reserved, nvidia-smi and the peak over time, with a mark per
//! command.

use crate::state::App;
use leptos::prelude::*;
use vramlab_shared::units::format_size;

#[component]
pub fn Timeline(app: App) -> impl IntoView {
    const W: f64 = 600.0;
    const H: f64 = 140.0;
    let paths = move || {
        app.history.with(|h| {
            let top = h
                .iter()
                .map(|p| p.device.max(p.peak))
                .max()
                .unwrap_or(1)
                .max(1) as f64;
            let n = h.len().max(2) as f64 - 1.0;
            let line = |f: &dyn Fn(&crate::state::Point) -> u64| {
                h.iter()
                    .enumerate()
                    .map(|(i, p)| {
                        format!("{:.1},{:.1}", i as f64 / n * W, H - f(p) as f64 / top * H)
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            // Marks, without labels that would overlap the previous one.
            let mut marks: Vec<(f64, String)> = Vec::new();
            let mut last_label = f64::NEG_INFINITY;
            for (i, p) in h.iter().enumerate() {
                if let Some(l) = &p.label {
                    let x = i as f64 / n * W;
                    let text = if x - last_label >= 7.0 * l.len() as f64 {
                        last_label = x;
                        l.clone()
                    } else {
                        String::new()
                    };
                    marks.push((x, text));
                }
            }
            (
                line(&|p| p.allocated),
                line(&|p| p.reserved),
                line(&|p| p.device),
                line(&|p| p.peak),
                marks,
                top,
            )
        })
    };
    view! {
        <section class="timeline" aria-label="Timeline">
            <h2>"Timeline" <small>{move || format!(" (top: {})", format_size(paths().5 as u64))}</small></h2>
            <svg viewBox=format!("0 0 {W} {}", H + 14.0) preserveAspectRatio="none" role="img" aria-label="allocated, reserved and nvidia-smi over time">
                {move || paths().4.into_iter().map(|(x, l)| view! {
                    <g><line x1=x x2=x y1="0" y2=H stroke="#ddd" /><text x=x y=H + 12.0 font-size="8">{l}</text></g>
                }).collect::<Vec<_>>()}
                <polyline points=move || paths().3 fill="none" stroke="#cc79a7" stroke-dasharray="3 2" />
                <polyline points=move || paths().2 fill="none" stroke="#009e73" stroke-width="2" />
                <polyline points=move || paths().1 fill="none" stroke="#e69f00" stroke-width="2" />
                <polyline points=move || paths().0 fill="none" stroke="#0072b2" stroke-width="2" />
            </svg>
            <p class="keys"><b style="color:#0072b2">"allocated"</b>" · "<b style="color:#e69f00">"reserved"</b>" · "<b style="color:#009e73">"nvidia-smi"</b>" · "<b style="color:#cc79a7">"peak"</b></p>
        </section>
    }
}
