//! The status bar, the error banner, the three numbers and the
//! explanation of the last step.

use super::{colour, CACHED, CONTEXT, FREE, OTHERS};
use crate::state::{App, Status};
use leptos::prelude::*;
use vramlab_shared::device::DeviceKind;
use vramlab_shared::explain;
use vramlab_shared::lesson::predict::Number;
use vramlab_shared::types::{Category, Framework};
use vramlab_shared::units::format_size;

#[component]
pub fn StatusBar(app: App) -> impl IntoView {
    let text = move || match app.status.get() {
        Status::Connecting => "connecting…".to_string(),
        Status::Open => "connected".to_string(),
        Status::Closed(why) => why,
    };
    let device = move || {
        app.hello.with(|h| {
            h.as_ref()
                .map(|h| {
                    format!(
                        "{} · {} · {}",
                        h.device.name,
                        h.framework.display_name(),
                        match h.device.kind {
                            DeviceKind::Simulated => "simulated GPU",
                            DeviceKind::Cuda => "real GPU",
                        }
                    )
                })
                .unwrap_or_default()
        })
    };
    let watch = move || {
        app.hello.with(|h| {
            h.as_ref()
                .and_then(|h| h.watch_id.clone())
                .map(|w| crate::url::watch_link(&w))
        })
    };
    view! {
        <header class="bar">
            <h1>"vramlab"</h1>
            <span id="status" class="status" class:open=move || app.status.get() == Status::Open>{text}</span>
            <span id="device" class="device">{device}</span>
            <Show when=move || app.read_only()>
                <span class="watching">{move || match app.hello.with(|h| h.as_ref().and_then(|h| h.owner.clone())) {
                    Some(owner) => format!("watching {owner}'s session read-only"),
                    None => "watching read-only".to_string(),
                }}</span>
            </Show>
            {move || app.hello.with(|h| h.as_ref().and_then(|h| h.user.clone())).map(|u| view! {
                <span id="user" class="user">{u}</span>
            })}
            <Show when=move || !app.watchers.with(Vec::is_empty)>
                <span id="watchers" class="watchers" aria-live="polite">{move || watched_by(&app.watchers.get())}</span>
            </Show>
            {move || watch().map(|link| view! {
                <label class="watch">"Watch link "
                    <input id="watch-link" readonly value=link.clone() aria-label="Read-only watch link for this session" />
                </label>
            })}
        </header>
    }
}

/// "watched by alice, bob and 2 others", or "3 watchers" when none is named.
fn watched_by(names: &[String]) -> String {
    let anonymous = names.iter().filter(|n| *n == "anonymous").count();
    let mut named: Vec<&str> = names
        .iter()
        .filter(|n| *n != "anonymous")
        .map(String::as_str)
        .collect();
    named.dedup();
    match (named.is_empty(), anonymous) {
        (true, 1) => "1 watcher".into(),
        (true, n) => format!("{n} watchers"),
        (false, 0) => format!("watched by {}", named.join(", ")),
        (false, 1) => format!("watched by {} and 1 other", named.join(", ")),
        (false, n) => format!("watched by {} and {n} others", named.join(", ")),
    }
}

#[component]
pub fn Banner(app: App) -> impl IntoView {
    view! {
        {move || app.banner.get().map(|b| view! {
            <div id="banner" class="banner" role="alert">
                <pre>{b}</pre>
                <button on:click=move |_| app.banner.set(None) aria-label="Dismiss">"×"</button>
            </div>
        })}
    }
}

