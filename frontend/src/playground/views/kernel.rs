//! The kernel's settings (restart), tensors by hand, and the five things
//! people try to free memory.

use super::generating::Generating;
use super::training::Training;
use super::{button, checkbox, checked_button, hidden, text_input};
use crate::playground::state::App;
use leptos::prelude::*;
use vramlab_shared::command::{AllocArgs, Command, HoldArgs, NameArgs, RestartSettings};
use vramlab_shared::framework::{Settings, TorchVersion, MAX_DEVICE_BYTES};
use vramlab_shared::gpu::GpuModel;
use vramlab_shared::input;
use vramlab_shared::types::{Dtype, Framework};
use vramlab_shared::units::{GIB, MIB};
use vramlab_shared::Invalid;

#[component]
pub fn Controls(app: App) -> impl IntoView {
    view! {
        <section class="controls" aria-label="Controls"
            on:input=move |_| app.display.control_edits.update(|n| *n += 1)
            on:change=move |_| app.display.control_edits.update(|n| *n += 1)>
            <KernelSettings app=app />
            <Tensors app=app />
            <fieldset class="five" hidden=hidden(app, "buttons")>
                <legend>"What people try"</legend>
                {button(app, "btn-del", "del", "del the selected name", move || Command::Del(NameArgs { name: app.display.selected.get_untracked() }))}
                {button(app, "btn-gc", "gc.collect()", "Collect reference cycles", || Command::Gc {})}
                <span hidden=move || app.framework_now() == Framework::Pytorch>
                    {button(app, "btn-clear-session", "clear_session()", "tf.keras.backend.clear_session()", || Command::ClearSession {})}
                </span>
                <span hidden=move || app.framework_now() != Framework::Pytorch>
                    {button(app, "btn-empty-cache", "torch.cuda.empty_cache()", "Return entirely free cached segments to the driver", || Command::EmptyCache {})}
                    // Rare, and under PyTorch 2.15 nothing to clear: folded.
                    <details class="more" id="more-calls"><summary>"more"</summary>
                        {button(app, "btn-clear-cublas", "clearCublasWorkspaces()", "torch._C._cuda_clearCublasWorkspaces(): give the cuBLAS workspaces back to the cache", || Command::ClearCublasWorkspaces {})}
                    </details>
                </span>
                {button(app, "btn-restart", "restart kernel", "The process exits; a new one starts", || Command::Restart(RestartSettings::default()))}
                <p class="hint" id="keys">"Keys: "{crate::playground::keys::KEYS.iter().map(|(k, _, what)| view! { <kbd>{*k}</kbd>" "{*what}" · " }).collect::<Vec<_>>()}</p>
                <p class="hint" id="no-empty-cache" hidden=move || app.framework_now() == Framework::Pytorch>
                    {move || format!("{} has no empty_cache(): its pool goes back to the driver only when the process exits.", app.framework_now().display_name())}
                </p>
            </fieldset>
            <Training app=app />
            <Generating app=app />
        </section>
    }
}

/// The settings fields, as text the user edits.
#[derive(Clone, Copy)]
struct SettingsFields {
    framework: RwSignal<Framework>,
    /// A GPU model, or `None` for the size and context typed below.
    gpu: RwSignal<Option<GpuModel>>,
    device_gib: RwSignal<String>,
    context_mib: RwSignal<String>,
    allow_growth: RwSignal<bool>,
    preallocate: RwSignal<bool>,
    no_caching: RwSignal<bool>,
    expandable: RwSignal<bool>,
    memory_limit_mib: RwSignal<String>,
    mem_fraction: RwSignal<String>,
    max_split_mb: RwSignal<String>,
    fraction: RwSignal<String>,
    /// `CUBLAS_WORKSPACE_CONFIG`; empty: unset.
    cublas_config: RwSignal<String>,
    /// `TORCH_CUBLAS_WORKSPACE_CACHE=1`.
    cublas_cache: RwSignal<bool>,
    /// PyTorch 2.9's kept workspaces (else 2.15's per call).
    torch_version: RwSignal<String>,
}

fn text<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

impl SettingsFields {
    fn new() -> Self {
        let s = String::new;
        SettingsFields {
            framework: RwSignal::new(Framework::Pytorch),
            gpu: RwSignal::new(Some(vramlab_shared::gpu::DEFAULT_GPU)),
            device_gib: RwSignal::new("16".into()),
            context_mib: RwSignal::new("300".into()),
            allow_growth: RwSignal::new(false),
            preallocate: RwSignal::new(true),
            no_caching: RwSignal::new(false),
            expandable: RwSignal::new(false),
            memory_limit_mib: RwSignal::new(s()),
            mem_fraction: RwSignal::new("0.75".into()),
            max_split_mb: RwSignal::new(s()),
            fraction: RwSignal::new(s()),
            cublas_config: RwSignal::new(s()),
            cublas_cache: RwSignal::new(false),
            torch_version: RwSignal::new(TorchVersion::default().id().to_string()),
        }
    }

