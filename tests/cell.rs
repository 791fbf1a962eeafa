//! The code cell in headless Chromium against the real server: CPython
//! runs it in the page (Pyodide, with vramlab's shims). Each piece of
//! popular advice, run in the cell, ends with the numbers `vramlab python`
//! gives for the same file, and its claims judged; statements step one by
//! one, each with what it printed; a line Python cannot run stops the run
//! there with Python's traceback; a button writes its line into the cell,
//! and the cell runs it again; a lesson opens as Python and ends with the
//! lesson's numbers.

mod chromium;

use chromium::*;
use chromiumoxide::Page;
use vramlab_shared::advice::ADVICE;
use vramlab_tests::{python_run, python_snippets};

async fn page_numbers(page: &Page) -> [u64; 2] {
    let v = js(
        page,
        "['allocated', 'reserved'].map(id => Number(document.getElementById(id).dataset.bytes))",
    )
    .await;
    [0, 1].map(|i| v[i].as_u64().unwrap())
}

/// Every statement has run (or one failed), and every claim is judged.
const SETTLED: &str = "(() => { const s = [...document.querySelectorAll('#cell-steps li')];
    return s.length > 0 && s.every(li => li.dataset.state === 'done' || li.dataset.state === 'failed')
        && document.querySelectorAll('#verdicts li.open').length === 0; })()";

