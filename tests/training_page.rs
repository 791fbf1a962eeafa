//! Training in the page, in headless Chromium against the real server: on
//! the page's model each technique moves the step's peak; ▶ play sends one
//! step at a time, so every step reaches the timeline and the loss curve;
//! the timeline names its commands, answers hover, zooms and starts again
//! at a restart.

mod chromium;

use chromium::*;
use chromiumoxide::Page;

/// Ticks or unticks the checkbox whose label reads `label`.
async fn tick(page: &Page, label: &str, on: bool) {
    js(page, &format!("(() => {{ const box = [...document.querySelectorAll('label')].find(l => l.textContent.trim() === {label:?}).querySelector('input'); box.checked = {on}; box.dispatchEvent(new Event('change', {{bubbles: true}})); }})()")).await;
}

async fn peak(page: &Page) -> u64 {
    let bytes = js(page, "document.getElementById('peak').dataset.bytes").await;
    bytes.as_str().unwrap().parse().unwrap()
}

/// The code cell's text.
async fn code_of(page: &Page) -> String {
    let code = js(page, "document.getElementById('code').textContent").await;
    code.as_str().unwrap().to_string()
}

/// The page shows `stats`' allocated bytes and peak.
async fn assert_shows(page: &Page, stats: &serde_json::Value) {
    assert_eq!(
        allocated(page).await,
        stats["allocated_bytes"].as_u64().unwrap()
    );
    assert_eq!(
        peak(page).await,
        stats["peak_allocated_bytes"].as_u64().unwrap()
    );
}

async fn allocated(page: &Page) -> u64 {
    let bytes = js(page, "document.getElementById('allocated').dataset.bytes").await;
    bytes.as_str().unwrap().parse().unwrap()
}

/// The peak of a training step (the second: Adam's state exists by then).
async fn step_peak(page: &Page) -> u64 {
    press(page, "btn-train-1").await;
    press(page, "btn-train-1").await;
    peak(page).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_page_model_every_technique_moves_the_peak() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("techniques").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    click(&page, "btn-build").await;
    until(&page, &format!("{COUNT} >= 3")).await;
    let base = step_peak(&page).await;
    const MIB: u64 = 1 << 20;
    let mut moved = Vec::new();
    set_input(&page, "batch", "2048").await;
    moved.push(("batch 2048", step_peak(&page).await));
    // The slider beside the field moves in powers of two and writes there.
    let slider = js(&page, "document.getElementById('batch-slider').value").await;
    assert_eq!(slider.as_str(), Some("11"));
    set_input(&page, "batch-slider", "10").await;
    let batch = js(&page, "document.getElementById('batch').value").await;
    assert_eq!(batch.as_str(), Some("1024"));
    assert_eq!(step_peak(&page).await, base);
    pick(&page, "amp", "float16").await;
    moved.push(("amp", step_peak(&page).await));
    pick(&page, "amp", "off").await;
    tick(&page, "checkpointing", true).await;
    moved.push(("checkpointing", step_peak(&page).await));
    tick(&page, "checkpointing", false).await;
    set_input(&page, "accumulate", "4").await;
    moved.push(("accumulate 4", step_peak(&page).await));
    for (what, p) in &moved {
        assert!(
            p.abs_diff(base) >= MIB,
            "{what}: peak {p} against {base} without it"
        );
    }
    // The explanation says what the peak did.
    let said = js(&page, "document.getElementById('explanation').textContent").await;
    assert!(said.as_str().unwrap().contains("Peak during it:"), "{said}");
    // `losses.append(loss)` keeps one scalar a step: 512 bytes each.
    set_input(&page, "accumulate", "1").await;
    pick(&page, "loss-history", "list").await;
    press(&page, "btn-train-1").await;
    let code = code_of(&page).await;
    assert!(code.contains("losses.append(loss)"), "{code}");
    let listed = allocated(&page).await;
    press(&page, "btn-train-1").await;
    assert_eq!(allocated(&page).await, listed + 512);
    page.close().await.unwrap();
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}

/// A pointer event on the timeline at a fraction of its drawn width.
async fn pointer(page: &Page, kind: &str, at: f64) {
    js(page, &format!("(() => {{ const s = document.getElementById('timeline'); const r = s.getBoundingClientRect(); const x = r.left + (58 / 640 + {at} * (1 - 58 / 640)) * r.width; s.dispatchEvent(new MouseEvent({kind:?}, {{clientX: x, clientY: r.top + r.height / 3, bubbles: true}})); }})()")).await;
}