    /// Shows the settings the kernel runs with.
    fn show(&self, framework: Framework, s: &Settings) {
        self.framework.set(framework);
        self.gpu.set(s.gpu);
        self.device_gib
            .set(format!("{}", s.device_total_bytes as f64 / GIB as f64));
        self.context_mib.set(format!("{}", s.context_bytes / MIB));
        self.allow_growth.set(s.allow_growth);
        self.preallocate.set(s.preallocate);
        self.no_caching.set(s.no_caching);
        self.expandable.set(s.expandable_segments);
        self.memory_limit_mib
            .set(text(s.memory_limit_bytes.map(|b| b / MIB)));
        self.mem_fraction.set(s.mem_fraction.to_string());
        self.max_split_mb.set(text(s.max_split_size_mb));
        self.fraction.set(text(s.per_process_memory_fraction));
        self.cublas_config
            .set(s.cublas_workspace_config.clone().unwrap_or_default());
        self.cublas_cache.set(s.cublas_workspace_cache);
        self.torch_version.set(s.torch_version.id().to_string());
    }

    /// `restart` with the settings as written (empty optional fields:
    /// none), or why a field cannot be read.
    fn restart(&self) -> Result<Command, Invalid> {
        let field = |s: RwSignal<String>| s.get_untracked();
        let gpu = self.gpu.get_untracked();
        let (device, context) = match gpu {
            Some(_) => (None, None),
            None => {
                let max_gib = (MAX_DEVICE_BYTES / GIB) as f64;
                let gib = input::positive(&field(self.device_gib), "GPU memory (GiB)", max_gib)?;
                let context =
                    input::whole(&field(self.context_mib), "context (MiB)", 0..=64 * 1024)?;
                (Some((gib * GIB as f64) as u64), Some(context * MIB))
            }
        };
        let most_mib = MAX_DEVICE_BYTES / MIB;
        let limit = input::optional_whole(
            &field(self.memory_limit_mib),
            "TF memory limit (MiB)",
            1..=most_mib,
        )?;
        let mem_fraction = input::optional_fraction(&field(self.mem_fraction), "JAX mem fraction")?;
        let max_split =
            input::optional_whole(&field(self.max_split_mb), "max_split_size_mb", 1..=most_mib)?;
        let fraction = input::optional_fraction(&field(self.fraction), "memory fraction")?;
        let cublas = Some(field(self.cublas_config).trim().to_string()).filter(|c| !c.is_empty());
        let version = field(self.torch_version);
        let torch_version = TorchVersion::from_id(version.trim()).ok_or_else(|| {
            Invalid(format!(
                "PyTorch {version:?}: the versions are 2.15, 2.11 and 2.9"
            ))
        })?;
        Ok(Command::Restart(RestartSettings {
            framework: Some(self.framework.get_untracked()),
            gpu,
            device_total_bytes: device,
            context_bytes: context,
            allow_growth: Some(self.allow_growth.get_untracked()),
            preallocate: Some(self.preallocate.get_untracked()),
            no_caching: Some(self.no_caching.get_untracked()),
            expandable_segments: Some(self.expandable.get_untracked()),
            memory_limit_bytes: Some(limit.map(|m| m * MIB)),
            mem_fraction: Some(mem_fraction.unwrap_or(0.75)),
            max_split_size_mb: Some(max_split),
            per_process_memory_fraction: Some(fraction),
            cublas_workspace_config: Some(cublas),
            cublas_workspace_cache: Some(self.cublas_cache.get_untracked()),
            torch_version: Some(torch_version),
            ..Default::default()
        }))
    }
}

