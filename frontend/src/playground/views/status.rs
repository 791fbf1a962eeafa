//! The status bar, the error banner, the three numbers and the
//! explanation of the last step.

use super::{colour, CACHED, CONTEXT, FREE, OTHERS};
use crate::playground::state::{App, Status};
use leptos::prelude::*;
use vramlab_shared::device::DeviceKind;
use vramlab_shared::explain;
use vramlab_shared::lesson::predict::Number;
use vramlab_shared::types::{Category, Framework};
use vramlab_shared::units::format_size;

#[component]
pub fn StatusBar(app: App) -> impl IntoView {
    let text = move || match app.link.status.get() {
        Status::Connecting => "connecting…".to_string(),
        Status::Open => "connected".to_string(),
        Status::Page { fallback: false } => "engine in this page".to_string(),
        Status::Page { fallback: true } => {
            "no server answered: the engine runs in this page".to_string()
        }
        Status::Closed(why) => why,
    };
    let device = move || {
        app.link.hello.with(|h| {
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
        app.link.hello.with(|h| {
            h.as_ref()
                .and_then(|h| h.watch_id.clone())
                .map(|w| crate::playground::url::watch_link(&w))
        })
    };
    let watched = Memo::new(move |_| !app.link.watchers.with(Vec::is_empty));
    // Projector mode is a class on the body, so every part follows it.
    Effect::new(move |_| {
        let on = app.display.projector.get();
        if let Some(body) = web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.body())
        {
            let _ = body.class_list().toggle_with_force("projector", on);
        }
        app.save_url();
    });
    view! {
        <header class="bar">
            <h1>"vramlab"</h1>
            <button id="projector" aria-pressed=move || app.display.projector.get().to_string() aria-keyshortcuts="p"
                title="Large type, dark, high contrast: for a projector or a big screen (key p)"
                on:click=move |_| app.display.projector.update(|p| *p = !*p)>"projector mode"</button>
            <span id="status" class="status" class:open=move || app.link.status.with(Status::is_ready)>{text}</span>
            <EngineSwitch app=app />
            <span id="device" class="device">{device}</span>
            {move || app.read_only().then(|| view! {
                <span class="watching">{move || match app.link.hello.with(|h| h.as_ref().and_then(|h| h.owner.clone())) {
                    Some(owner) => format!("watching {owner}'s session read-only"),
                    None => "watching read-only".to_string(),
                }}</span>
            })}
            {move || app.link.hello.with(|h| h.as_ref().and_then(|h| h.user.clone())).map(|u| view! {
                <span id="user" class="user">{u}</span>
            })}
            // Kept while anyone watches, so its live region announces changes.
            {move || watched.get().then(|| view! {
                <span id="watchers" class="watchers" aria-live="polite">{move || watched_by(&app.link.watchers.get())}</span>
            })}
            {move || watch().map(|link| view! {
                <label class="watch">"Watch link "
                    <input id="watch-link" readonly value=link.clone() aria-label="Read-only watch link for this session" />
                </label>
            })}
        </header>
    }
}

/// Where the engine runs, and a way to move: the server has the watch
/// link, real GPUs and the hosted tool's quotas; the page needs nothing.
#[component]
fn EngineSwitch(app: App) -> impl IntoView {
    let in_page = move || matches!(app.link.status.get(), Status::Page { .. });
    view! {
        <label class="engine" title="Where the engine runs: in this page (no server needed) or on the server (watch links, real GPUs)">"engine "
            <select id="engine" on:change=move |e| crate::playground::url::switch_engine(&event_target_value(&e))>
                <option value="local" selected=in_page>"this page"</option>
                <option value="server" selected=move || !in_page()>"server"</option>
            </select>
        </label>
        <span id="needs-server" class="note" hidden=move || !in_page()>"watch links and real GPUs need the server "
            <button id="move-to-server" title="Replays every command this page ran on the server, so others can watch (the page loads again)"
                on:click=move |_| crate::playground::to_server::start_if_served(app.words.banner)>"move this session to the server"</button>
        </span>
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
        {move || app.words.banner.get().map(|b| view! {
            <div id="banner" class="banner" role="alert">
                <pre>{b}</pre>
                <button on:click=move |_| app.words.banner.set(None) aria-label="Dismiss">"×"</button>
            </div>
        })}
    }
}

#[component]
pub fn Numbers(app: App) -> impl IntoView {
    let stat = move |f: fn(&vramlab_shared::Stats) -> u64| {
        move || app.memory.stats.get().map_or(0, |s| f(&s))
    };
    let allocated = stat(|s| s.allocated_bytes);
    let reserved = stat(|s| s.reserved_bytes);
    let device = stat(|s| s.device_used_bytes);
    // The bar's scale: this process on the GPU (what nvidia-smi shows for
    // it), or the whole GPU with other processes and free memory.
    let whole_gpu = RwSignal::new(false);
    let segments = move || {
        let Some(s) = app.memory.stats.get() else {
            return Vec::new();
        };
        let whole = whole_gpu.get();
        let total = if whole {
            s.device_total_bytes
        } else {
            s.device_used_bytes
        }
        .max(1) as f64;
        bar_parts(&s, whole)
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
        let framework = app.link.hello.with(|h| h.as_ref().map(|h| h.framework));
        explain::captions(framework.unwrap_or(Framework::Pytorch))
    };
    let peak = stat(|s| s.step_peak_allocated_bytes);
    view! {
        <section class="numbers" aria-label="The three numbers" id="numbers">
            <div class="big allocated" class:moved=move || app.words.moved.with(|m| m.contains(&Number::Allocated))><span class="k">"allocated"</span>
                <span id="allocated" data-bytes=move || allocated().to_string()>{move || format_size(allocated())}</span>
                <span class="api" id="api-allocated">{move || captions().allocated}</span></div>
            <div class="big reserved" class:moved=move || app.words.moved.with(|m| m.contains(&Number::Reserved))><span class="k">"reserved"</span>
                <span id="reserved" data-bytes=move || reserved().to_string()>{move || format_size(reserved())}</span>
                <span class="api" id="api-reserved">{move || captions().reserved}</span></div>
            <div class="big device" class:moved=move || app.words.moved.with(|m| m.contains(&Number::NvidiaSmi))><span class="k">"nvidia-smi"</span>
                <span id="device-used" data-bytes=move || device().to_string()>{move || format_size(device())}</span>
                <span class="api">"this process on the GPU"</span></div>
            <div class="big peak"><span class="k">"peak of the last command"</span>
                <span id="peak" data-bytes=move || peak().to_string()>{move || format_size(peak())}</span>
                <span class="api">{move || app.memory.progress.get().map(|(d, t)| format!("step {d} of {t}")).unwrap_or_else(|| captions().peak.to_string())}</span></div>
            <span id="last-step" hidden>{move || app.memory.last_step.get().map(|s| s.to_string()).unwrap_or_default()}</span>
            <span id="result-count" hidden>{move || app.memory.results.get().to_string()}</span>
            <div class="scale">
                <button id="bar-scale" class="link" on:click=move |_| whole_gpu.update(|w| *w = !*w)>
                    {move || if whole_gpu.get() { "bar: the whole GPU (show this process)" } else { "bar: this process on the GPU (show the whole GPU)" }}
                </button>
            </div>
            <div class="stack" id="bar" role="img" aria-label=move || bar_words(app, whole_gpu.get())>{segments}</div>
            <ul class="legend">
                {Category::ALL.iter().map(|&c| view! { <li><i style=format!("background:{}", colour(c))></i>{category_label(c)}</li> }).collect::<Vec<_>>()}
                <li><i style=format!("background:{CACHED}")></i>"cached (free blocks)"</li>
                <li><i style=format!("background:{CONTEXT}")></i>"CUDA context"</li>
                <li><i style=format!("background:{OTHERS}")></i>"other processes"</li>
                <li><i style=format!("background:{FREE};border:1px solid #ccc")></i>"free"</li>
            </ul>
        </section>
    }
}

/// A category's name in the legend: tensors made by hand are "tensors".
pub fn category_label(c: Category) -> String {
    match c {
        Category::Other => "tensors you made, other".into(),
        c => c.name().replace('_', " "),
    }
}

/// The bar's parts: each category, the cache, what lies outside the
/// allocator, the context, and (for the whole GPU) other processes and
/// free memory.
fn bar_parts(s: &vramlab_shared::Stats, whole: bool) -> Vec<(String, &'static str, u64)> {
    let mut parts: Vec<(String, &'static str, u64)> = s
        .categories
        .iter()
        .filter(|(_, &b)| b > 0)
        .map(|(c, &b)| (category_label(*c), colour(*c), b))
        .collect();
    let allocated_blocks: u64 = s.categories.values().sum();
    let cached = s.reserved_bytes.saturating_sub(
        s.allocated_bytes
            .max(allocated_blocks.min(s.reserved_bytes)),
    );
    parts.push(("cached (free blocks)".into(), CACHED, cached));
    let outside = s
        .device_used_bytes
        .saturating_sub(s.context_bytes + s.reserved_bytes.max(allocated_blocks));
    parts.push(("outside the allocator".into(), "#b07aa1", outside));
    parts.push(("CUDA context".into(), CONTEXT, s.context_bytes));
    if whole {
        parts.push(("other processes".into(), OTHERS, s.other_processes_bytes));
        parts.push(("free".into(), FREE, s.device_free_bytes));
    }
    parts
}

/// The bar in words (its text alternative).
fn bar_words(app: App, whole: bool) -> String {
    let Some(s) = app.memory.stats.get() else {
        return "Device memory by use".into();
    };
    let parts: Vec<String> = bar_parts(&s, whole)
        .into_iter()
        .filter(|p| p.2 > 0)
        .map(|(label, _, bytes)| format!("{label} {}", format_size(bytes)))
        .collect();
    format!("Device memory by use: {}", parts.join(", "))
}

#[component]
pub fn Explanation(app: App) -> impl IntoView {
    view! {
        <section class="explain" aria-live="polite" id="explanation">
            {move || app.words.explanation.get().map(|e| view! {
                <p class="moved" class:bad=!e.ok>{e.moved}</p>
                <p class="why">{e.why}</p>
                <p class="link"><a href=e.link.1 target="_blank" rel="noopener">{e.link.0}</a></p>
            })}
        </section>
    }
}