async fn commands(page: &Page) -> i64 {
    let t = js(
        page,
        "document.querySelector('.timeline h2 small').textContent",
    )
    .await;
    t.as_str()
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn play_shows_every_step_and_the_timeline_follows() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("play").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    // A model small enough to compute: the loss is plotted.
    set_input(&page, "layers", "2").await;
    set_input(&page, "width", "128").await;
    set_input(&page, "batch", "32").await;
    set_input(&page, "steps", "20").await;
    js(&page, "(() => { const s = document.getElementById('play-speed'); s.value = '0'; s.dispatchEvent(new Event('change', {bubbles: true})); })()").await;
    click(&page, "btn-build").await;
    until(&page, &format!("{COUNT} >= 3")).await;
    let before = js(&page, COUNT).await.as_i64().unwrap();
    click(&page, "btn-play").await;
    until(
        &page,
        "document.getElementById('play-status').textContent.startsWith('step 20 of 20: loss')",
    )
    .await;
    // One result per step, one loss per step, one timeline slot per step.
    assert_eq!(js(&page, COUNT).await.as_i64().unwrap(), before + 20);
    let losses = js(&page, "document.querySelector('#loss-curve polyline').getAttribute('points').trim().split(' ').length").await;
    assert_eq!(losses, 20);
    // One slot per command: the live samples give way to each result.
    let results = js(&page, COUNT).await.as_i64().unwrap();
    assert_eq!(commands(&page).await, results);
    // The cell got the loop once.
    let cell = js(&page, "document.getElementById('cell-source').value").await;
    assert_eq!(
        cell.as_str()
            .unwrap()
            .matches("for step in range(20):")
            .count(),
        1,
        "{cell}"
    );
    shot(&page, "play.png").await;
    // More steps than the server takes in a second at full speed: play
    // keeps to the session's command rate, so none is refused.
    set_input(&page, "steps", "120").await;
    click(&page, "btn-play").await;
    until(
        &page,
        "document.getElementById('play-status').textContent.startsWith('step 120 of 120: loss')",
    )
    .await;
    // Pause stops a run part way; nothing more is sent.
    js(&page, "(() => { const s = document.getElementById('play-speed'); s.value = '500'; s.dispatchEvent(new Event('change', {bubbles: true})); })()").await;
    click(&page, "btn-play").await;
    // The new run is under way (a slow poll may first see its second step).
    until(
        &page,
        "(t => /^step [0-9]+ of 120/.test(t) && !t.startsWith('step 120 of 120'))(document.getElementById('play-status').textContent)",
    )
    .await;
    // While it plays, ▶ play says so and cannot start another run.
    let button = "(b => [b.textContent, b.disabled])(document.getElementById('btn-play'))";
    assert_eq!(
        js(&page, button).await,
        serde_json::json!(["▶ playing…", true])
    );
    click(&page, "btn-pause").await;
    let paused = js(&page, COUNT).await.as_i64().unwrap();
    assert_eq!(
        js(&page, button).await,
        serde_json::json!(["▶ play", false])
    );
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    assert!(
        js(&page, COUNT).await.as_i64().unwrap() <= paused + 1,
        "steps went on after pause"
    );
    // The keys hide a line; "zoom to the changes" off starts the axis at 0.
    click(&page, "timeline-key-1").await;
    assert_eq!(
        js(
            &page,
            "document.querySelector('.line-reserved').getAttribute('visibility')"
        )
        .await,
        "hidden"
    );
    pointer(&page, "mousedown", 0.9).await;
    pointer(&page, "mouseup", 0.99).await;
    until(&page, "!document.getElementById('timeline-reset').disabled").await;
    let low = "document.querySelector('.timeline .tick text').textContent";
    assert_ne!(
        js(&page, low).await,
        "0 bytes",
        "zoomed to the training steps"
    );
    js(&page, "document.getElementById('timeline-zoom').click()").await;
    until(&page, &format!("{low} === '0 bytes'")).await;
    js(&page, "document.getElementById('timeline-zoom').click()").await;
    click(&page, "timeline-key-1").await;
    click(&page, "timeline-reset").await;
    // Hover names the command under the pointer and its numbers.
    pointer(&page, "mousemove", 0.99).await;
    let tip = until(&page, "document.getElementById('timeline-tip').textContent.includes('train') && document.getElementById('timeline-tip').textContent").await;
    assert!(tip.as_str().unwrap().contains("peak during it"), "{tip}");
    // Drag across commands to zoom; show all again.
    pointer(&page, "mousedown", 0.5).await;
    pointer(&page, "mouseup", 0.8).await;
    until(&page, "!document.getElementById('timeline-reset').disabled").await;
    shot(&page, "timeline-zoomed.png").await;
    click(&page, "timeline-reset").await;
    until(&page, "document.getElementById('timeline-reset').disabled").await;
    // A restart starts the timeline again; empty_cache gets its label.
    press(&page, "btn-restart").await;
    assert_eq!(commands(&page).await, 1);
    for id in ["btn-alloc", "btn-del", "btn-empty-cache"] {
        press(&page, id).await;
    }
    // The chart is drawn after the numbers are on screen.
    let marks = until(
        &page,
        "(() => { const m = [...document.querySelectorAll('.timeline .mark text')].map(t => t.textContent); return m.length === 4 && m; })()",
    )
    .await;
    assert_eq!(
        marks,
        serde_json::json!(["restart", "alloc", "del", "empty_cache"])
    );
    page.close().await.unwrap();
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}

