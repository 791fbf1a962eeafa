// "Will it fit?": the page's form read into a plan request, answered by
// the engine compiled to wasm (vramlab-planner), written out.
import init, { plan, shapes } from "./vramlab-planner.js";

const $ = (id) => document.getElementById(id);
const PASTED = "config";

// Bytes as vramlab writes them (binary units, two decimals).
function size(bytes) {
  const units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
  let v = bytes, u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
  return u === 0 ? `${bytes} bytes` : `${v.toFixed(2)} ${units[u]}`;
}

// A count of parameters as people say it (ask::count_words): 8.03B, 124.4M.
function count(n) {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)}B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  return `${n}`;
}

// A serving request: vLLM's settings, blank ones left to its defaults.
function serving() {
  const r = {
    task: "serve",
    gpu: $("plan-gpu").value,
    gpu_memory_utilization: Number($("plan-utilization").value),
  };
  if ($("plan-max-model-len").value) r.max_model_len = Number($("plan-max-model-len").value);
  if ($("plan-max-num-seqs").value) r.max_num_seqs = Number($("plan-max-num-seqs").value);
  if ($("plan-kv-dtype").value === "fp8") r.kv_cache_dtype = "fp8";
  if ($("plan-enforce-eager").checked) r.enforce_eager = true;
  if ($("plan-tp").value !== "1") r.tensor_parallel_size = Number($("plan-tp").value);
  return r;
}

function request() {
  const task = $("plan-task").value;
  const r = task === "serve" ? serving() : { gpu: $("plan-gpu").value, batch: Number($("plan-batch").value) };
  if (task === "serve") {
    // vLLM's own settings only.
  } else if (task === "generate") {
    r.prompt = Number($("plan-prompt").value);
    r.new_tokens = Number($("plan-new-tokens").value);
    r.cache = $("plan-cache").value;
  } else {
    r.task = task;
    r.seq = Number($("plan-seq").value);
    r.checkpointing = $("plan-checkpointing").checked;
    r.optimizer = $("plan-optimizer").value;
    if (task !== "train") r.rank = Number($("plan-rank").value);
    if ($("plan-amp").checked) r.amp = "bfloat16";
    if (task === "qlora") {
      r.quant_type = $("plan-quant-type").value;
      r.double_quant = $("plan-double-quant").checked;
    }
  }
  if (task !== "serve") {
    if ($("plan-attn").value) r.attn = $("plan-attn").value;
    r.torch = $("plan-torch").value;
  }
  if ($("plan-dtype").value) r.dtype = $("plan-dtype").value;
  if ($("plan-model").value === PASTED) {
    r.config = JSON.parse($("plan-config").value);
  } else {
    r.model = $("plan-model").value;
  }
  return r;
}

// vLLM's start-up: whether it starts, what holds the memory, the KV
// cache's tokens and concurrency, and the command line.
function showServe(a) {
  const on = a.tensor_parallel_size > 1 ? `${a.tensor_parallel_size} x ${a.gpu_name} (each rank's numbers)` : a.gpu_name;
  const head = `${a.model} in ${a.dtype} on ${on}, vLLM ${a.vllm}`;
  $("plan-verdict").textContent = a.starts
    ? `Starts. ${head}: the KV cache holds ${a.kv_tokens.toLocaleString("en")} tokens, ${a.max_concurrency.toFixed(2)} requests of ${a.max_model_len.toLocaleString("en")} tokens at once.`
    : `Does not start. ${head}: ${a.refused}`;
  $("plan-verdict").dataset.fits = a.starts;
  const parts = [
    `of ${size(a.total_bytes)}, gpu_memory_utilization ${a.gpu_memory_utilization}: ${size(a.requested_bytes)} for vLLM`,
    `weights: ${size(a.weights_bytes)}`,
    `held after profiling (the weights' segments, the model runner's buffers, ${size(a.non_torch_bytes)} assumed outside PyTorch): ${size(a.consumed_bytes)}`,
    `the profile run's transient peak (a forward of ${a.max_num_batched_tokens} tokens, then the sampler for ${Math.min(a.max_num_seqs, a.max_num_batched_tokens)} requests): ${size(a.transient_peak_bytes)}`,
    `CUDA graphs' estimate: ${size(a.cudagraph_bytes)}`,
    `the KV cache: ${size(Math.max(a.available_kv_bytes, 0))} in ${a.num_blocks} blocks of ${a.block_size} tokens (${size(a.block_bytes)} a block, every layer's keys and values)`,
  ];
  $("plan-parts").replaceChildren(...parts.map((text) => {
    const li = document.createElement("li");
    li.textContent = text;
    return li;
  }));
  $("plan-chart").hidden = true;
  $("plan-chart-range").textContent = "";
  $("plan-fits-with").hidden = true;
  $("plan-limits").textContent = `Longest max_model_len the cache takes: ${a.longest_model_len.toLocaleString("en")} tokens.`;
  $("plan-python-title").textContent = "The same server";
  $("plan-python").textContent = a.command;
}

