//! The views: controls, the three numbers as a stacked bar, the timeline,
//! the segment map, the table of live objects, the event log, the code pane,
//! the explanation and the lessons.

use crate::lessons::LESSONS;
use crate::state::{App, LessonRun, Status};
use leptos::html;
use leptos::prelude::*;
use serde_json::json;
use vramlab_shared::alloc::BlockState;
use vramlab_shared::types::Category;
use vramlab_shared::units::{format_size, GIB, MIB};
use wasm_bindgen::JsCast;

/// Okabe-Ito colours (distinguishable with colour-vision deficiencies).
pub fn colour(c: Category) -> &'static str {
    match c {
        Category::Parameter => "#0072b2",
        Category::Gradient => "#e69f00",
        Category::OptimizerState => "#009e73",
        Category::Activation => "#cc79a7",
        Category::Input => "#56b4e9",
        Category::Temporary => "#d55e00",
        Category::Other => "#8c6d1f",
    }
}
const CACHED: &str = "#bbbbbb";
const CONTEXT: &str = "#444444";
const OTHERS: &str = "#888888";
const FREE: &str = "#f1f1ec";

fn hidden(app: App, group: &'static str) -> impl Fn() -> bool {
    move || app.hidden.with(|h| h.iter().any(|g| g == group))
}

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
                        if h.backend == "sim" {
                            "simulated GPU"
                        } else {
                            "real GPU"
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
                <span class="watching">"watching read-only"</span>
            </Show>
            {move || watch().map(|link| view! {
                <label class="watch">"Watch link "
                    <input id="watch-link" readonly value=link.clone() aria-label="Read-only watch link for this session" />
                </label>
            })}
        </header>
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
    view! {
        <section class="numbers" aria-label="The three numbers" id="numbers">
            <div class="big allocated"><span class="k">"allocated"</span>
                <span id="allocated" data-bytes=move || allocated().to_string()>{move || format_size(allocated())}</span>
                <span class="api">"memory_allocated()"</span></div>
            <div class="big reserved"><span class="k">"reserved"</span>
                <span id="reserved" data-bytes=move || reserved().to_string()>{move || format_size(reserved())}</span>
                <span class="api">"memory_reserved()"</span></div>
            <div class="big device"><span class="k">"nvidia-smi"</span>
                <span id="device-used" data-bytes=move || device().to_string()>{move || format_size(device())}</span>
                <span class="api">"this process on the GPU"</span></div>
            <div class="big peak"><span class="k">"peak since last sample"</span>
                <span id="peak">{move || format_size(app.peak.get())}</span>
                <span class="api">{move || app.progress.get().map(|(d, t)| format!("step {d} of {t}")).unwrap_or_default()}</span></div>
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

fn button(
    app: App,
    id: &'static str,
    label: &'static str,
    title: &'static str,
    cmd: impl Fn() -> serde_json::Value + 'static,
) -> impl IntoView {
    view! {
        <button id=id title=title disabled=move || app.read_only() on:click=move |_| { app.send(cmd()); }>{label}</button>
    }
}

#[component]
pub fn Controls(app: App) -> impl IntoView {
    let framework = RwSignal::new("pytorch".to_string());
    let device_gib = RwSignal::new("16".to_string());
    let context_mib = RwSignal::new("300".to_string());
    let allow_growth = RwSignal::new(false);
    let preallocate = RwSignal::new(true);
    let no_caching = RwSignal::new(false);
    let memory_limit_mib = RwSignal::new(String::new());
    let mem_fraction = RwSignal::new("0.75".to_string());
    let max_split_mb = RwSignal::new(String::new());
    let fraction = RwSignal::new(String::new());
    let shape = RwSignal::new(String::new());
    let name = RwSignal::new("x".to_string());
    let size_mib = RwSignal::new("64".to_string());
    let hold_items = RwSignal::new("x".to_string());
    let cycle = RwSignal::new(true);
    Effect::new(move |_| {
        if let Some(h) = app.hello.get() {
            framework.set(
                serde_json::to_value(h.framework)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
            );
            device_gib.set(format!(
                "{}",
                h.settings.device_total_bytes as f64 / GIB as f64
            ));
            context_mib.set(format!("{}", h.settings.context_bytes / MIB));
            allow_growth.set(h.settings.allow_growth);
            preallocate.set(h.settings.preallocate);
            no_caching.set(h.settings.no_caching);
            memory_limit_mib.set(
                h.settings
                    .memory_limit_bytes
                    .map(|b| (b / MIB).to_string())
                    .unwrap_or_default(),
            );
            mem_fraction.set(h.settings.mem_fraction.to_string());
            max_split_mb.set(
                h.settings
                    .max_split_size_mb
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            );
            fraction.set(
                h.settings
                    .per_process_memory_fraction
                    .map(|f| f.to_string())
                    .unwrap_or_default(),
            );
        }
    });
    let restart = move || {
        let gib: f64 = device_gib.get_untracked().parse().unwrap_or(16.0);
        let mib: u64 = context_mib.get_untracked().parse().unwrap_or(300);
        json!({
            "cmd": "restart",
            "framework": framework.get_untracked(),
            "device_total_bytes": (gib * GIB as f64) as u64,
            "context_bytes": mib * MIB,
            "allow_growth": allow_growth.get_untracked(),
            "preallocate": preallocate.get_untracked(),
            "no_caching": no_caching.get_untracked(),
            "memory_limit_bytes": memory_limit_mib.get_untracked().trim().parse::<u64>().ok().map(|m| m * MIB),
            "mem_fraction": mem_fraction.get_untracked().trim().parse::<f64>().unwrap_or(0.75),
            "max_split_size_mb": max_split_mb.get_untracked().trim().parse::<u64>().ok(),
            "per_process_memory_fraction": fraction.get_untracked().trim().parse::<f64>().ok(),
        })
    };
    let alloc = move || {
        let dims: Vec<u64> = shape
            .get_untracked()
            .split(|c: char| c == ',' || c == 'x' || c.is_whitespace())
            .filter_map(|d| d.trim().parse().ok())
            .collect();
        if dims.is_empty() {
            let mib: f64 = size_mib.get_untracked().parse().unwrap_or(1.0);
            json!({"cmd": "alloc", "name": name.get_untracked(), "bytes": (mib * MIB as f64) as u64})
        } else {
            json!({"cmd": "alloc", "name": name.get_untracked(), "shape": dims, "dtype": "float32"})
        }
    };
    let hold = move || {
        let items: Vec<String> = hold_items
            .get_untracked()
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        json!({"cmd": "hold", "name": "h", "items": items, "cycle": cycle.get_untracked()})
    };
    view! {
        <section class="controls" aria-label="Controls">
            <fieldset hidden=hidden(app, "framework")>
                <legend>"Kernel"</legend>
                <label>"Framework "
                    <select id="framework" prop:value=framework on:change=move |e| framework.set(event_target_value(&e))>
                        <option value="pytorch">"PyTorch"</option>
                        <option value="tensorflow">"TensorFlow"</option>
                        <option value="jax">"JAX"</option>
                    </select>
                </label>
                <label>"GPU (GiB) " <input id="device-gib" size="4" prop:value=device_gib on:input=move |e| device_gib.set(event_target_value(&e)) /></label>
                <label>"Context (MiB) " <input id="context-mib" size="4" prop:value=context_mib on:input=move |e| context_mib.set(event_target_value(&e)) /></label>
                <label><input type="checkbox" prop:checked=allow_growth on:change=move |e| allow_growth.set(event_target_checked(&e)) />" allow_growth (TF)"</label>
                <label><input type="checkbox" prop:checked=preallocate on:change=move |e| preallocate.set(event_target_checked(&e)) />" preallocate (JAX)"</label>
                <label><input type="checkbox" prop:checked=no_caching on:change=move |e| no_caching.set(event_target_checked(&e)) />" no caching (PyTorch)"</label>
                <label>"max_split_size_mb " <input id="max-split" size="4" placeholder="none" prop:value=max_split_mb on:input=move |e| max_split_mb.set(event_target_value(&e)) /></label>
                <label>"memory fraction " <input id="fraction" size="4" placeholder="none" prop:value=fraction on:input=move |e| fraction.set(event_target_value(&e)) /></label>
                <label>"TF memory limit (MiB) " <input id="memory-limit" size="6" placeholder="default" prop:value=memory_limit_mib on:input=move |e| memory_limit_mib.set(event_target_value(&e)) /></label>
                <label>"JAX mem fraction " <input id="mem-fraction" size="4" prop:value=mem_fraction on:input=move |e| mem_fraction.set(event_target_value(&e)) /></label>
                {button(app, "btn-restart-settings", "Restart with these settings", "Restart the kernel with the settings above", restart)}
            </fieldset>
            <fieldset hidden=hidden(app, "tensor")>
                <legend>"Tensors"</legend>
                <label>"Name " <input id="name" size="6" prop:value=name on:input=move |e| { let v = event_target_value(&e); app.selected.set(v.clone()); name.set(v); } /></label>
                <label>"MiB " <input id="size" size="6" prop:value=size_mib on:input=move |e| size_mib.set(event_target_value(&e)) /></label>
                <label>"or shape " <input id="shape" size="9" placeholder="1024, 1024" prop:value=shape on:input=move |e| shape.set(event_target_value(&e)) /></label>
                {button(app, "btn-alloc", "Allocate", "name = torch.empty(...) on the GPU", alloc)}
                <label>"Hold " <input id="hold-items" size="8" prop:value=hold_items on:input=move |e| hold_items.set(event_target_value(&e)) /></label>
                <label><input type="checkbox" prop:checked=cycle on:change=move |e| cycle.set(event_target_checked(&e)) />" cycle"</label>
                {button(app, "btn-hold", "h = [...]", "Keep references in a list h (with a cycle: h.append(h))", hold)}
            </fieldset>
            <fieldset class="five" hidden=hidden(app, "buttons")>
                <legend>"What people try"</legend>
                {button(app, "btn-del", "del", "del the selected name", move || json!({"cmd": "del", "name": app.selected.get_untracked()}))}
                {button(app, "btn-gc", "gc.collect()", "Collect reference cycles", || json!({"cmd": "gc"}))}
                {button(app, "btn-clear-session", "clear_session()", "tf.keras.backend.clear_session()", || json!({"cmd": "clear_session"}))}
                {button(app, "btn-empty-cache", "torch.cuda.empty_cache()", "Return entirely free cached segments to the driver", || json!({"cmd": "empty_cache"}))}
                {button(app, "btn-restart", "restart kernel", "The process exits; a new one starts", || json!({"cmd": "restart"}))}
            </fieldset>
            <Training app=app />
        </section>
    }
}

#[component]
fn Training(app: App) -> impl IntoView {
    let layers = RwSignal::new("4".to_string());
    let width = RwSignal::new("1024".to_string());
    let batch = RwSignal::new("64".to_string());
    let steps = RwSignal::new("100".to_string());
    let optimizer = RwSignal::new("adam".to_string());
    let accumulate = RwSignal::new("1".to_string());
    let amp = RwSignal::new(false);
    let checkpointing = RwSignal::new(false);
    let set_to_none = RwSignal::new(true);
    let tensor_history = RwSignal::new(false);
    let on_device = RwSignal::new(false);
    let no_grad = RwSignal::new(false);
    let n = |s: RwSignal<String>, d: u64| move || s.get_untracked().parse::<u64>().unwrap_or(d);
    let build = move || {
        app.send(json!({"cmd": "model", "name": "model", "layers": n(layers, 4)(), "width": n(width, 1024)()}));
        app.send(json!({"cmd": "optimizer", "name": "opt", "model": "model", "kind": optimizer.get_untracked()}));
        app.send(json!({"cmd": "data", "name": "data", "on_device": on_device.get_untracked()}));
    };
    let train = move |count: u64| {
        json!({
            "cmd": "train", "model": "model", "optimizer": "opt", "data": "data",
            "steps": count, "batch_size": n(batch, 64)(), "accumulate": n(accumulate, 1)(),
            "amp": amp.get_untracked(), "checkpointing": checkpointing.get_untracked(),
            "set_to_none": set_to_none.get_untracked(),
            "loss_history": if tensor_history.get_untracked() { "tensor" } else { "item" },
        })
    };
    let forward = move || {
        json!({"cmd": "forward", "name": "loss", "model": "model", "data": "data",
        "batch_size": n(batch, 64)(), "amp": amp.get_untracked(), "checkpointing": checkpointing.get_untracked(),
        "no_grad": no_grad.get_untracked()})
    };
    view! {
        <fieldset hidden=hidden(app, "training")>
            <legend>"Training"</legend>
            <label>"Layers " <input id="layers" size="3" prop:value=layers on:input=move |e| layers.set(event_target_value(&e)) /></label>
            <label>"Width " <input id="width" size="5" prop:value=width on:input=move |e| width.set(event_target_value(&e)) /></label>
            <label>"Optimizer "
                <select id="optimizer" prop:value=optimizer on:change=move |e| optimizer.set(event_target_value(&e))>
                    <option value="sgd">"SGD"</option><option value="momentum">"SGD + momentum"</option>
                    <option value="adam">"Adam"</option><option value="adamw">"AdamW"</option>
                </select>
            </label>
            <label><input type="checkbox" prop:checked=on_device on:change=move |e| on_device.set(event_target_checked(&e)) />" data on the GPU"</label>
            <button id="btn-build" disabled=move || app.read_only() on:click=move |_| build()>"Build model, optimizer, data"</button>
            <br />
            <label>"Batch " <input id="batch" size="5" prop:value=batch on:input=move |e| batch.set(event_target_value(&e)) /></label>
            <label>"Accumulate " <input id="accumulate" size="2" prop:value=accumulate on:input=move |e| accumulate.set(event_target_value(&e)) /></label>
            <label><input type="checkbox" prop:checked=amp on:change=move |e| amp.set(event_target_checked(&e)) />" amp"</label>
            <label><input type="checkbox" prop:checked=checkpointing on:change=move |e| checkpointing.set(event_target_checked(&e)) />" checkpointing"</label>
            <label><input type="checkbox" prop:checked=set_to_none on:change=move |e| set_to_none.set(event_target_checked(&e)) />" set_to_none"</label>
            <label><input type="checkbox" prop:checked=tensor_history on:change=move |e| tensor_history.set(event_target_checked(&e)) />" total_loss += loss"</label>
            <label><input type="checkbox" prop:checked=no_grad on:change=move |e| no_grad.set(event_target_checked(&e)) />" no_grad (forward)"</label>
            <br />
            {button(app, "btn-forward", "forward", "loss = criterion(model(x), y)", forward)}
            {button(app, "btn-backward", "backward", "loss.backward()", || json!({"cmd": "backward", "name": "loss"}))}
            {button(app, "btn-step", "step", "opt.step()", || json!({"cmd": "step", "optimizer": "opt"}))}
            {button(app, "btn-zero-grad", "zero_grad", "opt.zero_grad()", move || json!({"cmd": "zero_grad", "optimizer": "opt", "set_to_none": set_to_none.get_untracked()}))}
            {button(app, "btn-train-1", "1 step", "One training step", move || train(1))}
            <label>"Steps " <input id="steps" size="5" prop:value=steps on:input=move |e| steps.set(event_target_value(&e)) /></label>
            {button(app, "btn-play", "▶ play", "Train for the number of steps", move || train(n(steps, 100)()))}
            <br />
            {button(app, "btn-estimate", "estimate", "Predict the step's memory before running it", move || json!({
                "cmd": "estimate", "model": "model", "optimizer": "opt", "data": "data",
                "batch_size": n(batch, 64)(), "accumulate": n(accumulate, 1)(),
                "amp": amp.get_untracked(), "checkpointing": checkpointing.get_untracked(),
                "set_to_none": set_to_none.get_untracked(),
            }))}
            {button(app, "btn-find-batch", "find batch size", "The largest batch whose step stays under 80% of the memory limit", || json!({
                "cmd": "find_batch_size", "model": "model", "optimizer": "opt", "data": "data", "threshold": 0.8,
            }))}
            {button(app, "btn-tf-session", "tf.Session()", "TensorFlow 1: models built now belong to the session", || json!({"cmd": "tf_session", "name": "sess"}))}
            {button(app, "btn-close-session", "sess.close()", "Close the TF1 session", || json!({"cmd": "close", "name": "sess"}))}
            <button id="btn-pause" disabled=move || app.read_only() on:click=move |_| crate::socket::send(&vramlab_shared::protocol::ClientMessage::Stop {})>"❚❚ pause"</button>
        </fieldset>
    }
}

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

#[component]
pub fn SegmentMap(app: App) -> impl IntoView {
    let canvas = NodeRef::<html::Canvas>::new();
    let tip = RwSignal::new(String::new());
    const ROW: f64 = 16.0;
    const LABEL: f64 = 70.0;
    // A canvas can be about 32,000 pixels tall.
    const MAX_ROWS: usize = 2000;
    Effect::new(move |_| {
        let Some(c) = canvas.get() else {
            return;
        };
        let start = web_sys::window()
            .and_then(|w| w.performance())
            .map(|p| p.now());
        app.snapshot.with(|snap| {
            let Some(snap) = snap else {
                return;
            };
            let width = c.client_width().max(300) as f64;
            let rows = snap.segments.len().clamp(1, MAX_ROWS);
            c.set_width(width as u32);
            c.set_height((rows as f64 * ROW) as u32);
            let Ok(Some(ctx)) = c.get_context("2d") else {
                return;
            };
            let Ok(ctx) = ctx.dyn_into::<web_sys::CanvasRenderingContext2d>() else {
                return;
            };
            ctx.clear_rect(0.0, 0.0, width, rows as f64 * ROW);
            ctx.set_font("10px sans-serif");
            let span = width - LABEL;
            for (r, seg) in snap.segments.iter().take(MAX_ROWS).enumerate() {
                let y = r as f64 * ROW;
                ctx.set_fill_style_str("#333");
                let _ = ctx.fill_text(&format_size(seg.total_size), 2.0, y + 11.0);
                for b in &seg.blocks {
                    let x = LABEL + (b.address - seg.address) as f64 / seg.total_size as f64 * span;
                    let w = (b.size as f64 / seg.total_size as f64 * span).max(1.0);
                    let fill = match (b.state, b.category) {
                        (BlockState::ActiveAllocated, Some(c)) => colour(c),
                        (BlockState::ActiveAllocated, None) => "#666",
                        (BlockState::Inactive, _) => CACHED,
                    };
                    ctx.set_fill_style_str(fill);
                    ctx.fill_rect(x, y + 1.0, w, ROW - 2.0);
                }
            }
        });
        if let (Some(t0), Some(p)) = (start, web_sys::window().and_then(|w| w.performance())) {
            app.draw_ms.set(p.now() - t0);
        }
    });
    let on_move = move |e: web_sys::MouseEvent| {
        let Some(c) = canvas.get() else {
            return;
        };
        let rect = c.get_bounding_client_rect();
        let (x, y) = (
            e.client_x() as f64 - rect.left(),
            e.client_y() as f64 - rect.top(),
        );
        let text = app.snapshot.with(|snap| {
            let snap = snap.as_ref()?;
            let seg = snap.segments.get((y / ROW) as usize)?;
            let span = rect.width() - LABEL;
            let at =
                seg.address + (((x - LABEL) / span).clamp(0.0, 1.0) * seg.total_size as f64) as u64;
            let b = seg
                .blocks
                .iter()
                .find(|b| at >= b.address && at < b.address + b.size)?;
            Some(format!(
                "{:#x} · {} (asked {}) · {}{}",
                b.address,
                format_size(b.size),
                format_size(b.requested_size),
                b.owner.clone().unwrap_or_else(|| "free (cached)".into()),
                b.category
                    .map(|c| format!(" · {}", c.name()))
                    .unwrap_or_default()
            ))
        });
        tip.set(text.unwrap_or_default());
    };
    view! {
        <section class="segments" aria-label="Segment map">
            <h2>"Segments" <small>{move || app.snapshot.with(|s| s.as_ref().map(|s| {
                let blocks: usize = s.segments.iter().map(|g| g.blocks.len()).sum();
                let shown = if s.segments.len() > MAX_ROWS { format!(" (the first {MAX_ROWS} drawn)") } else { String::new() };
                format!(" {} segments{shown}, {blocks} blocks, drawn in {:.1} ms", s.segments.len(), app.draw_ms.get())
            }).unwrap_or_default())}</small></h2>
            <div class="tip" id="segment-tip">{move || tip.get()}</div>
            <div class="map-scroll">
                <canvas id="segment-map" node_ref=canvas on:mousemove=on_move></canvas>
            </div>
        </section>
    }
}

#[component]
pub fn Objects(app: App) -> impl IntoView {
    let rows = move || {
        app.snapshot.with(|s| {
            s.as_ref()
                .map(|s| {
                    s.objects
                        .iter()
                        .filter(|o| o.kind != "autograd graph")
                        .take(300)
                        .cloned()
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
    };
    view! {
        <section class="objects" aria-label="Live objects">
            <h2>"Names and objects"</h2>
            <table id="objects">
                <thead><tr><th>"name"</th><th>"type"</th><th>"bytes"</th><th>"refs"</th><th>"kept alive by"</th></tr></thead>
                <tbody>
                    <For each=rows key=|o| (o.id, o.refcount, o.kept_alive_by.clone()) children=move |o| {
                        let pick = o.names.first().cloned().unwrap_or_else(|| o.label.clone());
                        let selected = pick.clone();
                        view! {
                            <tr class:selected=move || app.selected.get() == selected tabindex="0"
                                on:click={ let pick = pick.clone(); move |_| app.selected.set(pick.clone()) }
                                on:keydown=move |e: web_sys::KeyboardEvent| if e.key() == "Enter" || e.key() == " " { app.selected.set(pick.clone()) }>
                                <td>{if o.names.is_empty() { format!("({})", o.label) } else { o.names.join(", ") }}</td>
                                <td>{o.kind.clone()}</td>
                                <td class="num">{if o.bytes > 0 { format_size(o.bytes) } else { String::new() }}</td>
                                <td class="num">{o.refcount}</td>
                                <td>{o.kept_alive_by.clone()}</td>
                            </tr>
                        }
                    } />
                </tbody>
            </table>
        </section>
    }
}

#[component]
pub fn EventLog(app: App) -> impl IntoView {
    view! {
        <section class="events" aria-label="Event log">
            <h2>"Events"</h2>
            <ul id="events">
                {move || app.events.with(|q| q.iter().rev().take(40).map(|e| view! {
                    <li><code>{format!("step {} · {:?} · {} {}", e.step, e.action, format_size(e.size), e.name.clone().unwrap_or_default())}</code></li>
                }).collect::<Vec<_>>())}
            </ul>
        </section>
    }
}

#[component]
pub fn CodePane(app: App) -> impl IntoView {
    let text = move || app.code.with(|c| c.join("\n"));
    let copy = move |_| {
        if let Some(w) = web_sys::window() {
            let _ = w.navigator().clipboard().write_text(&text());
        }
    };
    view! {
        <section class="code" aria-label="The Python each action stands for">
            <h2>"Python" <button on:click=copy>"Copy"</button></h2>
            <pre id="code">{text}</pre>
        </section>
    }
}

#[component]
pub fn Lessons(app: App) -> impl IntoView {
    let start = move |index: usize| {
        app.lesson.set(Some(LessonRun {
            index,
            step: 0,
            outcome: None,
        }));
        app.save_url();
    };
    let current = move || {
        app.lesson.get().map(|run| {
            let lesson = &LESSONS[run.index];
            let lines = lesson.lines();
            let line = lines.get(run.step).copied();
            let parsed = line.map(vramlab_shared::command::parse_line);
            let say = parsed
                .as_ref()
                .and_then(|p| p.annotations.say.clone())
                .unwrap_or_default();
            let done = line.is_none();
            let code = parsed
                .as_ref()
                .and_then(|p| p.command.as_ref().ok())
                .map(|c| vramlab_shared::python::code(c, app.framework()))
                .unwrap_or_default();
            (run.clone(), lesson.title(), lines.len(), say, done, code)
        })
    };
    view! {
        <section class="lessons" aria-label="Lessons" id="lessons">
            <h2>"Lessons"</h2>
            {move || match current() {
                None => view! {
                    <ol class="lesson-list">
                        {LESSONS.iter().enumerate().map(|(i, l)| view! {
                            <li><button class="link" id=format!("lesson-{i}") on:click=move |_| start(i)>{l.title()}</button></li>
                        }).collect::<Vec<_>>()}
                    </ol>
                }.into_any(),
                Some((run, title, total, say, done, code)) => view! {
                    <div class="lesson">
                        <h3>{title}</h3>
                        {run.outcome.clone().map(|(ok, why)| view! {
                            <p class="outcome" class:bad=!ok id="lesson-outcome">{if ok { "✓ " } else { "✗ " }}{why}</p>
                        })}
                        {if done {
                            view! { <p id="lesson-done">"Lesson complete."</p> }.into_any()
                        } else {
                            view! {
                                <p class="step">{format!("Step {} of {}: ", run.step + 1, total)}<b id="lesson-say">{say}</b></p>
                                <pre class="step-code">{code}</pre>
                                <button id="lesson-do" disabled=move || app.read_only() on:click=move |_| {
                                    if let Some(cmd) = App::lesson_command(run.index, run.step) { app.send(cmd); }
                                }>"Do this step"</button>
                            }.into_any()
                        }}
                        <button class="link" on:click=move |_| { app.lesson.set(None); app.save_url(); }>"All lessons"</button>
                    </div>
                }.into_any(),
            }}
        </section>
    }
}