#[component]
fn KernelSettings(app: App) -> impl IntoView {
    let f = SettingsFields::new();
    Effect::new(move |_| {
        if let Some(h) = app.link.hello.get() {
            f.show(h.framework, &h.settings);
        }
    });
    // Picking a framework starts its kernel at once (with the settings as
    // typed, or, where a field cannot be read, with its defaults).
    let on_framework = move |e| {
        let Some(v) = Framework::from_id(&event_target_value(&e)) else {
            return;
        };
        f.framework.set(v);
        let restart = f.restart().unwrap_or_else(|_| {
            Command::Restart(RestartSettings {
                framework: Some(v),
                ..Default::default()
            })
        });
        app.run(restart);
    };
    let on_gpu = move |e| f.gpu.set(GpuModel::from_id(&event_target_value(&e)));
    let gpu_id = move || f.gpu.get().map_or("custom", GpuModel::id);
    view! {
        <fieldset hidden=hidden(app, "framework")>
            <legend>"Process"</legend>
            <label>"Framework "
                <select id="framework" prop:value=move || f.framework.get().id() on:change=on_framework>
                    {Framework::ALL.map(|v| view! { <option value=v.id()>{v.display_name()}</option> })}
                </select>
            </label>
            <label>"GPU "
                <select id="gpu" prop:value=gpu_id on:change=on_gpu>
                    <option value="custom">"custom size"</option>
                    {GpuModel::ALL.map(|g| view! { <option value=g.id()>{g.spec().name}</option> })}
                </select>
            </label>
            <span hidden=move || f.gpu.get().is_some()>
                <label>"GPU (GiB) " {text_input("device-gib", "4", "", f.device_gib)}</label>
                <label>"Context (MiB) " {text_input("context-mib", "4", "", f.context_mib)}</label>
            </span>
            <details class="advanced">
                <summary>"Allocator settings"</summary>
                <span class="for" hidden=move || f.framework.get() != Framework::Pytorch>
                    <label>{checkbox(f.no_caching)}" PYTORCH_NO_CUDA_MEMORY_CACHING"</label>
                    <label>{checkbox(f.expandable)}" expandable_segments"</label>
                    <label>"max_split_size_mb " {text_input("max-split", "4", "none", f.max_split_mb)}</label>
                    <label>"memory fraction " {text_input("fraction", "4", "none", f.fraction)}</label>
                    <label>"CUBLAS_WORKSPACE_CONFIG " {text_input("cublas-config", "9", ":4096:2:16:8", f.cublas_config)}</label>
                    <label>{checkbox(f.cublas_cache)}" TORCH_CUBLAS_WORKSPACE_CACHE"</label>
                    <label title="2.15, 2.11 or 2.9: whose cuBLAS workspaces and messages the kernel follows">"PyTorch " {text_input("torch-version", "4", "2.15", f.torch_version)}</label>
                </span>
                <span class="for" hidden=move || f.framework.get() != Framework::Tensorflow>
                    <label>{checkbox(f.allow_growth)}" set_memory_growth"</label>
                    <label>"memory limit (MiB) " {text_input("memory-limit", "6", "default", f.memory_limit_mib)}</label>
                </span>
                <span class="for" hidden=move || f.framework.get() != Framework::Jax>
                    <label>{checkbox(f.preallocate)}" XLA_PYTHON_CLIENT_PREALLOCATE"</label>
                    <label>"XLA_PYTHON_CLIENT_MEM_FRACTION " {text_input("mem-fraction", "4", "", f.mem_fraction)}</label>
                </span>
            </details>
            {checked_button(app, "btn-restart-settings", "Restart with these settings", "Restart the kernel with the settings above", move || f.restart().map(|c| vec![c]))}
        </fieldset>
    }
}

#[component]
fn Tensors(app: App) -> impl IntoView {
    let shape = RwSignal::new(String::new());
    let name = RwSignal::new("x".to_string());
    let size_mib = RwSignal::new("64".to_string());
    let hold_items = RwSignal::new("x".to_string());
    let cycle = RwSignal::new(true);
    // A shape if one is written, else the size in MiB.
    let alloc = move || {
        let mut args = AllocArgs {
            name: name.get_untracked(),
            bytes: None,
            shape: None,
            dtype: None,
            category: None,
        };
        match input::shape(&shape.get_untracked())? {
            Some(dims) => (args.shape, args.dtype) = (Some(dims), Some(Dtype::Float32)),
            None => {
                args.bytes = Some(input::mib(
                    &size_mib.get_untracked(),
                    "MiB",
                    MAX_DEVICE_BYTES,
                )?)
            }
        }
        Ok(vec![Command::Alloc(args)])
    };
    let hold = move || {
        let items = hold_items
            .get_untracked()
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let (name, cycle) = ("h".into(), cycle.get_untracked());
        Command::Hold(HoldArgs { name, items, cycle })
    };
    view! {
        <fieldset hidden=hidden(app, "tensor")>
            <legend>"Tensors"</legend>
            <label>"Name " <input id="name" size="6" prop:value=name on:input=move |e| { let v = event_target_value(&e); app.display.selected.set(v.clone()); name.set(v); } /></label>
            <label>"MiB " {text_input("size", "6", "", size_mib)}</label>
            <label>"or shape " {text_input("shape", "9", "1024, 1024", shape)}</label>
            {checked_button(app, "btn-alloc", "Allocate", "name = torch.empty(...) on the GPU", alloc)}
            <label>"Hold " {text_input("hold-items", "8", "", hold_items)}</label>
            <label>{checkbox(cycle)}" cycle"</label>
            {button(app, "btn-hold", "h = [...]", "Keep references in a list h (with a cycle: h.append(h))", hold)}
        </fieldset>
    }
}