function show(a, ms) {
  $("plan-error").hidden = true;
  $("plan-time").textContent = `Planned in the page in ${ms} ms.`;
  $("plan-time").dataset.ms = ms;
  $("plan-answer").dataset.answer = JSON.stringify(a);
  $("plan-answer").hidden = false;
  $("plan-asked").textContent = a.asked ?? "";
  if (a.task === "serve") return showServe(a);
  $("plan-python-title").textContent = "The same in Python";
  const head = `${a.model} (${a.class}, ${count(a.parameters)} parameters) in ${a.dtype} on ${a.gpu_name}, PyTorch ${a.torch}`;
  $("plan-verdict").textContent = a.fits
    ? `Fits. ${head}: peak allocated ${size(a.peak_allocated_bytes)}, reserved ${size(a.peak_reserved_bytes)}, of ${size(a.total_bytes)} (${size(a.context_bytes)} of it the CUDA context).`
    : `Does not fit. ${head}: out of memory ${a.out_of_memory.where} (a request of ${size(a.out_of_memory.requested_bytes)}).`;
  $("plan-verdict").dataset.fits = a.fits;
  const held = a.task === "generate" ? [] : [["the optimizer's state", a.optimizer_state_bytes]];
  const loading = !a.fits && a.out_of_memory.where === "while loading the weights";
  const weights = loading
    ? [`weights loaded before it ran out: ${size(a.weights_bytes)} of the model's ${size(a.model_bytes)}`]
    : [`weights: ${size(a.weights_bytes)}`];
  const parts = [...held, ...Object.entries(a.at_peak).map(([k, v]) => [`${k} at the peak`, v])];
  const items = [...weights, ...parts.map(([k, v]) => `${k}: ${size(v)}`)];
  const layers = a.activations_by_layer ?? [];
  if (layers.some((v) => v > 0)) {
    const most = Math.max(...layers), least = Math.min(...layers);
    items.push(`of them, the activations the decoder layers made, at the peak: from ${size(least)} (layer ${layers.indexOf(least)}) to ${size(most)} (layer ${layers.indexOf(most)}) a layer`);
  }
  $("plan-parts").replaceChildren(...items.map((text) => {
    const li = document.createElement("li");
    li.textContent = text;
    return li;
  }));
  chart(a.peak_allocated_by_token ?? []);
  const below = (n) => (n === null ? "" : ` (${n} does not: near the limit whether it fits alternates)`);
  const found = (n) => (n === 0 ? "none (not even 1)" : n);
  const longest = a.task === "generate"
    ? `Longest prompt that fits with these new tokens: ${found(a.longest_prompt)}${below(a.prompt_below_fails)}.`
    : `Longest sequence that fits: ${found(a.longest_seq)}${below(a.seq_below_fails)}.`;
  $("plan-limits").textContent = `Largest batch that fits: ${found(a.largest_batch)}${below(a.batch_below_fails)}. ${longest}`;
  fitsWith(a.fits_with ?? []);
  $("plan-python").textContent = a.python;
}

