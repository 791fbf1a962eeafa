//! axe-core (the engine behind Lighthouse's and browsers' accessibility
//! audits) over the real page in headless Chromium: the first screen, a
//! lesson, projector mode, a watcher's page, the code cell after a run and
//! the "will it fit?" page and Your snapshot (a recording open, the fix
//! searched, a what-if run, the active memory timeline, two runs compared) have no serious or critical
//! violation.

mod chromium;

use chromium::*;
use chromiumoxide::Page;
use vramlab_tests::root;

/// axe-core's serious and critical violations on the page now, one line
/// each: the rule, its help, and where.
async fn violations(page: &Page) -> Vec<String> {
    let axe = root().join("tools/node_modules/axe-core/axe.min.js");
    let source = std::fs::read_to_string(&axe)
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/setup installs axe-core)", axe.display()));
    js(page, &format!("{source};0")).await;
    let found = js(
        page,
        "axe.run(document, {resultTypes: ['violations']}).then(r => r.violations
            .filter(v => v.impact === 'serious' || v.impact === 'critical')
            .map(v => v.id + ': ' + v.help + ' at ' + v.nodes.slice(0, 3).map(n => n.target.join(' ') + ' (' + n.html.slice(0, 80) + ': ' + (n.any[0]?.message || '') + ')').join(', ')))",
    )
    .await;
    serde_json::from_value(found).unwrap()
}

async fn clean(page: &Page, view: &str) {
    let found = violations(page).await;
    assert!(found.is_empty(), "{view}:\n{}", found.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_serious_violation_in_any_view() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (browser, events, profile) = launch("axe").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    until(
        &page,
        "document.getElementById('status').textContent === 'connected'",
    )
    .await;
    clean(&page, "the first screen").await;
    open_lesson(&page, "lesson-0").await;
    press(&page, "lesson-do").await;
    clean(&page, "a lesson").await;
    click(&page, "projector").await;
    until(&page, "document.body.classList.contains('projector')").await;
    clean(&page, "projector mode").await;
    // Large type everywhere (rem sizes too), and on a phone nothing wider
    // than the screen.
    let smallest = js(&page, "Math.min(...[...document.querySelectorAll('.step-code, .lesson code, .timeline text, .big .k')]
        .filter(e => e.getClientRects().length).map(e => parseFloat(getComputedStyle(e).fontSize)))").await;
    assert!(
        smallest.as_f64().unwrap() >= 14.0,
        "projector text at {smallest} px"
    );
    viewport(&page, 390, 844).await;
    let wide = js(&page, "[document.documentElement.scrollWidth, innerWidth]").await;
    assert!(
        wide[0].as_i64() <= wide[1].as_i64(),
        "projector on a phone: {wide}"
    );
    viewport(&page, 1280, 800).await;
    // The fragmentation lesson's climax, an out of memory, read from the
    // back of the room: its banner too.
    click(&page, "lesson-all").await;
    open_lesson(&page, "lesson-4").await;
    let title = js(&page, "document.querySelector('.lesson-title').textContent").await;
    assert!(
        title.as_str().unwrap_or("").contains("300 MiB free"),
        "lesson 4 is the fragmentation lesson: {title}"
    );
    for _ in 0..20 {
        if js(&page, "!!document.getElementById('banner')").await == serde_json::Value::Bool(true) {
            break;
        }
        press(&page, "lesson-do").await;
    }
    until(&page, "!!document.getElementById('banner')").await;
    clean(&page, "projector mode at the out-of-memory banner").await;
    let link = until(&page, "document.getElementById('watch-link')?.value").await;
    let watcher = open(&browser, link.as_str().unwrap()).await;
    until(&watcher, "!!document.getElementById('allocated')").await;
    clean(&watcher, "a watcher's page").await;
    click(&page, "projector").await;
    type_code(
        &page,
        "import torch\nx = torch.zeros(1024, 1024, device='cuda')\nprint(torch.cuda.memory_allocated())\n",
    )
    .await;
    click(&page, "cell-run").await;
    until(
        &page,
        "document.getElementById('cell-step-2')?.dataset.state === 'done'",
    )
    .await;
    clean(&page, "the code cell after a run").await;
    // "Will it fit?", its own page, with an answer and with an error.
    let plan = browser.new_page("about:blank").await.unwrap();
    let url = format!("http://{addr}/plan/");
    tokio::time::timeout(WAIT, plan.goto(url))
        .await
        .unwrap()
        .unwrap();
    until(&plan, "document.body.dataset.ready === 'true'").await;
    click(&plan, "plan-go").await;
    until(&plan, "!document.getElementById('plan-answer').hidden").await;
    clean(&plan, "will it fit, answered").await;
    set_input(&plan, "plan-config", "{").await;
    click(&plan, "plan-go").await;
    until(&plan, "!document.getElementById('plan-error').hidden").await;
    clean(&plan, "will it fit, refused").await;
    // Your snapshot, its own page: the fragmentation lesson's recording
    // open, the fix searched and replayed, the what-if compared.
    let dir = std::env::temp_dir().join(format!("vramlab-axe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let recording = vramlab_tests::export_lesson(&dir, "05-fragmentation-oom");
    let snapshots = open_snapshots(&browser, &format!("http://{addr}/snapshots/")).await;
    clean(&snapshots, "your snapshot, empty").await;
    choose_file(&snapshots, "snapshot-file", &recording).await;
    until(
        &snapshots,
        "document.getElementById('snapshot-verdict')?.textContent",
    )
    .await;
    click(&snapshots, "btn-fix").await;
    until(
        &snapshots,
        "document.querySelectorAll('#fix-lines li').length > 0",
    )
    .await;
    js(
        &snapshots,
        "document.querySelector('#fix-table .fix-replay').click()",
    )
    .await;
    until(
        &snapshots,
        "document.getElementById('what-if-command').textContent",
    )
    .await;
    click(&snapshots, "btn-active").await;
    until(
        &snapshots,
        "document.querySelectorAll('#active-chart polygon').length > 0",
    )
    .await;
    click(&snapshots, "btn-diff-what-if").await;
    until(
        &snapshots,
        "document.querySelectorAll('#diff-lines li').length > 0",
    )
    .await;
    clean(&snapshots, "your snapshot: fix, what-if and compare").await;
    let _ = std::fs::remove_dir_all(&dir);
    finish(browser, events, profile).await;
    let _ = stop_tx.send(());
}