/// Does lesson step `step` (0-based) once the page shows it: checks its
/// outcome and returns the explanation.
async fn lesson_step(page: &Page, step: usize) -> String {
    until(
        page,
        &format!(
            "document.querySelector('.progress-line span').textContent.startsWith('step {} of')",
            step + 1
        ),
    )
    .await;
    press(page, "lesson-do").await;
    let outcome = js(
        page,
        "document.getElementById('lesson-outcome').textContent",
    )
    .await;
    assert!(outcome.as_str().unwrap().starts_with('✓'), "{outcome}");
    let said = js(page, "document.getElementById('explanation').textContent").await;
    said.as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lesson_9_shows_what_a_loss_history_keeps() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("leak").await;
    // Lesson 9 at its `total_loss += loss` step (the steps before it run).
    let page = open(&browser, &format!("http://{addr}/?lesson=9&step=6")).await;
    until(&page, &format!("{COUNT} >= 5")).await;
    let before = allocated(&page).await;
    // `total_loss += loss`: one scalar; 100 more steps: nothing more; an
    // evaluation loss never backwarded: its graph.
    for (step, live) in [(5, Some("9 → 10")), (6, None), (7, Some("10 → 17"))] {
        let said = lesson_step(&page, step).await;
        if let Some(live) = live {
            assert!(said.contains(&format!("Live tensors: {live}")), "{said}");
        }
    }
    assert_eq!(
        allocated(&page).await - before,
        512 + 136_192,
        "the scalar and one evaluation graph"
    );
    page.close().await.unwrap();
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}

/// Picks a model kind in the training panel.
/// Picks `value` in the select `id`.
async fn pick(page: &Page, id: &str, value: &str) {
    js(page, &format!("(() => {{ const s = document.getElementById({id:?}); s.value = {value:?}; s.dispatchEvent(new Event('change', {{bubbles: true}})); }})()")).await;
}

