//! The playground with no vramlab server at all: `dist/` served by a plain
//! static file server (Python's `http.server`), the engine running in a Web
//! Worker of the page. Every lesson is played through, the five buttons,
//! training and the segment map are used, and every result the page got
//! equals what `vramlab run` prints for the same command lines. The figures
//! (download, button press to numbers, frame gaps while training plays)
//! are printed. A session begun in the page moves to a server.

mod chromium;

use chromium::*;
use chromiumoxide::Page;
use serde_json::Value;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vramlab_tests::{free_port, python_run, root, run_stdin, Process};

/// Python's static file server over `dist/`, on a free port.
/// The plan page's answer to the question its form holds, asked now, equal
/// to the command line's to `vramlab plan Llama-3.1-8B --gpu rtx-4090
/// ARGS --json`; `ready` is true of the awaited answer `a`. The page's time
/// in milliseconds.
async fn page_answers_as_the_cli(page: &Page, ready: &str, args: &[&str]) -> String {
    click(page, "plan-go").await;
    let script = format!("(() => {{ const t = document.getElementById('plan-answer').dataset.answer; const a = t && JSON.parse(t); return a && {ready} && t; }})()");
    let answer = until(page, &script).await;
    let answer: Value = serde_json::from_str(answer.as_str().unwrap()).unwrap();
    let cli = Command::new(vramlab_tests::vramlab_bin())
        .args(["plan", "Llama-3.1-8B", "--gpu", "rtx-4090"])
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(
        answer, cli,
        "the page and `vramlab plan {args:?}` answer alike"
    );
    let ms = js(page, "document.getElementById('plan-time').dataset.ms").await;
    ms.as_str().unwrap_or("?").to_string()
}