/// Waits for [`SETTLED`]; if it never comes, says where the cell stands.
async fn settled(page: &Page, what: &str) {
    for _ in 0..600 {
        if js(page, SETTLED).await == serde_json::json!(true) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let cell = js(page, "[...document.querySelectorAll('#cell-steps li, #verdicts li, #cell-busy, #cell-error')].map(e => (e.dataset.state || e.className) + ': ' + e.textContent).join('\\n')").await;
    panic!(
        "{what}: the cell did not settle:\n{}",
        cell.as_str().unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_popular_advice_runs_in_the_cell_with_the_numbers_of_vramlab_python() {
    if prerequisites().is_none() {
        return;
    }
    let (_stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("cell").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    until(
        &page,
        "document.getElementById('status').textContent === 'connected'",
    )
    .await;
    for (i, advice) in ADVICE.iter().enumerate() {
        js(
            &page,
            &format!("(() => {{ const s = document.getElementById('advice'); s.value = '{i}'; s.dispatchEvent(new Event('change', {{bubbles: true}})); }})()"),
        )
        .await;
        // The code is fetched when picked (`advice/ID.py`).
        let source = serde_json::to_string(advice.source()).unwrap();
        until(
            &page,
            &format!("document.getElementById('cell-source').value === {source}"),
        )
        .await;
        click(&page, "cell-run").await;
        settled(&page, advice.id).await;
        let failed = js(
            &page,
            "[...document.querySelectorAll('#cell-steps li.failed')].map(li => li.textContent)",
        )
        .await;
        assert_eq!(failed, serde_json::json!([]), "{}", advice.id);
        let (printed, numbers) = python_run(advice.source());
        assert_eq!(
            page_numbers(&page).await,
            [numbers[0], numbers[1]],
            "{}",
            advice.id
        );
        let out = js(
            &page,
            "[...document.querySelectorAll('#cell-steps pre.out')].map(p => p.textContent).join('')",
        )
        .await;
        assert_eq!(out.as_str(), Some(printed.as_str()), "{}", advice.id);
        let judged = js(
            &page,
            "document.querySelectorAll('#verdicts li.held, #verdicts li.failed').length",
        )
        .await;
        assert_eq!(
            judged.as_u64(),
            Some(advice.claims.len() as u64),
            "{}",
            advice.id
        );
    }
    // Keras's clear_session() with the model still named frees nothing.
    let keras = ADVICE
        .iter()
        .position(|a| a.id == "keras-clear-session")
        .unwrap();
    js(&page, &format!("(() => {{ const s = document.getElementById('advice'); s.value = '{keras}'; s.dispatchEvent(new Event('change', {{bubbles: true}})); }})()")).await;
    // The advice's code is fetched: run it once it is in the cell (the
    // code before it is there until then).
    let source = serde_json::to_string(ADVICE[keras].source()).unwrap();
    until(
        &page,
        &format!("document.getElementById('cell-source').value === {source}"),
    )
    .await;
    click(&page, "cell-run").await;
    settled(&page, "keras-clear-session again").await;
    let first = js(&page, "document.getElementById('claim-0').className").await;
    assert_eq!(first, "failed");
    browser.close().await.ok();
    events.abort();
    std::fs::remove_dir_all(profile).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_step_one_by_one_print_and_a_python_error_stops_the_run() {
    if prerequisites().is_none() {
        return;
    }
    let (_stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("cell-steps").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    until(
        &page,
        "document.getElementById('status').textContent === 'connected'",
    )
    .await;
    let cold = run_all_to_numbers(&page).await;
    let warm = run_all_to_numbers(&page).await;
    println!("figure: server: ▶ Run all to the first statement's numbers: {cold:.0} ms cold (Python loading), {warm:.0} ms warm");
    let loaded = python_loaded(&page).await;
    println!("figure: server: {loaded}");
    assert!(loaded.starts_with("Python 3."), "{loaded}");
    type_code(
        &page,
        "import torch\nx = torch.randn(1024, 1024, device=\"cuda\")\ny = x\ndel x\nprint(torch.cuda.memory_allocated())\nz = torch.fft.fft(y)\ndel y\n",
    )
    .await;
    for (step, allocated) in [
        (0, 0),
        (1, 4 << 20),
        (2, 4 << 20),
        (3, 4 << 20),
        (4, 4 << 20),
    ] {
        click(&page, "cell-step").await;
        until(
            &page,
            &format!("document.getElementById('cell-step-{step}').dataset.state === 'done'"),
        )
        .await;
        until(
            &page,
            &format!("Number(document.getElementById('allocated').dataset.bytes) === {allocated}"),
        )
        .await;
    }
    let printed = js(
        &page,
        "document.querySelector('#cell-step-4 pre.out').textContent",
    )
    .await;
    assert_eq!(printed.as_str(), Some("4194304\n"));
    click(&page, "cell-step").await;
    until(
        &page,
        "document.getElementById('cell-step-5').dataset.state === 'failed'",
    )
    .await;
    let why = js(
        &page,
        "document.querySelector('#cell-step-5 pre.why').textContent",
    )
    .await;
    let why = why.as_str().unwrap();
    assert!(
        why.starts_with("Traceback (most recent call last):"),
        "{why}"
    );
    assert!(why.contains("line 6, in <module>"), "{why}");
    assert!(
        why.contains("AttributeError: module 'torch' has no attribute 'fft'"),
        "{why}"
    );
    // The statement after the failed one never ran: `y` still holds the tensor.
    assert_eq!(page_numbers(&page).await[0], 4 << 20);
    assert_eq!(
        js(
            &page,
            "document.getElementById('cell-step-6').dataset.state"
        )
        .await,
        "waiting"
    );
    // After ▶ Run all the explanation is the last statement's, heading and
    // words alike; a statement clicked explains itself, a loop as a whole.
    type_code(
        &page,
        "import torch\nx = torch.randn(1024, 1024, device=\"cuda\")\nfor i in range(3):\n    y = torch.empty(1024, 1024, device=\"cuda\")\ndel x, y\ntorch.cuda.empty_cache()\n",
    )
    .await;
    click(&page, "cell-run").await;
    settled(&page, "explained run").await;
    let explained = "[...document.querySelectorAll('#explanation p')].map(p => p.textContent)";
    until(
        &page,
        "document.getElementById('cell-step-4').classList.contains('selected')",
    )
    .await;
    let last = js(&page, explained).await;
    assert!(
        last[0]
            .as_str()
            .unwrap()
            .starts_with("Allocated did not move; reserved fell by 20.00 MiB"),
        "{last}"
    );
    assert!(last[1].as_str().unwrap().contains("empty_cache"), "{last}");
    js(
        &page,
        "document.querySelector('section.cell').scrollIntoView(); scrollBy(0, -230)",
    )
    .await;
    shot_screen(&page, "cell.png").await;
    js(
        &page,
        "document.querySelector('#cell-step-1 button.stmt').click()",
    )
    .await;
    let first = js(&page, explained).await;
    assert!(
        first[0]
            .as_str()
            .unwrap()
            .starts_with("Allocated rose by 4.00 MiB"),
        "{first}"
    );
    js(
        &page,
        "document.querySelector('#cell-step-2 button.stmt').click()",
    )
    .await;
    let looped = js(&page, explained).await;
    assert!(
        looped[0]
            .as_str()
            .unwrap()
            .starts_with("Allocated rose by 4.00 MiB"),
        "{looped}"
    );
    assert!(
        looped[1]
            .as_str()
            .unwrap()
            .starts_with("This statement ran 5 commands (alloc ×3, del ×2)."),
        "{looped}"
    );
    // A loop over the server: its lines go in batches, each message one of
    // the session's commands a second.
    type_code(
        &page,
        "import torch\nfor i in range(300):\n    x = torch.empty(1024, device='cuda')\n",
    )
    .await;
    let ms = js(
        &page,
        "new Promise(done => { const t0 = performance.now(); document.getElementById('cell-run').click();
            const check = () => { const li = document.getElementById('cell-step-1');
                if (li && li.dataset.state === 'done') done(performance.now() - t0);
                else if (li && li.dataset.state === 'failed') done(-1);
                else setTimeout(check, 5); };
            check(); })",
    )
    .await;
    let ms = ms.as_f64().unwrap();
    assert!(
        ms > 0.0,
        "the loop failed: {}",
        js(&page, "document.getElementById('cell-steps').textContent").await
    );
    println!("figure: server: a loop of 300 iterations (599 commands) to its numbers: {ms:.0} ms");
    // A button's line joins the cell.
    click(&page, "btn-gc").await;
    until(
        &page,
        "document.getElementById('cell-source').value.endsWith('gc.collect()\\n')",
    )
    .await;
    browser.close().await.ok();
    events.abort();
    std::fs::remove_dir_all(profile).ok();
}

/// The corpus of `tests/python/` (code as people write it: loops, classes,
/// functions, prints, exceptions, JAX and Keras), each snippet run in the
/// cell: none refused, each prints what its `.out` says and ends with the
/// numbers `vramlab python` ends with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_snippet_runs_in_the_cell_as_vramlab_python_runs_it() {
    if prerequisites().is_none() {
        return;
    }
    let (_stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("cell-corpus").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    until(
        &page,
        "document.getElementById('status').textContent === 'connected'",
    )
    .await;
    let files = python_snippets();
    assert!(files.len() >= 30, "{} snippets", files.len());
    for file in &files {
        let what = file.file_name().unwrap().to_string_lossy().into_owned();
        let source = std::fs::read_to_string(file).unwrap();
        let expected = std::fs::read_to_string(file.with_extension("out")).unwrap();
        type_code(&page, &source).await;
        click(&page, "cell-run").await;
        settled(&page, &what).await;
        let failed = js(
            &page,
            "[...document.querySelectorAll('#cell-steps li.failed')].map(li => li.textContent)",
        )
        .await;
        assert_eq!(failed, serde_json::json!([]), "{what}");
        let out = js(
            &page,
            "[...document.querySelectorAll('#cell-steps pre.out')].map(p => p.textContent).join('')",
        )
        .await;
        assert_eq!(out.as_str(), Some(expected.as_str()), "{what}");
        let (_, numbers) = python_run(&source);
        assert_eq!(
            page_numbers(&page).await,
            [numbers[0], numbers[1]],
            "{what}"
        );
    }
    browser.close().await.ok();
    events.abort();
    std::fs::remove_dir_all(profile).ok();
}

/// The numbers `vramlab run` ends a lesson's first `steps` lines with.
fn lesson_numbers(lesson: &str, steps: std::ops::Range<usize>) -> [u64; 2] {
    let text = std::fs::read_to_string(
        vramlab_tests::root().join(format!("tests/lessons/{lesson}.jsonl")),
    )
    .unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let (records, _, _) = vramlab_tests::run_stdin(&lines[..steps.end].join("\n"), &[]);
    let stats = &records.last().unwrap()["stats"];
    ["allocated_bytes", "reserved_bytes"].map(|k| stats[k].as_u64().unwrap())
}

/// A lesson opened as Python: each kernel's steps in the cell, the session
/// restarted with that kernel's settings (a 1 GiB GPU for the
/// fragmentation lesson; vramlab's GPT for the long-context one), ▶ Run
/// all ends with the lesson's own numbers. Lines the buttons write run
/// again too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lesson_opens_as_python_and_ends_with_the_lessons_numbers() {
    if prerequisites().is_none() {
        return;
    }
    let (_stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("lesson-python").await;
    for (lesson, kernel, steps) in [
        ("05-fragmentation-oom", 0, 0..16),
        ("16-long-context-attention", 1, 6..13),
    ] {
        let page = open(&browser, &format!("http://{addr}/?lesson={lesson}")).await;
        until(
            &page,
            "document.getElementById('status').textContent === 'connected'",
        )
        .await;
        let button = format!("lesson-python-{kernel}");
        until(&page, &format!("!!document.getElementById('{button}')")).await;
        click(&page, &button).await;
        until(
            &page,
            "document.getElementById('cell-source').value.startsWith('#')",
        )
        .await;
        click(&page, "cell-run").await;
        settled(&page, lesson).await;
        let failed = js(
            &page,
            "[...document.querySelectorAll('#cell-steps li.failed')].map(li => li.textContent)",
        )
        .await;
        assert_eq!(failed, serde_json::json!([]), "{lesson}");
        assert_eq!(
            page_numbers(&page).await,
            lesson_numbers(lesson, steps),
            "{lesson}"
        );
        page.close().await.ok();
    }
    // The buttons' lines, imports first, run again.
    let page = open(&browser, &format!("http://{addr}/")).await;
    until(
        &page,
        "document.getElementById('status').textContent === 'connected'",
    )
    .await;
    for id in ["btn-alloc", "btn-hold", "btn-del", "btn-gc"] {
        press(&page, id).await;
    }
    let source = js(&page, "document.getElementById('cell-source').value").await;
    assert!(
        source.as_str().unwrap().starts_with("import torch\n"),
        "{source}"
    );
    let before = page_numbers(&page).await;
    click(&page, "cell-run").await;
    settled(&page, "the buttons' lines").await;
    let failed = js(
        &page,
        "[...document.querySelectorAll('#cell-steps li.failed')].map(li => li.textContent)",
    )
    .await;
    assert_eq!(failed, serde_json::json!([]), "{source}");
    assert_eq!(page_numbers(&page).await, before, "{source}");
    browser.close().await.ok();
    events.abort();
    std::fs::remove_dir_all(profile).ok();
}