async fn pick_kind(page: &Page, kind: &str) {
    pick(page, "model-kind", kind).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transformer_and_a_cnn_train_in_the_page() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (browser, events, profile) = launch("kinds").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    until(&page, "document.getElementById('model-kind')").await;
    pick_kind(&page, "transformer").await;
    // The sizes follow the kind: a transformer at the MLP's batch of 1024
    // would not fit.
    let batch = js(&page, "document.getElementById('batch').value").await;
    assert_eq!(batch.as_str(), Some("8"));
    set_input(&page, "seq-slider", "10").await;
    let seq = js(&page, "document.getElementById('seq-len').value").await;
    assert_eq!(seq.as_str(), Some("1024"));
    set_input(&page, "heads", "8").await;
    tick(&page, "RMSNorm", true).await;
    tick(&page, "tied head", false).await;
    click(&page, "btn-build").await;
    until(&page, &format!("{COUNT} >= 3")).await;
    let eager = step_peak(&page).await;
    let said = js(&page, "document.getElementById('explanation').textContent").await;
    assert!(said.as_str().unwrap().contains("shape-only"), "{said}");
    tick(&page, "fused attention (sdpa)", true).await;
    let fused = step_peak(&page).await;
    // Fused attention keeps no 1024 x 1024 matrix per head and layer: at
    // least the four layers' 8 x 4 x 1024 x 1024 probabilities less.
    assert!(
        eager >= fused + 4 * 8 * 4 * 1024 * 1024 * 4,
        "{eager} vs {fused}"
    );
    // Autocast: float16 matrix products, float32 norms and residuals.
    pick(&page, "amp", "float16").await;
    let amp = step_peak(&page).await;
    assert!(amp < fused, "{amp} vs {fused}");
    let code = code_of(&page).await;
    let autocast = "with torch.autocast(\"cuda\", dtype=torch.float16):";
    assert!(code.contains(autocast), "{code}");
    // The pane's code fits the GPT it built: token ids, a loss over tokens.
    assert!(
        code.contains("torch.randint(0, 8000, (60000, 1024))")
            && code.contains("model(x).flatten(0, 1), y.flatten())"),
        "{code}"
    );
    // bfloat16: the default card (compute capability 7.5) has no fused
    // kernel for it, so PyTorch runs the math kernel, which keeps the
    // scores; the note says which kernel ran.
    pick(&page, "amp", "bfloat16").await;
    assert!(step_peak(&page).await > amp);
    let said = js(&page, "document.getElementById('explanation').textContent").await;
    assert!(said.as_str().unwrap().contains("math kernel"), "{said}");
    let code = code_of(&page).await;
    let autocast = "with torch.autocast(\"cuda\", dtype=torch.bfloat16):";
    assert!(code.contains(autocast), "{code}");
    pick(&page, "amp", "off").await;
    // LoRA with 8-bit Adam: the frozen base has no gradients and no state.
    set_input(&page, "lora-rank", "8").await;
    pick(&page, "optimizer", "adam8").await;
    let before = results(&page).await;
    click(&page, "btn-build").await;
    until(&page, &format!("{COUNT} >= {}", before + 3)).await;
    let lora = step_peak(&page).await;
    assert!(lora < fused, "{lora} vs {fused}");
    let code = &code_of(&page).await;
    assert!(
        code.contains("get_peft_model(GPT(") && code.contains("LoraConfig(r=8"),
        "{code}"
    );
    assert!(
        code.contains("opt = bnb.optim.Adam8bit(model.parameters())"),
        "{code}"
    );
    assert!(code.contains("heads=8, seq_len=1024"), "{code}");
    assert!(code.contains("norm=nn.RMSNorm, tied=False"), "{code}");
    // The sequence slider is live: a built transformer is built again at
    // the new length (its position embedding has a row per position).
    let before = results(&page).await;
    js(&page, "(() => { const e = document.getElementById('seq-slider'); e.value = '9'; e.dispatchEvent(new Event('input', {bubbles: true})); e.dispatchEvent(new Event('change', {bubbles: true})); })()").await;
    until(&page, &format!("{COUNT} >= {}", before + 3)).await;
    let code = code_of(&page).await;
    assert!(code.contains("heads=8, seq_len=512"), "{code}");
    assert!(
        step_peak(&page).await < lora,
        "half the sequence, a smaller step"
    );
    pick_kind(&page, "cnn").await;
    set_input(&page, "channels", "1").await;
    let before = results(&page).await;
    click(&page, "btn-build").await;
    until(&page, &format!("{COUNT} >= {}", before + 3)).await;
    let cnn = step_peak(&page).await;
    assert!(cnn > 0);
    let code = code_of(&page).await;
    assert!(code.contains("CNN(channels=1, image_size=64"), "{code}");
    finish(browser, events, profile).await;
    let _ = stop_tx.send(());
}

/// A transformer small enough to compute: its loss is plotted and falls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_transformer_learns_in_the_page() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (browser, events, profile) = launch("learns").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    until(&page, "document.getElementById('model-kind')").await;
    let (first, last) = small_transformer_losses(&page).await;
    assert!(last < 0.8 * first, "{first} → {last}");
    let points = js(&page, "document.querySelector('#loss-curve polyline').getAttribute('points').trim().split(' ').length").await;
    assert_eq!(points, 30);
    shot(&page, "transformer-learns.png").await;
    finish(browser, events, profile).await;
    let _ = stop_tx.send(());
}

/// The explanation's text.
async fn explanation(page: &Page) -> String {
    let said = js(page, "document.getElementById('explanation').textContent").await;
    said.as_str().unwrap_or_default().to_string()
}