fn static_server() -> (Process, u16) {
    let port = free_port();
    let child = Command::new("python3")
        .args(["-m", "http.server", "--bind", "127.0.0.1"])
        .arg(port.to_string())
        .arg("--directory")
        .arg(root().join("dist"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 starts");
    let process = Process(child);
    let deadline = Instant::now() + WAIT;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the static server did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (process, port)
}

/// Records every message between the page and its engine's worker.
const RECORDER: &str = r#"
window.__sent = []; window.__got = [];
const PageWorker = window.Worker;
window.Worker = function (url, options) {
    const w = new PageWorker(url, options);
    const post = w.postMessage.bind(w);
    w.postMessage = (m) => { window.__sent.push(m); post(m); };
    w.addEventListener('message', (e) => window.__got.push(e.data));
    return w;
};
"#;

async fn open_static(browser: &chromiumoxide::Browser, url: &str) -> Page {
    let page = browser.new_page("about:blank").await.unwrap();
    page.evaluate_on_new_document(RECORDER).await.unwrap();
    tokio::time::timeout(WAIT, page.goto(url))
        .await
        .unwrap_or_else(|_| panic!("{url} did not load in {WAIT:?}"))
        .unwrap();
    page
}

/// Plays every lesson from the first, step by step, through "next lesson".
async fn play_every_lesson(page: &Page) -> usize {
    open_lesson(page, "lesson-0").await;
    let mut lessons = 1;
    loop {
        until(
            page,
            "document.getElementById('lesson-do') || document.getElementById('lesson-done')",
        )
        .await;
        if js(page, "!!document.getElementById('lesson-done')").await == Value::Bool(true) {
            if js(page, "!!document.getElementById('lesson-next')").await != Value::Bool(true) {
                return lessons;
            }
            click(page, "lesson-next").await;
            lessons += 1;
            until(page, "!!document.getElementById('lesson-do')").await;
            continue;
        }
        let say = js(page, "document.getElementById('lesson-code').textContent").await;
        press(page, "lesson-do").await;
        let outcome = until(
            page,
            "document.getElementById('lesson-outcome').textContent",
        )
        .await;
        assert!(
            outcome.as_str().unwrap().starts_with('✓'),
            "lesson {lessons}, {say}: {outcome}"
        );
    }
}

/// The messages that crossed between the page and its engine (`__sent` or
/// `__got`), read here from their texts (JSON.parse would turn 0.0 into 0).
async fn crossed(page: &Page, list: &str) -> Vec<Value> {
    let texts: Vec<String> =
        serde_json::from_value(js(page, &format!("window.{list}")).await).unwrap();
    texts
        .iter()
        .map(|t| serde_json::from_str::<Value>(t).unwrap())
        .collect()
}

/// The commands the page sent, in order, each with its id: one
/// `command` message each, or several in a `commands` batch (the cell's).
fn sent_commands(messages: Vec<Value>) -> Vec<(u64, Value)> {
    let mut out = Vec::new();
    for m in messages {
        match m["type"].as_str() {
            Some("command") => out.push((m["id"].as_u64().unwrap(), m["command"].clone())),
            Some("commands") => {
                let first = m["first_id"].as_u64().unwrap();
                for (id, c) in (first..).zip(m["commands"].as_array().unwrap()) {
                    out.push((id, c.clone()));
                }
            }
            _ => {}
        }
    }
    out
}

/// Every result the page received equals `vramlab run`'s record for the
/// command lines the page sent, in order.
async fn same_as_vramlab_run(page: &Page) -> usize {
    let of_type = |messages: Vec<Value>, kind: &str| -> Vec<Value> {
        messages.into_iter().filter(|m| m["type"] == kind).collect()
    };
    let lines: Vec<String> = sent_commands(crossed(page, "__sent").await)
        .iter()
        .map(|(_, c)| c.to_string())
        .collect();
    let got = of_type(crossed(page, "__got").await, "result");
    let (expected, stderr, _) = run_stdin(&(lines.join("\n") + "\n"), &[]);
    assert_eq!(expected.len(), lines.len(), "{stderr}");
    assert_eq!(got.len(), lines.len());
    for (mut page_result, run) in got.into_iter().zip(&expected) {
        let object = page_result.as_object_mut().unwrap();
        object.remove("type");
        object.remove("id");
        assert_eq!(&page_result, run);
    }
    lines.len()
}

async fn numbers_match_the_last_result(page: &Page) {
    let on_screen = js(page, "['allocated','reserved','device-used'].map(id => Number(document.getElementById(id).dataset.bytes))").await;
    let last = js(page, "(() => { const r = window.__got.map(m => JSON.parse(m)).filter(m => m.type === 'result').pop().stats; return [r.allocated_bytes, r.reserved_bytes, r.device_used_bytes]; })()").await;
    assert_eq!(on_screen, last);
}

/// Plays 100 training steps as fast as the engine answers; returns the
/// longest and the p95 gap between frames on the main thread meanwhile.
async fn play_training(page: &Page) -> (f64, f64) {
    // A model small enough that each step computes its loss.
    set_input(page, "layers", "2").await;
    set_input(page, "width", "128").await;
    set_input(page, "batch", "32").await;
    press(page, "btn-build").await;
    set_input(page, "steps", "100").await;
    js(page, "(() => { const s = document.getElementById('play-speed'); s.value = '0'; s.dispatchEvent(new Event('change', {bubbles: true})); })()").await;
    js(page, "window.__frames = []; window.__playing = true; (function tick(t) { window.__frames.push(t); if (window.__playing) requestAnimationFrame(tick); })(performance.now())").await;
    click(page, "btn-play").await;
    until(
        page,
        "document.getElementById('play-status').textContent.startsWith('step 100 of 100')",
    )
    .await;
    let gaps = js(page, "(() => { window.__playing = false; const f = window.__frames; const g = []; for (let i = 1; i < f.length; i++) g.push(f[i] - f[i-1]); g.sort((a, b) => a - b); return [g[g.length - 1], g[Math.floor(0.95 * (g.length - 1))]]; })()").await;
    (gaps[0].as_f64().unwrap(), gaps[1].as_f64().unwrap())
}

/// Picks where the engine runs in the page's control; the page loads again.
async fn switch_engine(page: &Page, engine: &str) {
    js(page, &format!("(() => {{ const s = document.getElementById('engine'); s.value = '{engine}'; s.dispatchEvent(new Event('change', {{bubbles: true}})); }})()")).await;
    tokio::time::timeout(WAIT, page.wait_for_navigation())
        .await
        .expect("the page loads again")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_playground_with_no_server() {
    if prerequisites().is_none() {
        return;
    }
    let (_server, port) = static_server();
    let (browser, events, profile) = launch("static").await;
    let page = open_static(&browser, &format!("http://127.0.0.1:{port}/")).await;
    // Nothing answers on /ws: the page says so and runs the engine itself.
    until(&page, "document.getElementById('status').textContent === 'no server answered: the engine runs in this page'").await;
    let note = js(&page, "document.getElementById('needs-server').hidden").await;
    assert_eq!(note, Value::Bool(false));
    // Moving the session to a server that is not there: said, and nothing
    // moves (the page does not go to a "reconnecting" that never ends).
    click(&page, "move-to-server").await;
    until(&page, "document.getElementById('banner').textContent.includes('No vramlab server answers at this address')").await;
    let status = js(&page, "location.search.includes('engine=server') || document.getElementById('status').textContent").await;
    assert_eq!(
        status.as_str(),
        Some("no server answered: the engine runs in this page")
    );

    for id in FIVE_BUTTONS {
        press(&page, id).await;
        numbers_match_the_last_result(&page).await;
    }
    let lessons = play_every_lesson(&page).await;
    assert_eq!(lessons, vramlab_tests::lesson_files().len());

    let p95 = press_to_numbers_p95(&page, 40).await;
    println!("figure: no server: button press to numbers on screen: p95 {p95:.1} ms measured in the page");
    click(&page, "lesson-all").await;
    let (longest, gap95) = play_training(&page).await;
    println!("figure: no server: 100 training steps played: longest frame gap {longest:.1} ms, p95 {gap95:.1} ms");
    let losses = js(&page, "document.getElementById('loss-curve').querySelector('polyline').getAttribute('points').split(' ').length").await;
    assert_eq!(losses.as_u64(), Some(100));
    let map = until(&page, "(() => { const t = document.querySelector('.segments h2 small').textContent; return /\\d+ blocks/.test(t) && t; })()").await;
    println!("figure: no server: segment map: {map}");
    numbers_match_the_last_result(&page).await;
    let commands = same_as_vramlab_run(&page).await;
    println!("no server: {commands} results equal vramlab run's");

    // The engine control: to the server (none here), and back to the page.
    switch_engine(&page, "server").await;
    until(&page, "location.search.includes('engine=server') && document.getElementById('status').textContent.includes('reconnecting')").await;
    switch_engine(&page, "local").await;
    until(&page, "location.search.includes('engine=local') && document.getElementById('status').textContent === 'engine in this page'").await;
    press(&page, "btn-alloc").await;
    numbers_match_the_last_result(&page).await;

    finish(browser, events, profile).await;
}

/// A session begun in the page moves to a server: its commands are
/// replayed there, the numbers are the same, and it gets a watch link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_session_moves_to_the_server() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (browser, events, profile) = launch("move").await;
    let page = open_static(&browser, &format!("http://{addr}/?engine=local")).await;
    until(
        &page,
        "document.getElementById('status').textContent === 'engine in this page'",
    )
    .await;
    for id in ["btn-alloc", "btn-hold", "btn-alloc", "btn-del", "btn-gc"] {
        press(&page, id).await;
    }
    let numbers = "['allocated','reserved','device-used'].map(id => document.getElementById(id).dataset.bytes).join(' ')";
    let before = js(&page, numbers).await;
    click(&page, "move-to-server").await;
    tokio::time::timeout(WAIT, page.wait_for_navigation())
        .await
        .expect("the page loads again")
        .unwrap();
    until(&page, "document.getElementById('status').textContent === 'connected' && document.getElementById('banner').textContent.includes('the 5 commands this page ran were replayed')").await;
    assert_eq!(js(&page, numbers).await, before);
    assert_eq!(
        js(&page, "document.getElementById('last-step').textContent").await,
        "4"
    );
    until(
        &page,
        "document.getElementById('watch-link').value.includes('?watch=')",
    )
    .await;
    // A reload resumes the session and does not replay the lines again.
    page.reload().await.unwrap();
    until(
        &page,
        "document.getElementById('status').textContent === 'connected'",
    )
    .await;
    press(&page, "btn-gc").await;
    assert_eq!(
        js(&page, "document.getElementById('last-step').textContent").await,
        "5"
    );
    assert_eq!(js(&page, numbers).await, before);

    let _ = stop_tx.send(());
    finish(browser, events, profile).await;
}

/// A training loop of 300 steps as people write it, run from the code cell.
const LONG_LOOP: &str = "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\nX = torch.randn(20000, 784)\ny = torch.randint(0, 10, (20000,))\nloader = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True)\nmodel = nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10)).cuda()\nopt = torch.optim.Adam(model.parameters())\ncriterion = nn.CrossEntropyLoss()\nfor step, (x, y) in zip(range(300), loader):\n    x, y = x.cuda(), y.cuda()\n    loss = criterion(model(x), y)\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\nprint('done')\n";

/// Keras's `fit` of 300 steps: one command of the engine's, which reports
/// its progress.
const KERAS_FIT: &str = "import numpy as np\nimport tensorflow as tf\nx = np.zeros((19200, 784), dtype='float32')\ny = np.zeros((19200,), dtype='int64')\nmodel = tf.keras.Sequential([tf.keras.layers.Dense(64, activation='relu', input_shape=(784,)), tf.keras.layers.Dense(10)])\nmodel.compile(optimizer='adam', loss='sparse_categorical_crossentropy')\nmodel.fit(x, y, batch_size=64, epochs=1)\n";

/// ❚❚ pause stops the cell's Python where the page's engine is, as
/// Jupyter's interrupt does (`KeyboardInterrupt` in the statement), and
/// stops a long command (Keras's `fit`) after the step the page showed,
/// as the server stops it after its current step; the page goes on
/// working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_a_long_loop_in_the_page() {
    if prerequisites().is_none() {
        return;
    }
    let (_server, port) = static_server();
    let (browser, events, profile) = launch("pause").await;
    let page = open_static(&browser, &format!("http://127.0.0.1:{port}/?engine=local")).await;
    until(
        &page,
        "document.getElementById('status').textContent === 'engine in this page'",
    )
    .await;
    let cold = run_all_to_numbers(&page).await;
    let warm = run_all_to_numbers(&page).await;
    println!("figure: no server: ▶ Run all to the first statement's numbers: {cold:.0} ms cold (Python loading), {warm:.0} ms warm");
    println!("figure: no server: {}", python_loaded(&page).await);
    type_code(&page, LONG_LOOP).await;
    click(&page, "cell-run").await;
    let (sent, took) = interrupt_the_loop(&page).await;
    println!("figure: no server: a 300-step Python loop stopped after {sent} of its commands, {took:.2?} after the press");
    numbers_match_the_last_result(&page).await;
    // The engine goes on answering, and the cell runs again.
    press(&page, "btn-alloc").await;
    numbers_match_the_last_result(&page).await;
    type_code(&page, KERAS_FIT).await;
    click(&page, "cell-run").await;
    let (done, took) = pause_the_fit(&page).await;
    println!("figure: no server: Keras's 300-step fit paused at step {done}, answered {took:.2?} after the press");
    numbers_match_the_last_result(&page).await;
    // ▶ Run all on other code while a loop runs: the loop stops, none of
    // its later lines reach the engine, and the new code ends as
    // `vramlab python` ends it.
    type_code(&page, LONG_LOOP).await;
    click(&page, "cell-run").await;
    until(
        &page,
        "document.getElementById('cell-step-9').dataset.state === 'running'",
    )
    .await;
    let small = "import torch\nx = torch.zeros(1024, 1024, device='cuda')\n";
    type_code(&page, small).await;
    click(&page, "cell-run").await;
    until(&page, "document.getElementById('cell-step-1').dataset.state === 'done' && !document.getElementById('cell-step-2')").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    numbers_match_the_last_result(&page).await;
    let (_, expected) = python_run(small);
    let on_screen = js(
        &page,
        "['allocated','reserved'].map(id => Number(document.getElementById(id).dataset.bytes))",
    )
    .await;
    assert_eq!(on_screen, serde_json::json!([expected[0], expected[1]]));
    same_as_stopped_loops_run(&page).await;
    assert_eq!(
        js(&page, "document.getElementById('status').textContent").await,
        "engine in this page"
    );
    finish(browser, events, profile).await;
}

/// The loop statement (the cell's tenth) runs with at least 60 of its
/// commands answered: ❚❚ pause. The statement raises `KeyboardInterrupt`,
/// the one after it never runs, and the answers stop with the commands
/// already sent. Returns how many results the loop had, and how long
/// until the answers stopped.
async fn interrupt_the_loop(page: &Page) -> (u64, Duration) {
    let results = "window.__got.map(m => JSON.parse(m)).filter(m => m.type === 'result').length";
    let before = js(page, results).await.as_u64().unwrap();
    until(page, &format!("document.getElementById('cell-step-9').dataset.state === 'running' && {results} >= {before} + 60")).await;
    let pressed = Instant::now();
    click(page, "btn-pause").await;
    let why = until(page, "document.getElementById('cell-step-9').dataset.state === 'failed' && document.querySelector('#cell-step-9 pre.why').textContent").await;
    assert!(
        why.as_str().unwrap().starts_with("KeyboardInterrupt"),
        "{why}"
    );
    let mut last = js(page, results).await.as_u64().unwrap();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = js(page, results).await.as_u64().unwrap();
        if now == last {
            break;
        }
        last = now;
    }
    let took = pressed.elapsed();
    assert_eq!(
        js(
            page,
            "document.getElementById('cell-step-10').dataset.state"
        )
        .await,
        "waiting"
    );
    assert!(
        last - before < 1500,
        "{} results: the loop ran on",
        last - before
    );
    (last - before, took)
}

