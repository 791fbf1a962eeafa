//! Driving headless Chromium against the real server: starting both, and
//! reading and clicking the page. Each browser test file uses a part.
#![allow(dead_code)]

use chromiumoxide::browser::{Browser, BrowserConfig};
use chromiumoxide::page::ScreenshotParams;
use chromiumoxide::Page;
use futures::StreamExt;
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vramlab_backend::{select, DeviceChoice};
use vramlab_http::http::{build, ServeOptions};
use vramlab_tests::root;

pub const WAIT: Duration = Duration::from_secs(30);

pub fn chromium() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("CHROMIUM").map(PathBuf::from),
        Some(PathBuf::from("/usr/bin/chromium")),
        Some(PathBuf::from("/usr/bin/chromium-browser")),
    ];
    candidates.into_iter().flatten().find(|p| p.exists())
}

/// Browser tests skip where Chromium or the built app is missing, unless
/// VRAMLAB_REQUIRE_BROWSER is set (the test command sets it).
pub fn prerequisites() -> Option<PathBuf> {
    let dist = root().join("dist/index.html");
    let found = chromium().filter(|_| dist.exists());
    if found.is_none() {
        assert!(
            std::env::var_os("VRAMLAB_REQUIRE_BROWSER").is_none(),
            "browser test needs Chromium and dist/ (scripts/setup, scripts/build-web)"
        );
        eprintln!("skip: Chromium or dist/ missing");
    }
    found
}

/// Serves on `port` (0: any) until `stop` fires; returns the address.
pub async fn serve_on(port: u16, stop: tokio::sync::oneshot::Receiver<()>) -> std::net::SocketAddr {
    let options = ServeOptions {
        dist: Some(root().join("dist")),
        ..ServeOptions::default()
    };
    let server = build(&options, select(DeviceChoice::Sim, 0).unwrap()).unwrap();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(vramlab_http::http::serve_until(
        listener,
        server,
        async move {
            let _ = stop.await;
        },
    ));
    addr
}