/// forward, backward, step and zero_grad one button at a time on a
/// transformer and on a CNN: the graph is kept, then released, and the
/// step's peak is a one-step train's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transformer_and_a_cnn_step_one_statement_at_a_time() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (browser, events, profile) = launch("stepwise").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    until(&page, "document.getElementById('model-kind')").await;
    for kind in ["transformer", "cnn"] {
        // A fresh process: nothing of the last kind's loop lives on.
        press(&page, "btn-restart").await;
        pick_kind(&page, kind).await;
        let before = results(&page).await;
        click(&page, "btn-build").await;
        until(&page, &format!("{COUNT} >= {}", before + 3)).await;
        let built = allocated(&page).await;
        press(&page, "btn-forward").await;
        let said = explanation(&page).await;
        assert!(
            said.contains("keeps its autograd graph alive"),
            "{kind}: {said}"
        );
        assert!(allocated(&page).await > built, "{kind}");
        let forward_peak = peak(&page).await;
        press(&page, "btn-backward").await;
        let said = explanation(&page).await;
        assert!(
            said.contains("Backward released the saved tensors"),
            "{kind}: {said}"
        );
        // The peak shown is the command's.
        let stepped = forward_peak.max(peak(&page).await);
        press(&page, "btn-backward").await;
        let said = explanation(&page).await;
        assert!(
            said.contains("backward through the graph a second time"),
            "{kind}: {said}"
        );
        press(&page, "btn-step").await;
        press(&page, "btn-zero-grad").await;
        // The same step in a loop, from a fresh model: the same peak, but
        // for the batch, which the loop's names hold to the end while the
        // statement's graph lets go of it where its nodes are done (the
        // engine's tests compare the two event by event).
        press(&page, "btn-restart").await;
        let before = results(&page).await;
        click(&page, "btn-build").await;
        until(&page, &format!("{COUNT} >= {}", before + 3)).await;
        press(&page, "btn-train-1").await;
        let looped = peak(&page).await;
        assert!(
            stepped <= looped && looped - stepped <= 1 << 20,
            "{kind}: {stepped} vs {looped}"
        );
    }
    // Running out of memory: the banner names PyTorch's exception.
    set_input(&page, "size", "20000").await;
    press(&page, "btn-alloc").await;
    let banner = js(&page, "document.getElementById('banner').textContent").await;
    let banner = banner.as_str().unwrap_or_default();
    assert!(
        banner.starts_with("torch.OutOfMemoryError: CUDA out of memory."),
        "{banner}"
    );
    finish(browser, events, profile).await;
    let _ = stop_tx.send(());
}

/// Under JAX a step is one XLA executable: the code pane shows `jax.jit`,
/// and ticking donate (`donate_argnums`) takes the new parameters and
/// state out of the step's peak (the default MLP's: three times 15.9 MB,
/// less the copies of the weights backward reads, which donation adds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jax_step_is_jitted_and_donating_lowers_its_peak() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (browser, events, profile) = launch("jax-step").await;
    let page = open(&browser, &format!("http://{addr}/?framework=jax")).await;
    // The JAX kernel first (the address asks for it when the page connects):
    // a model built before that restart would die with it.
    until(
        &page,
        "document.getElementById('device').textContent.includes('JAX')",
    )
    .await;
    let before = results(&page).await;
    click(&page, "btn-build").await;
    until(&page, &format!("{COUNT} >= {}", before + 3)).await;
    tick(&page, "donate (JAX)", true).await;
    let donated = step_peak(&page).await;
    let code = &code_of(&page).await;
    assert!(
        code.contains("@partial(jax.jit, donate_argnums=(0, 1))"),
        "{code}"
    );
    assert!(!code.contains("backward"), "{code}");
    tick(&page, "donate (JAX)", false).await;
    let kept = step_peak(&page).await;
    assert!(
        kept >= donated + 20_000_000,
        "{kept} kept against {donated} donated"
    );
    page.close().await.unwrap();
    finish(browser, events, profile).await;
    let _ = stop_tx.send(());
}