// The changes that fit, cheapest first, each planned: "Plan it" sets the
// form to it and asks again.
function fitsWith(remedies) {
  $("plan-fits-with").hidden = remedies.length === 0;
  $("plan-fits-with-list").replaceChildren(...remedies.map((r) => {
    const li = document.createElement("li");
    li.append(`${r.changes.join(" and ")}: peak reserved ${size(r.peak_reserved_bytes)} of ${size(r.total_bytes)}. `);
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = "Plan it";
    button.addEventListener("click", () => {
      setForm(r.request);
      ask();
    });
    li.append(button);
    return li;
  }));
}

// The form set to a request's fields (those a change sets).
function setForm(fields) {
  if (fields.task !== undefined) {
    $("plan-task").value = fields.task;
    task();
  }
  if (fields.checkpointing !== undefined) $("plan-checkpointing").checked = fields.checkpointing;
  if (fields.batch !== undefined) $("plan-batch").value = fields.batch;
  if (fields.optimizer !== undefined) $("plan-optimizer").value = fields.optimizer;
  if (fields.gpu !== undefined) $("plan-gpu").value = fields.gpu;
}

// Each forward's peak of allocated memory as a line: the prefill first,
// then one point per new token.
function chart(peaks) {
  const svg = $("plan-chart");
  if (peaks.length < 2) {
    svg.hidden = true;
    return;
  }
  const [w, h] = [600, 120];
  const lo = Math.min(...peaks), hi = Math.max(...peaks);
  const y = (v) => (hi === lo ? h / 2 : h - 4 - ((v - lo) / (hi - lo)) * (h - 8));
  const points = peaks.map((v, i) => `${((i / (peaks.length - 1)) * w).toFixed(1)},${y(v).toFixed(1)}`);
  svg.querySelector("polyline").setAttribute("points", points.join(" "));
  svg.setAttribute("aria-label", `Peak allocated by forward, from ${size(peaks[0])} in the prefill to ${size(peaks[peaks.length - 1])} at the last new token (lowest ${size(lo)}, highest ${size(hi)})`);
  $("plan-chart-range").textContent = `Peak allocated by forward: ${size(lo)} to ${size(hi)}, the prefill first, then each new token.`;
  svg.hidden = false;
}

function fail(message) {
  $("plan-answer").hidden = true;
  $("plan-error").textContent = message;
  $("plan-error").hidden = false;
}

function ask(event) {
  event?.preventDefault();
  let r;
  try {
    r = request();
  } catch (e) {
    return fail(`That config.json is not JSON: ${e.message}`);
  }
  const start = performance.now();
  const a = JSON.parse(plan(JSON.stringify(r)));
  const ms = Math.round(performance.now() - start);
  if (a.error) return fail(a.error);
  show(a, ms);
}

// Each task's own fields shown, the others hidden.
function task() {
  const t = $("plan-task").value;
  // `prepare_model_for_kbit_training` checkpoints unless told not to.
  if (t === "qlora") $("plan-checkpointing").checked = true;
  for (const label of document.querySelectorAll("label[data-task]")) {
    label.hidden = !label.dataset.task.split(" ").includes(t);
  }
}

function pasted(text) {
  $("plan-config").value = text;
  $("plan-model").value = PASTED;
}

await init({ module_or_path: "./{{wasm}}" });
const select = $("plan-model");
for (const s of JSON.parse(shapes())) {
  const o = document.createElement("option");
  o.value = s.name;
  o.textContent = `${s.name} (${s.class})`;
  o.title = s.config_url;
  select.append(o);
}
const own = document.createElement("option");
own.value = PASTED;
own.textContent = "config.json pasted or dropped below";
select.append(own);
select.value = "Llama-3.1-8B";
$("plan-config").addEventListener("input", () => { select.value = PASTED; });
$("plan-config").addEventListener("dragover", (e) => e.preventDefault());
$("plan-config").addEventListener("drop", async (e) => {
  e.preventDefault();
  const file = e.dataTransfer.files[0];
  if (file) pasted(await file.text());
});
$("plan-file").addEventListener("change", async (e) => {
  const file = e.target.files[0];
  if (file) pasted(await file.text());
});
$("plan-task").addEventListener("change", task);
$("plan-form").addEventListener("submit", ask);
document.body.dataset.ready = "true";