#[component]
pub fn Numbers(app: App) -> impl IntoView {
    let stat = move |f: fn(&vramlab_shared::Stats) -> u64| move || app.stats().map_or(0, |s| f(&s));
    let allocated = stat(|s| s.allocated_bytes);
    let reserved = stat(|s| s.reserved_bytes);
    let device = stat(|s| s.device_used_bytes);
    let segments = move || {
        let Some(s) = app.stats() else {
            return Vec::new();
        };
        let total = s.device_total_bytes.max(1) as f64;
        let mut parts: Vec<(String, &'static str, u64)> = s
            .categories
            .iter()
            .filter(|(_, &b)| b > 0)
            .map(|(c, &b)| (c.name().replace('_', " "), colour(*c), b))
            .collect();
        let allocated_blocks: u64 = s.categories.values().sum();
        let cached = s.reserved_bytes.saturating_sub(
            s.allocated_bytes
                .max(allocated_blocks.min(s.reserved_bytes)),
        );
        parts.push(("cached, free".into(), CACHED, cached));
        let outside = s
            .device_used_bytes
            .saturating_sub(s.context_bytes + s.reserved_bytes.max(allocated_blocks));
        if outside > 0 {
            parts.push(("outside the allocator".into(), "#b07aa1", outside));
        }
        parts.push(("CUDA context".into(), CONTEXT, s.context_bytes));
        parts.push(("other processes".into(), OTHERS, s.other_processes_bytes));
        parts.push(("free".into(), FREE, s.device_free_bytes));
        parts
            .into_iter()
            .filter(|p| p.2 > 0)
            .map(|(label, colour, bytes)| {
                let pct = bytes as f64 / total * 100.0;
                let title = format!("{label}: {}", format_size(bytes));
                view! { <div class="seg" style=format!("width:{pct:.3}%;background:{colour}") title=title></div> }
            })
            .collect::<Vec<_>>()
    };
    let captions = move || {
        let framework = app.hello.with(|h| h.as_ref().map(|h| h.framework));
        explain::captions(framework.unwrap_or(Framework::Pytorch))
    };
    let peak = stat(|s| s.step_peak_allocated_bytes);
    view! {
        <section class="numbers" aria-label="The three numbers" id="numbers">
            <div class="big allocated" class:moved=move || app.moved.with(|m| m.contains(&Number::Allocated))><span class="k">"allocated"</span>
                <span id="allocated" data-bytes=move || allocated().to_string()>{move || format_size(allocated())}</span>
                <span class="api" id="api-allocated">{move || captions().allocated}</span></div>
            <div class="big reserved" class:moved=move || app.moved.with(|m| m.contains(&Number::Reserved))><span class="k">"reserved"</span>
                <span id="reserved" data-bytes=move || reserved().to_string()>{move || format_size(reserved())}</span>
                <span class="api" id="api-reserved">{move || captions().reserved}</span></div>
            <div class="big device" class:moved=move || app.moved.with(|m| m.contains(&Number::NvidiaSmi))><span class="k">"nvidia-smi"</span>
                <span id="device-used" data-bytes=move || device().to_string()>{move || format_size(device())}</span>
                <span class="api">"this process on the GPU"</span></div>
            <div class="big peak"><span class="k">"peak of the last command"</span>
                <span id="peak" data-bytes=move || peak().to_string()>{move || format_size(peak())}</span>
                <span class="api">{move || app.progress.get().map(|(d, t)| format!("step {d} of {t}")).unwrap_or_else(|| captions().peak.to_string())}</span></div>
            <span id="last-step" hidden>{move || app.last_step.get().map(|s| s.to_string()).unwrap_or_default()}</span>
            <span id="result-count" hidden>{move || app.results.get().to_string()}</span>
            <div class="stack" role="img" aria-label="Device memory by use">{segments}</div>
            <ul class="legend">
                {Category::ALL.iter().map(|&c| view! { <li><i style=format!("background:{}", colour(c))></i>{c.name().replace('_', " ")}</li> }).collect::<Vec<_>>()}
                <li><i style=format!("background:{CACHED}")></i>"cached, free"</li>
                <li><i style=format!("background:{CONTEXT}")></i>"CUDA context"</li>
                <li><i style=format!("background:{OTHERS}")></i>"other processes"</li>
                <li><i style=format!("background:{FREE};border:1px solid #ccc")></i>"free"</li>
            </ul>
        </section>
    }
}

#[component]
pub fn Explanation(app: App) -> impl IntoView {
    view! {
        <section class="explain" aria-live="polite" id="explanation">
            {move || app.explanation.get().map(|e| view! {
                <p class="moved" class:bad=!e.ok>{e.moved}</p>
                <p class="why">{e.why}</p>
                <p class="link"><a href=e.link.1 target="_blank" rel="noopener">{e.link.0}</a></p>
            })}
        </section>
    }
}