/// The page served by `vramlab serve --device cuda` on an H100, clicked by
/// `tests/reference/gpu_screenshot.py` (`tests/golden/playground-cuda.json`,
/// the README's screenshot): the same clicks on the simulated GPU show the
/// same allocated, reserved and peak bytes after each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_trains_as_it_did_on_the_h100() {
    if prerequisites().is_none() {
        return;
    }
    let text =
        std::fs::read_to_string(vramlab_tests::root().join("tests/golden/playground-cuda.json"))
            .unwrap();
    let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cuda = golden["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|run| run["device"] == "cuda")
        .expect("the GPU's run");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("as-on-the-h100").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    let clicks = golden["clicks"].as_array().unwrap();
    let steps = cuda["steps"].as_array().unwrap();
    assert_eq!(clicks.len(), steps.len());
    for (click, step) in clicks.iter().zip(steps) {
        press(&page, click.as_str().unwrap()).await;
        for key in ["allocated", "reserved", "peak"] {
            let shown = js(
                &page,
                &format!("document.getElementById('{key}').dataset.bytes"),
            )
            .await;
            assert_eq!(
                shown, step[key],
                "{key} after {click} (the H100 showed {step})"
            );
        }
    }
    page.close().await.unwrap();
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}

/// The Generate panel: a published shape loaded, then `generate` with the
/// fields' batch, prompt, new tokens and cache; the numbers are the
/// engine's for the same lines, the KV cache shows as its own category
/// while it lives, and the code pane has transformers' code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generate_panel_loads_a_model_and_generates() {
    if prerequisites().is_none() {
        return;
    }
    let lines = r#"{"cmd":"model","name":"model","kind":"hf","config":"Qwen2.5-0.5B"}
{"cmd":"generate","name":"out","model":"model","batch_size":8,"prompt_len":256,"new_tokens":16,"cache":"static"}"#;
    let (records, _, _) = vramlab_tests::run_stdin(lines, &[]);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("generate-panel").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    pick(&page, "hf-shape", "Qwen2.5-0.5B").await;
    press(&page, "btn-hf-load").await;
    assert_eq!(
        allocated(&page).await,
        records[0]["stats"]["allocated_bytes"].as_u64().unwrap()
    );
    set_input(&page, "hf-batch", "8").await;
    set_input(&page, "hf-prompt", "256").await;
    set_input(&page, "hf-new-tokens", "16").await;
    pick(&page, "hf-cache", "static").await;
    press(&page, "btn-generate").await;
    assert_shows(&page, &records[1]["stats"]).await;
    let code = &code_of(&page).await;
    assert!(code.contains("AutoModelForCausalLM.from_config("), "{code}");
    assert!(
        code.contains("cache_implementation=\"static\", disable_compile=True"),
        "{code}"
    );
    // A field that is not a number: refused beside the button, nothing sent.
    set_input(&page, "hf-new-tokens", "x").await;
    click(&page, "btn-generate").await;
    until(
        &page,
        "document.getElementById('btn-generate-refused') !== null",
    )
    .await;
    page.close().await.unwrap();
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}

/// Fine-tuning from the Generate panel: QLoRA's model (4 bits, prepared,
/// LoRA on every linear layer), AdamW and token sequences, then a step;
/// the numbers are the engine's for the same lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generate_panel_fine_tunes_with_qlora() {
    if prerequisites().is_none() {
        return;
    }
    let lines = r#"{"cmd":"model","name":"model","kind":"hf","config":"Qwen2.5-0.5B","quantization":"nf4","dtype":"bfloat16"}
{"cmd":"prepare_kbit","model":"model"}
{"cmd":"lora","model":"model","rank":8,"all_linear":true}
{"cmd":"optimizer","name":"opt","model":"model","kind":"adamw"}
{"cmd":"data","name":"data","samples":64,"features":256,"classes":151936}
{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"batch_size":2,"checkpointing":true,"attention":"sdpa"}"#;
    let (records, _, _) = vramlab_tests::run_stdin(lines, &[]);
    assert!(records.iter().all(|r| r["ok"] == true), "{records:?}");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("generate-fine-tune").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    pick(&page, "hf-shape", "Qwen2.5-0.5B").await;
    set_input(&page, "hf-rank", "8").await;
    set_input(&page, "hf-seq", "256").await;
    set_input(&page, "hf-batch", "2").await;
    let before = results(&page).await;
    click(&page, "btn-hf-finetune").await;
    until(&page, &format!("{COUNT} >= {}", before + 5)).await;
    press(&page, "btn-hf-train").await;
    assert_shows(&page, &records[5]["stats"]).await;
    let code = &code_of(&page).await;
    assert!(
        code.contains("prepare_model_for_kbit_training(model)"),
        "{code}"
    );
    assert!(
        code.contains("model(input_ids=ids, labels=ids).loss"),
        "{code}"
    );
    page.close().await.unwrap();
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}
