//! The playground in headless Chromium against the real server: the five
//! buttons show the server's numbers, a lesson plays end to end, a watch
//! link follows the session live, the page reconnects after the server
//! restarts; and the figures (transfer size, click-to-numbers latency,
//! segment-map frame time with thousands of blocks) are measured and
//! printed. Screenshots go to target/screenshots/.

mod chromium;

use chromium::*;
use chromiumoxide::Page;
use futures::StreamExt;
use serde_json::Value;
use std::io::Write;
use std::time::{Duration, Instant};
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;
use vramlab_tests::root;

async fn last_step(page: &Page) -> i64 {
    js(
        page,
        "Number(document.getElementById('last-step').textContent || -1)",
    )
    .await
    .as_i64()
    .unwrap_or(-1)
}

/// Clicks a button, waits for its result on screen; the step it was.
async fn press_step(page: &Page, id: &str) -> i64 {
    press(page, id).await;
    last_step(page).await
}

async fn numbers(page: &Page) -> [u64; 3] {
    let v = js(
        page,
        "['allocated','reserved','device-used'].map(id => Number(document.getElementById(id).dataset.bytes))",
    )
    .await;
    let a: Vec<u64> = serde_json::from_value(v).unwrap();
    [a[0], a[1], a[2]]
}

fn gzip_len(bytes: &[u8]) -> usize {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(bytes).unwrap();
    e.finish().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_playground_in_a_browser() {
    if prerequisites().is_none() {
        return;
    }
    // What the page costs to load for a browser or host without brotli:
    // the gzip copies the build wrote beside each file (zopfli), which
    // `vramlab serve` and a host serving precompressed files send; and, for
    // comparison, the same files at zlib's best.
    let first_load: Vec<_> = std::fs::read_dir(root().join("dist"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "wasm" || x == "js" || x == "css" || x == "html")
        })
        .collect();
    let transferred: usize = first_load
        .iter()
        .map(|p| {
            let gz = format!("{}.gz", p.display());
            std::fs::metadata(&gz)
                .unwrap_or_else(|e| panic!("{gz}: {e} (scripts/build-web writes it)"))
                .len() as usize
        })
        .sum();
    let zlib: usize = first_load
        .iter()
        .map(|p| gzip_len(&std::fs::read(p).unwrap()))
        .sum();
    println!("figure: web app transferred (gzip): {transferred} bytes (zlib's best: {zlib})");
    // The goal: 500 KB gzipped for everything the page loads. Held at
    // 540 KB while the page carried its own reader of a Python subset;
    // back under 500 KB since CPython (Pyodide, fetched when the cell
    // first runs) reads the cell. TensorFlow's executor (`jit_compile`
    // off) stays out of the page's engine (4.5 KB; a server runs it), and
    // the advice's code is fetched when picked. The snapshot reader and
    // replay are a page of their own (snapshots/): 57 KB that the
    // playground's first load no longer carries.
    assert!(transferred <= 500_000, "{transferred} bytes");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("playground").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    // What the first load took over the wire (`vramlab serve` sends the
    // web app compressed the best way the browser accepts).
    let wire = js(
        &page,
        "performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource')).reduce((n, e) => n + e.transferSize, 0)",
    )
    .await;
    let wire = wire.as_u64().unwrap();
    println!("figure: first load over the wire (brotli, headers included): {wire} bytes");
    assert!(wire <= 500_000, "{wire} bytes over the wire");
    let encoding = js(
        &page,
        "fetch(performance.getEntriesByType('resource').find(e => e.name.endsWith('.wasm')).name).then(r => r.headers.get('content-encoding'))",
    )
    .await;
    assert_eq!(encoding.as_str(), Some("br"));
    let watch_link = until(&page, "document.getElementById('watch-link').value").await;
    let watch_id = watch_link
        .as_str()
        .unwrap()
        .rsplit('=')
        .next()
        .unwrap()
        .to_string();

    // A watcher of our own hears every result the server sends.
    let (mut ws, _) = connect_async(format!("ws://{addr}/ws?watch={watch_id}"))
        .await
        .unwrap();
    let results = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
    let sink = results.clone();
    let listener = tokio::spawn(async move {
        // Pings (the server's keepalive) and other frames are skipped.
        while let Some(Ok(msg)) = ws.next().await {
            let Message::Text(t) = msg else { continue };
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["type"] == "result" {
                sink.lock()
                    .unwrap()
                    .insert(v["step"].as_i64().unwrap(), v["stats"].clone());
            }
        }
        let _ = ws.close(None).await;
    });
    let server_stats = |step: i64| {
        let results = results.clone();
        async move {
            let deadline = Instant::now() + WAIT;
            loop {
                if let Some(s) = results.lock().unwrap().get(&step).cloned() {
                    return s;
                }
                assert!(Instant::now() < deadline, "no result for step {step}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };

    // The five buttons (after making something to free).
    for id in FIVE_BUTTONS {
        let step = press_step(&page, id).await;
        let on_screen = numbers(&page).await;
        let stats = server_stats(step).await;
        let expected = [
            stats["allocated_bytes"].as_u64().unwrap(),
            stats["reserved_bytes"].as_u64().unwrap(),
            stats["device_used_bytes"].as_u64().unwrap(),
        ];
        assert_eq!(on_screen, expected, "after {id} (step {step})");
        let explanation = js(&page, "document.getElementById('explanation').textContent").await;
        assert!(
            explanation.as_str().unwrap().contains("Allocated"),
            "{explanation}"
        );
    }
    let code = js(&page, "document.getElementById('code').textContent").await;
    assert!(
        code.as_str().unwrap().contains("torch.cuda.empty_cache()"),
        "{code}"
    );

    // A lesson, end to end.
    open_lesson(&page, "lesson-0").await;
    for _ in 0..20 {
        let done = js(&page, "!!document.getElementById('lesson-done')").await;
        if done == Value::Bool(true) {
            break;
        }
        let say = until(&page, "document.getElementById('lesson-say').textContent").await;
        press(&page, "lesson-do").await;
        let outcome = until(
            &page,
            "document.getElementById('lesson-outcome').textContent",
        )
        .await;
        assert!(
            outcome.as_str().unwrap().starts_with('✓'),
            "{say}: {outcome}"
        );
        if say.as_str().unwrap() == "del x" {
            // Mid-lesson: x freed into the cache, reserved still held.
            shot(&page, "lesson.png").await;
        }
    }
    until(&page, "!!document.getElementById('lesson-done')").await;
    let url = js(&page, "location.search").await;
    assert!(
        url.as_str()
            .unwrap()
            .contains("lesson=01-del-vs-empty-cache"),
        "{url}"
    );

    // Click to numbers on screen.
    let mut latencies = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        press(&page, "btn-gc").await;
        latencies.push(t.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let in_page = press_to_numbers_p95(&page, 20).await;
    latencies.sort_by(f64::total_cmp);
    println!(
        "figure: button press to numbers on screen: p95 {:.1} ms measured in the page ({:.1} ms from the test driver)",
        in_page,
        latencies[(latencies.len() * 95 / 100).min(latencies.len() - 1)]
    );

    // The watch link follows the session live, read-only.
    let watcher = open(&browser, watch_link.as_str().unwrap()).await;
    assert_eq!(
        js(&watcher, "document.getElementById('btn-gc').disabled").await,
        Value::Bool(true)
    );
    // The presenter sees who watches: this test's own listener and the page.
    until(
        &page,
        "document.getElementById('watchers').textContent === '2 watchers'",
    )
    .await;
    let step = press_step(&page, "btn-alloc").await;
    let stats = server_stats(step).await;
    until(
        &watcher,
        &format!(
            "document.getElementById('allocated').dataset.bytes === '{}'",
            stats["allocated_bytes"]
        ),
    )
    .await;

    // Thousands of blocks: a 1024-layer model with Adam's state. The
    // presenter's tab in front again: a tab in the background draws its
    // charts when it is shown.
    page.bring_to_front().await.unwrap();
    set_input(&page, "layers", "1024").await;
    set_input(&page, "width", "64").await;
    press(&page, "btn-build").await;
    until(
        &page,
        "document.getElementById('last-step').textContent !== ''",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    press(&page, "btn-train-1").await;
    let blocks = until(&page, "(() => { const t = document.querySelector('.segments h2 small').textContent; const m = t.match(/(\\d+) blocks/); return m && Number(m[1]) >= 5000 ? Number(m[1]) : null; })()").await;
    let frame = js(&page, "(() => { const t = document.querySelector('.segments h2 small').textContent; return Number(t.match(/drawn in ([0-9.]+) ms/)[1]); })()").await;
    println!("figure: segment map with {blocks} blocks drawn in {frame} ms");
    shot(&page, "playground.png").await;

    // The estimate, from the training controls.
    press(&page, "btn-estimate").await;
    let explained = js(&page, "document.getElementById('explanation').textContent").await;
    assert!(
        explained
            .as_str()
            .unwrap()
            .contains("Predicted: parameters"),
        "{explained}"
    );

    // PyTorch 2.15's products freed their cuBLAS workspaces as they
    // returned; the page's button (folded under "more": rare) says there
    // is nothing to clear.
    let folded = js(
        &page,
        "!document.getElementById('btn-clear-cublas').checkVisibility()",
    )
    .await;
    assert_eq!(folded, Value::Bool(true));
    js(&page, "document.getElementById('more-calls').open = true").await;
    press(&page, "btn-clear-cublas").await;
    let explained = js(&page, "document.getElementById('explanation').textContent").await;
    assert!(
        explained
            .as_str()
            .unwrap()
            .contains("PyTorch 2.15 keeps no cuBLAS workspace"),
        "{explained}"
    );
    // A GPU preset and expandable segments, from the kernel's controls.
    js(&page, "(() => { const s = document.getElementById('gpu'); s.value = 'h100-80gb'; s.dispatchEvent(new Event('change', {bubbles: true})); const box = [...document.querySelectorAll('label')].find(l => l.textContent.includes('expandable_segments')).querySelector('input'); box.checked = true; box.dispatchEvent(new Event('change', {bubbles: true})); })()").await;
    press(&page, "btn-restart-settings").await;
    until(
        &page,
        "document.getElementById('device').textContent.includes('H100')",
    )
    .await;
    let code = js(&page, "document.getElementById('code').textContent").await;
    assert!(
        code.as_str()
            .unwrap()
            .contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        "{code}"
    );

    // Another framework: the page follows the restart (code, URL, notes).
    js(&page, "(() => { const s = document.getElementById('framework'); s.value = 'tensorflow'; s.dispatchEvent(new Event('change', {bubbles: true})); })()").await;
    // Picking it starts its kernel at once.
    until(
        &page,
        "document.getElementById('device').textContent.includes('TensorFlow')",
    )
    .await;
    press(&page, "btn-restart-settings").await;
    press(&page, "btn-alloc").await;
    let code = js(&page, "document.getElementById('code').textContent").await;
    assert!(
        code.as_str()
            .unwrap()
            .trim_end()
            .ends_with("x = tf.zeros([64 * 2**20], tf.uint8)"),
        "{code}"
    );
    assert!(js(&page, "location.search")
        .await
        .as_str()
        .unwrap()
        .contains("framework=tensorflow"));
    // Under TensorFlow the controls are TensorFlow's: no empty_cache()
    // button, and the page says why; the numbers are named as TF names them.
    let tf = js(&page, "[document.getElementById('btn-empty-cache').offsetParent === null, document.getElementById('btn-clear-session').offsetParent !== null, document.getElementById('no-empty-cache').textContent, document.getElementById('api-allocated').textContent]").await;
    assert_eq!(tf[0], Value::Bool(true), "{tf}");
    assert_eq!(tf[1], Value::Bool(true), "{tf}");
    assert!(
        tf[2]
            .as_str()
            .unwrap()
            .contains("TensorFlow has no empty_cache()"),
        "{tf}"
    );
    assert!(tf[3].as_str().unwrap().contains("get_memory_info"), "{tf}");
    press(&page, "btn-clear-session").await;
    let explained = js(&page, "document.getElementById('explanation').textContent").await;
    assert!(
        explained.as_str().unwrap().contains("Keras: clear_session"),
        "{explained}"
    );

    // ?hide= hides control groups for a focused exercise.
    let focused = open(&browser, &format!("http://{addr}/?hide=training,framework")).await;
    let hidden = js(&focused, "[...document.querySelectorAll('fieldset')].filter(f => f.hidden).map(f => f.querySelector('legend').textContent)").await;
    assert_eq!(hidden, serde_json::json!(["Process", "Training"]));

    listener.abort();
    let _ = stop_tx.send(());
    browser.close().await.unwrap();
    browser.wait().await.unwrap();
    events.abort();
    let _ = std::fs::remove_dir_all(&profile);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_reconnects_when_the_server_comes_back() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("reconnect").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    let first = until(&page, "document.getElementById('watch-link').value").await;
    press(&page, "btn-alloc").await;
    // The server goes away...
    let _ = stop_tx.send(());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ...and comes back on the same port, without the old session.
    let (_stop2, stop2_rx) = tokio::sync::oneshot::channel::<()>();
    serve_on(addr.port(), stop2_rx).await;
    until(
        &page,
        &format!("document.getElementById('status').textContent === 'connected' && document.getElementById('watch-link').value !== {first}"),
    )
    .await;
    let step = press_step(&page, "btn-alloc").await;
    assert_eq!(step, 0, "a fresh session counts from 0");
    browser.close().await.unwrap();
    browser.wait().await.unwrap();
    events.abort();
    let _ = std::fs::remove_dir_all(&profile);
}