/// Waits for `fit` to show step 3 or later, presses ❚❚ pause and reads
/// the stopped command's result: the step it stopped after (no earlier
/// than the one on screen), and how long after the press it came.
async fn pause_the_fit(page: &Page) -> (u64, Duration) {
    let seen = until(page, "(() => { const m = document.querySelector('.big.peak .api').textContent.match(/^step (\\d+) of 300$/); return m && Number(m[1]) >= 3 && Number(m[1]); })()").await;
    let seen = seen.as_f64().unwrap_or_else(|| panic!("{seen}")) as u64;
    let pressed = Instant::now();
    click(page, "btn-pause").await;
    let note = until(page, "(() => { const r = window.__got.map(m => JSON.parse(m)).filter(m => m.type === 'result' && m.cmd.cmd === 'train'); return r.length === 1 ? r[0].note : null; })()").await;
    let took = pressed.elapsed();
    let note = note.as_str().unwrap();
    let done = stopped_after(note).unwrap_or_else(|| panic!("{note}"));
    assert!(
        (seen..300).contains(&done) && note.contains(" of 300 steps."),
        "seen {seen}, {note}"
    );
    (done, took)
}

fn stopped_after(note: &str) -> Option<u64> {
    note.strip_prefix("Stopped after ")?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// The page's last numbers equal `vramlab run`'s for the lines it sent (once
/// each), each stopped loop as the steps it ran.
async fn same_as_stopped_loops_run(page: &Page) {
    let results = crossed(page, "__got").await;
    let results: Vec<&Value> = results.iter().filter(|m| m["type"] == "result").collect();
    let stopped = |id: &Value| {
        let r = results.iter().find(|r| r["id"] == *id)?;
        stopped_after(r["note"].as_str()?)
    };
    let mut lines = Vec::new();
    let mut sent = std::collections::HashSet::new();
    for (id, mut line) in sent_commands(crossed(page, "__sent").await) {
        // A command queued behind a stopped loop is sent again to the new
        // engine: it runs once.
        if !sent.insert(id) {
            continue;
        }
        if let Some(steps) = stopped(&Value::from(id)) {
            line["steps"] = steps.into();
        }
        lines.push(line.to_string());
    }
    let (expected, stderr, _) = run_stdin(&(lines.join("\n") + "\n"), &[]);
    assert_eq!(expected.len(), lines.len(), "{stderr}");
    let last = results.last().unwrap();
    assert_eq!(last["stats"], expected.last().unwrap()["stats"]);
}

/// "Will it fit?" (`plan/`), a page of its own the playground links to:
/// a shipped shape answered with the same numbers `vramlab plan --json`
/// prints, a config.json dropped on the page answered too, and a pasted
/// file that is not JSON refused with the reason. The time the page took
/// for an 8B model's question is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn will_it_fit_answers_in_its_own_page() {
    if prerequisites().is_none() {
        return;
    }
    let (_server, port) = static_server();
    let (browser, events, profile) = launch("plan").await;
    let playground = open_static(&browser, &format!("http://127.0.0.1:{port}/")).await;
    let link = until(
        &playground,
        "document.querySelector('a.plan').getAttribute('href')",
    )
    .await;
    assert_eq!(link, "./plan/");

    let page = open_static(&browser, &format!("http://127.0.0.1:{port}/plan/")).await;
    until(&page, "document.body.dataset.ready === 'true'").await;
    set_input(&page, "plan-batch", "1").await;
    set_input(&page, "plan-prompt", "512").await;
    set_input(&page, "plan-new-tokens", "64").await;
    click(&page, "plan-go").await;
    let answer = until(
        &page,
        "document.getElementById('plan-answer').dataset.answer",
    )
    .await;
    let answer: Value = serde_json::from_str(answer.as_str().unwrap()).unwrap();
    let verdict = js(&page, "document.getElementById('plan-verdict').textContent").await;
    let verdict = verdict.as_str().unwrap();
    assert!(
        verdict.starts_with(
            "Fits. Llama-3.1-8B (LlamaForCausalLM, 8.03B parameters) in bfloat16 on NVIDIA GeForce RTX 4090, PyTorch 2.15: peak allocated"
        ),
        "{verdict}"
    );
    let cli = Command::new(vramlab_tests::vramlab_bin())
        .args([
            "plan",
            "Llama-3.1-8B",
            "--gpu",
            "rtx-4090",
            "--batch",
            "1",
            "--prompt",
            "512",
        ])
        .args(["--new-tokens", "64", "--json"])
        .output()
        .unwrap();
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(answer, cli, "the page and the command line answer alike");
    // The peak by forward, drawn: one point each (the prefill, 64 tokens).
    let points = js(
        &page,
        "document.querySelector('#plan-chart polyline').getAttribute('points').split(' ').length",
    )
    .await;
    assert_eq!(points.as_u64(), Some(64));
    shot(&page, "plan.png").await;
    let ms = js(&page, "document.getElementById('plan-time').dataset.ms").await;
    println!("figure: will it fit: Llama-3.1-8B generate (1 x 512 + 64 tokens) on an RTX 4090, with the largest batch and longest prompt searched: {} ms in the page", ms.as_str().unwrap_or("?"));

    // The PyTorch release picked: 2.11 keeps cuBLAS's workspace from the
    // first product (8,519,680 bytes on an RTX 4090), and the verdict says
    // which release it answers for.
    js(
        &page,
        "document.getElementById('plan-torch').value = '2.11'",
    )
    .await;
    click(&page, "plan-go").await;
    let answer = until(
        &page,
        "(() => { const a = document.getElementById('plan-answer').dataset.answer; return a && JSON.parse(a).torch === '2.11' && a; })()",
    )
    .await;
    let answer: Value = serde_json::from_str(answer.as_str().unwrap()).unwrap();
    assert_eq!(
        answer["at_peak"]["cuBLAS workspaces"], 8_519_680,
        "{answer}"
    );
    let verdict = js(&page, "document.getElementById('plan-verdict').textContent").await;
    assert!(
        verdict.as_str().unwrap().contains(", PyTorch 2.11: "),
        "{verdict}"
    );
    js(
        &page,
        "document.getElementById('plan-torch').value = '2.15'",
    )
    .await;

    // LoRA on the same 8B model and card: rank 16, 2,048 tokens, gradient
    // checkpointing; the page and the command line answer alike.
    js(&page, "document.getElementById('plan-task').value = 'lora'; document.getElementById('plan-task').dispatchEvent(new Event('change'))").await;
    assert_eq!(
        js(
            &page,
            "document.getElementById('plan-seq').closest('label').hidden"
        )
        .await,
        Value::Bool(false)
    );
    set_input(&page, "plan-seq", "2048").await;
    js(
        &page,
        "document.getElementById('plan-checkpointing').checked = true",
    )
    .await;
    let ms = page_answers_as_the_cli(
        &page,
        "a.task === 'lora'",
        &["--task", "lora", "--seq", "2048", "--checkpointing"],
    )
    .await;
    let verdict = js(&page, "document.getElementById('plan-verdict').textContent").await;
    assert!(
        verdict.as_str().unwrap().starts_with("Fits. Llama-3.1-8B"),
        "{verdict}"
    );
    // The question in words, the layers LoRA targets among them.
    let asked = js(&page, "document.getElementById('plan-asked').textContent").await;
    assert!(
        asked
            .as_str()
            .unwrap()
            .contains(": one training step (LoRA rank 16 on q_proj and v_proj) of 1 x 2048 tokens"),
        "{asked}"
    );
    let limits = js(&page, "document.getElementById('plan-limits').textContent").await;
    assert!(
        limits
            .as_str()
            .unwrap()
            .contains("Longest sequence that fits: "),
        "{limits}"
    );
    println!("figure: will it fit: Llama-3.1-8B LoRA (rank 16, 1 x 2048 tokens, checkpointing) on an RTX 4090, with the largest batch and longest sequence searched: {ms} ms in the page");

    // The same LoRA step at 4,096 tokens without checkpointing does not
    // fit: the page offers what fits instead, cheapest first, each planned
    // as the command line plans it, and "Plan it" asks again with it.
    js(
        &page,
        "document.getElementById('plan-checkpointing').checked = false",
    )
    .await;
    set_input(&page, "plan-seq", "4096").await;
    page_answers_as_the_cli(
        &page,
        "a.task === 'lora' && a.seq === 4096",
        &["--task", "lora", "--seq", "4096"],
    )
    .await;
    let offered = js(
        &page,
        "document.getElementById('plan-fits-with').hidden ? '' : document.getElementById('plan-fits-with-list').textContent",
    )
    .await;
    assert!(
        offered
            .as_str()
            .unwrap()
            .starts_with("gradient checkpointing (--checkpointing): peak reserved "),
        "{offered}"
    );
    js(
        &page,
        "document.querySelector('#plan-fits-with-list button').click()",
    )
    .await;
    until(
        &page,
        "(() => { const a = JSON.parse(document.getElementById('plan-answer').dataset.answer); return a.checkpointing && a.seq === 4096 && a.fits; })()",
    )
    .await;
    assert_eq!(
        js(&page, "[document.getElementById('plan-checkpointing').checked, document.getElementById('plan-fits-with').hidden]").await,
        serde_json::json!([true, true])
    );
    set_input(&page, "plan-seq", "2048").await;

    // QLoRA on the same model and card: 4-bit weights, checkpointing on
    // by the task's default; the page and the command line answer alike.
    js(&page, "document.getElementById('plan-task').value = 'qlora'; document.getElementById('plan-task').dispatchEvent(new Event('change'))").await;
    assert_eq!(
        js(&page, "[document.getElementById('plan-checkpointing').checked, document.getElementById('plan-quant-type').closest('label').hidden]").await,
        serde_json::json!([true, false])
    );
    let ms = page_answers_as_the_cli(
        &page,
        "a.task === 'qlora'",
        &["--task", "qlora", "--seq", "2048"],
    )
    .await;
    let parts = js(&page, "document.getElementById('plan-parts').textContent").await;
    assert!(
        parts
            .as_str()
            .unwrap()
            .contains("dequantized 4-bit weights at the peak"),
        "{parts}"
    );
    println!("figure: will it fit: Llama-3.1-8B QLoRA (nf4, double quantization, rank 16, 1 x 2048 tokens, checkpointing) on an RTX 4090, with the largest batch and longest sequence searched: {ms} ms in the page");

    // Mixed precision on the same card: LoRA with the forward under
    // autocast and float32 weights (the "Weights in" select left to the
    // config: autocast makes them float32).
    js(&page, "document.getElementById('plan-task').value = 'lora'; document.getElementById('plan-task').dispatchEvent(new Event('change'))").await;
    js(&page, "document.getElementById('plan-amp').checked = true").await;
    page_answers_as_the_cli(
        &page,
        "a.amp === 'bfloat16'",
        &[
            "--task",
            "lora",
            "--seq",
            "2048",
            "--checkpointing",
            "--amp",
            "bfloat16",
        ],
    )
    .await;
    js(&page, "document.getElementById('plan-amp').checked = false").await;
    js(&page, "document.getElementById('plan-task').value = 'generate'; document.getElementById('plan-task').dispatchEvent(new Event('change'))").await;

    // Served by vLLM on the same card: 32,768 tokens a request; the page
    // and the command line start (or refuse) alike.
    js(&page, "document.getElementById('plan-task').value = 'serve'; document.getElementById('plan-task').dispatchEvent(new Event('change'))").await;
    assert_eq!(
        js(&page, "[document.getElementById('plan-batch').closest('label').hidden, document.getElementById('plan-utilization').closest('label').hidden]").await,
        serde_json::json!([true, false])
    );
    set_input(&page, "plan-max-model-len", "32768").await;
    let ms = page_answers_as_the_cli(
        &page,
        "a.task === 'serve'",
        &["--task", "serve", "--max-model-len", "32768"],
    )
    .await;
    let verdict = js(&page, "document.getElementById('plan-verdict').textContent").await;
    assert!(
        verdict.as_str().unwrap().starts_with("Starts. Llama-3.1-8B in bfloat16 on NVIDIA GeForce RTX 4090, vLLM 0.33.0: the KV cache holds "),
        "{verdict}"
    );
    let command = js(&page, "document.getElementById('plan-python').textContent").await;
    assert_eq!(
        command,
        "vllm serve meta-llama/Llama-3.1-8B --max-model-len 32768"
    );
    println!("figure: will it serve: Llama-3.1-8B under vLLM 0.33.0 on an RTX 4090, max_model_len 32768: {ms} ms in the page");
    js(&page, "document.getElementById('plan-task').value = 'generate'; document.getElementById('plan-task').dispatchEvent(new Event('change'))").await;

    // A config.json dropped on the page: Qwen2.5-7B's fields, on a T4.
    let config = r#"{"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#;
    js(
        &page,
        &format!(
            "(() => {{ const dt = new DataTransfer(); dt.items.add(new File([{config:?}], 'config.json', {{type: 'application/json'}})); document.getElementById('plan-config').dispatchEvent(new DragEvent('drop', {{dataTransfer: dt, bubbles: true, cancelable: true}})); }})()"
        ),
    )
    .await;
    until(&page, "document.getElementById('plan-model').value === 'config' && document.getElementById('plan-config').value.includes('qwen2')").await;
    js(&page, "document.getElementById('plan-gpu').value = 't4'").await;
    click(&page, "plan-go").await;
    let verdict = until(&page, "(() => { const t = document.getElementById('plan-verdict').textContent; return t.includes('Qwen2ForCausalLM') && t; })()").await;
    assert!(
        verdict.as_str().unwrap().starts_with("Does not fit. config.json (Qwen2ForCausalLM, 7.62B parameters) in bfloat16 on Tesla T4, PyTorch 2.15: out of memory in the prefill (the forward over the prompt)"),
        "{verdict}"
    );

    set_input(&page, "plan-config", "{\"model_type\": ").await;
    click(&page, "plan-go").await;
    let error = until(&page, "!document.getElementById('plan-error').hidden && document.getElementById('plan-error').textContent").await;
    assert!(
        error
            .as_str()
            .unwrap()
            .starts_with("That config.json is not JSON"),
        "{error}"
    );
    finish(browser, events, profile).await;
}

/// With no server the engine (the workers' wasm) computes a transformer's
/// step too: a small one's loss falls over 30 steps played in the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_transformer_learns_with_no_server() {
    if prerequisites().is_none() {
        return;
    }
    let (_server, port) = static_server();
    let (browser, events, profile) = launch("static-learns").await;
    let page = open_static(&browser, &format!("http://127.0.0.1:{port}/")).await;
    until(&page, "document.getElementById('status').textContent === 'no server answered: the engine runs in this page'").await;
    let (first, last) = small_transformer_losses(&page).await;
    assert!(last < 0.8 * first, "{first} → {last}");
    finish(browser, events, profile).await;
}
