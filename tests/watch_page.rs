//! A team demo, in headless Chromium against the real server: a watcher's
//! page mirrors the presenter's lesson step and its outcome, the
//! explanation, the code cell and its run statement by statement, the
//! Python pane, ▶ play's progress and the controls' values, live, and a
//! watcher who joins late gets them at once.

mod chromium;

use chromium::*;
use chromiumoxide::Page;

/// What both pages must agree on.
const SEEN: &str = "JSON.stringify([
    document.querySelector('.progress-line span')?.textContent,
    document.getElementById('lesson-outcome')?.textContent,
    document.getElementById('explanation').textContent,
    document.getElementById('cell-source').value,
    document.getElementById('code').textContent,
    document.getElementById('batch').value,
    document.getElementById('amp').value,
    [...document.querySelectorAll('#cell-steps li')].map(li => li.dataset.state + ': ' + li.textContent),
    document.querySelector('.loss')?.hidden ? '' : document.querySelector('.loss')?.textContent,
])";

async fn seen(page: &Page) -> String {
    js(page, SEEN).await.as_str().unwrap().to_string()
}

/// Waits until the watcher shows what the presenter shows (both read
/// again each time: the presenter's page may still be settling).
async fn mirrors(presenter: &Page, watcher: &Page) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (want, have) = (seen(presenter).await, seen(watcher).await);
        if want == have {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the watcher shows {have}\nwhere the presenter shows {want}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_mirror_the_lesson_the_code_and_the_controls() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("watch").await;
    let presenter = open(&browser, &format!("http://{addr}/")).await;
    let link = until(&presenter, "document.getElementById('watch-link')?.value").await;
    let watcher = open(&browser, link.as_str().unwrap()).await;
    until(&presenter, "!!document.getElementById('watchers')").await;
    // A lesson, two steps in.
    open_lesson(&presenter, "lesson-0").await;
    press(&presenter, "lesson-do").await;
    press(&presenter, "lesson-do").await;
    // A control edited, a box ticked, code typed.
    set_input(&presenter, "batch", "2048").await;
    js(&presenter, "(() => { const b = document.getElementById('amp'); b.value = 'bfloat16'; b.dispatchEvent(new Event('change', {bubbles: true})); })()").await;
    js(&presenter, "(() => { const t = document.getElementById('cell-source'); t.value = 'x = torch.zeros(1024, device=\"cuda\")'; t.dispatchEvent(new Event('input', {bubbles: true})); })()").await;
    mirrors(&presenter, &watcher).await;
    let shown = seen(&watcher).await;
    assert!(
        shown.contains("step 3 of 8")
            && shown.contains("2048")
            && shown.contains("torch.zeros")
            && shown.contains("torch.empty(256 * 2**20"),
        "{shown}"
    );
    // A watcher who joins now sees the same at once.
    let late = open(&browser, link.as_str().unwrap()).await;
    mirrors(&presenter, &late).await;
    // The next step reaches both.
    press(&presenter, "lesson-do").await;
    mirrors(&presenter, &watcher).await;
    assert!(seen(&watcher).await.contains("step 4 of 8"));
    // The cell's run, statement by statement with what each printed.
    type_code(
        &presenter,
        "import torch\nx = torch.zeros(1024, 1024, device='cuda')\nprint('held', torch.cuda.memory_allocated())\n",
    )
    .await;
    click(&presenter, "cell-run").await;
    until(
        &presenter,
        "document.getElementById('cell-step-2')?.dataset.state === 'done'",
    )
    .await;
    mirrors(&presenter, &watcher).await;
    let shown = seen(&watcher).await;
    assert!(
        shown.contains("done: ✓2x = torch.zeros(1024, 1024, device='cuda')allocated 4.00 MiB"),
        "{shown}"
    );
    assert!(
        shown.contains("done: ✓3print('held', torch.cuda.memory_allocated())held 4194304"),
        "{shown}"
    );
    // ▶ play's progress.
    click(&presenter, "btn-build").await;
    set_input(&presenter, "steps", "3").await;
    click(&presenter, "btn-play").await;
    until(
        &presenter,
        "document.querySelector('.loss')?.textContent.includes('3 of 3')",
    )
    .await;
    mirrors(&presenter, &watcher).await;
    assert!(seen(&watcher).await.contains("3 of 3"));
    for page in [presenter, watcher, late] {
        page.close().await.unwrap();
    }
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}