pub async fn launch(name: &str) -> (Browser, tokio::task::JoinHandle<()>, PathBuf) {
    let profile =
        std::env::temp_dir().join(format!("vramlab-chromium-{}-{name}", std::process::id()));
    let config = BrowserConfig::builder()
        .chrome_executable(chromium().unwrap())
        .no_sandbox()
        .user_data_dir(&profile)
        // A cold start on a small machine can take longer than the
        // library's 20 s.
        .launch_timeout(std::time::Duration::from_secs(90))
        .window_size(1280, 1000)
        .viewport(Some(chromiumoxide::handler::viewport::Viewport {
            width: 1280,
            height: 1000,
            ..Default::default()
        }))
        .args([
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .build()
        .unwrap();
    let (browser, mut handler) = Browser::launch(config).await.expect("Chromium starts");
    let events = tokio::spawn(async move { while handler.next().await.is_some() {} });
    (browser, events, profile)
}

/// Opens a page and waits until it is connected to the server.
pub async fn open(browser: &Browser, url: &str) -> Page {
    // A blank page first, then the address: `new_page(url)` can miss a
    // fast page's load event and wait for ever.
    let page = browser.new_page("about:blank").await.unwrap();
    tokio::time::timeout(WAIT, page.goto(url))
        .await
        .unwrap_or_else(|_| panic!("{url} did not load in {WAIT:?}"))
        .unwrap();
    until(
        &page,
        "document.getElementById('status').textContent === 'connected'",
    )
    .await;
    page
}

pub async fn js(page: &Page, script: &str) -> Value {
    tokio::time::timeout(WAIT, page.evaluate(script))
        .await
        .unwrap_or_else(|_| panic!("{script}: no answer in {WAIT:?}"))
        .unwrap_or_else(|e| panic!("{script}: {e}"))
        .into_value()
        .unwrap_or(Value::Null)
}

/// Polls a JS expression until it is truthy; returns its value.
pub async fn until(page: &Page, expr: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let v = js(
            page,
            &format!("(() => {{ try {{ return {expr}; }} catch (e) {{ return null; }} }})()"),
        )
        .await;
        if !(v.is_null() || v == Value::Bool(false) || v == Value::String(String::new())) {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {expr}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub async fn click(page: &Page, id: &str) {
    js(page, &format!("document.getElementById('{id}').click()")).await;
}

/// Opens a lesson from the first screen (`lesson-N`) and waits for its
/// steps: the page fetches a lesson's commands when it opens.
pub async fn open_lesson(page: &Page, id: &str) {
    click(page, id).await;
    until(page, "!!document.getElementById('lesson-progress')").await;
}

pub async fn set_input(page: &Page, id: &str, value: &str) {
    js(
        page,
        &format!("(() => {{ const e = document.getElementById('{id}'); e.value = '{value}'; e.dispatchEvent(new Event('input', {{bubbles: true}})); }})()"),
    )
    .await;
}

pub async fn shot(page: &Page, name: &str) {
    save_shot(page, name, true).await;
}

/// What is on screen only (the window, not the whole page).
pub async fn shot_screen(page: &Page, name: &str) {
    save_shot(page, name, false).await;
}

async fn save_shot(page: &Page, name: &str, full_page: bool) {
    let dir = root().join("target/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    page.save_screenshot(
        ScreenshotParams::builder().full_page(full_page).build(),
        dir.join(name),
    )
    .await
    .unwrap();
}

/// Emulates a screen `width` x `height` CSS pixels (a phone when narrow).
pub async fn viewport(page: &Page, width: i64, height: i64) {
    use chromiumoxide::cdp::browser_protocol::emulation::SetDeviceMetricsOverrideParams;
    let params = SetDeviceMetricsOverrideParams::new(width, height, 1.0, width < 600);
    page.execute(params).await.unwrap();
}

/// The number of results the page has shown (a JS expression).
pub const COUNT: &str = "Number(document.getElementById('result-count').textContent || 0)";

/// How many results the page has shown.
pub async fn results(page: &Page) -> i64 {
    js(page, COUNT).await.as_i64().unwrap_or(0)
}

/// Clicks a button and waits for the result it causes to be on screen.
pub async fn press(page: &Page, id: &str) {
    let before = results(page).await;
    click(page, id).await;
    until(page, &format!("{COUNT} > {before}")).await;
}

/// The five buttons, after making something to free, and a restart.
pub const FIVE_BUTTONS: [&str; 8] = [
    "btn-alloc",
    "btn-hold",
    "btn-del",
    "btn-gc",
    "btn-empty-cache",
    "btn-alloc",
    "btn-gc",
    "btn-restart",
];

/// The p95 of `presses` presses of gc.collect() to the new step on screen,
/// measured in the page (a MutationObserver on the step number).
pub async fn press_to_numbers_p95(page: &Page, presses: usize) -> f64 {
    js(page, &format!(r#"(async () => {{
        const times = [];
        for (let i = 0; i < {presses}; i++) {{
            const el = document.getElementById('last-step');
            const before = el.textContent;
            const t0 = performance.now();
            document.getElementById('btn-gc').click();
            await new Promise(r => {{ const o = new MutationObserver(() => {{ if (el.textContent !== before) {{ o.disconnect(); r(); }} }}); o.observe(el, {{childList: true, characterData: true, subtree: true}}); }});
            times.push(performance.now() - t0);
            await new Promise(r => setTimeout(r, 30));
        }}
        times.sort((a, b) => a - b);
        return times[Math.floor(0.95 * (times.length - 1))];
    }})()"#)).await.as_f64().unwrap()
}

/// Closes the browser and removes its profile.
pub async fn finish(mut browser: Browser, events: tokio::task::JoinHandle<()>, profile: PathBuf) {
    browser.close().await.unwrap();
    browser.wait().await.unwrap();
    events.abort();
    let _ = std::fs::remove_dir_all(&profile);
}

/// Types `code` into the cell, as pasting does.
pub async fn type_code(page: &Page, code: &str) {
    let code = serde_json::to_string(code).unwrap();
    js(page, &format!("(() => {{ const e = document.getElementById('cell-source'); e.value = {code}; e.dispatchEvent(new Event('input', {{bubbles: true}})); }})()")).await;
}

/// Clicks ▶ Run all on code whose second statement allocates; returns the
/// milliseconds, measured in the page, until that statement is done with
/// its numbers on screen (Pyodide loading on a cell's first run).
pub async fn run_all_to_numbers(page: &Page) -> f64 {
    type_code(
        page,
        "import torch\nx = torch.zeros(1024, 1024, device='cuda')\n",
    )
    .await;
    let ms = js(
        page,
        "new Promise(done => { const t0 = performance.now(); document.getElementById('cell-run').click();
            const check = () => { const li = document.getElementById('cell-step-1');
                if (li && li.dataset.state === 'done' && Number(document.getElementById('allocated').dataset.bytes) === 4194304) done(performance.now() - t0);
                else requestAnimationFrame(check); };
            check(); })",
    )
    .await;
    ms.as_f64().unwrap_or_else(|| panic!("{ms}"))
}

/// What loading the cell's Python took, as the cell says it (the bytes
/// are Chromium's count in the Python worker).
pub async fn python_loaded(page: &Page) -> String {
    let said = until(page, "document.getElementById('cell-python').textContent").await;
    said.as_str().unwrap_or_default().to_string()
}

/// Chooses `path` in file input `id`, as a user does in the file dialog.
pub async fn choose_file(page: &Page, id: &str, path: &std::path::Path) {
    use chromiumoxide::cdp::browser_protocol::dom::SetFileInputFilesParams;
    let input = page.find_element(format!("#{id}")).await.unwrap();
    page.execute(SetFileInputFilesParams {
        files: vec![path.display().to_string()],
        node_id: None,
        backend_node_id: Some(input.backend_node_id),
        object_id: None,
    })
    .await
    .unwrap();
}

/// Opens snapshots/ and waits for its file input.
pub async fn open_snapshots(browser: &Browser, url: &str) -> Page {
    let page = browser.new_page("about:blank").await.unwrap();
    tokio::time::timeout(WAIT, page.goto(url))
        .await
        .unwrap_or_else(|_| panic!("{url} did not load in {WAIT:?}"))
        .unwrap();
    until(&page, "document.getElementById('snapshot-file') !== null").await;
    page
}

/// Builds a transformer small enough to compute (1 layer of width 32,
/// sequences of 16 over 64 words, batch 8) and plays 30 steps; the loss of
/// the first and of the last, as the page says them.
pub async fn small_transformer_losses(page: &Page) -> (f64, f64) {
    js(page, "(() => { const s = document.getElementById('model-kind'); s.value = 'transformer'; s.dispatchEvent(new Event('change', {bubbles: true})); })()").await;
    for (id, value) in [
        ("layers", "1"),
        ("width", "32"),
        ("heads", "2"),
        ("seq-slider", "4"),
        ("vocab", "64"),
        ("batch", "8"),
        ("steps", "30"),
    ] {
        set_input(page, id, value).await;
    }
    js(page, "(() => { const s = document.getElementById('play-speed'); s.value = '0'; s.dispatchEvent(new Event('change', {bubbles: true})); })()").await;
    click(page, "btn-build").await;
    until(page, &format!("{COUNT} >= 3")).await;
    click(page, "btn-play").await;
    let done =
        "document.getElementById('play-status').textContent.startsWith('step 30 of 30: loss')";
    until(page, done).await;
    let status = js(page, "document.getElementById('play-status').textContent").await;
    let status = status.as_str().unwrap();
    let (first, last) = status
        .trim_start_matches("step 30 of 30: loss ")
        .split_once(" → ")
        .unwrap();
    (first.parse().unwrap(), last.parse().unwrap())
}
