//! The code cell in headless Chromium against the real server: each piece
//! of popular advice, run in the cell, ends with the numbers `vramlab run`
//! gives for the same commands, and its claims judged; a button writes its
//! line into the cell; a line outside the cell's Python stops the run there
//! with the reason.

mod chromium;

use chromium::*;
use chromiumoxide::Page;
use vramlab_shared::advice::ADVICE;
use vramlab_shared::cell;
use vramlab_shared::command::{Command, RestartSettings};
use vramlab_tests::run_stdin;

/// The numbers after the last command, as `vramlab run` prints them.
fn cli_numbers(commands: &[Command]) -> [u64; 3] {
    let input: String = commands
        .iter()
        .map(|c| serde_json::to_string(c).unwrap() + "\n")
        .collect();
    let (lines, _, _) = run_stdin(&input, &[]);
    let last = lines.last().expect("a line per command");
    ["allocated_bytes", "reserved_bytes", "device_used_bytes"]
        .map(|k| last["stats"][k].as_u64().unwrap())
}

async fn page_numbers(page: &Page) -> [u64; 3] {
    let v = js(
        page,
        "['allocated', 'reserved', 'device-used'].map(id => Number(document.getElementById(id).dataset.bytes))",
    )
    .await;
    [0, 1, 2].map(|i| v[i].as_u64().unwrap())
}

/// Every statement has run (or one failed), and every claim is judged.
const SETTLED: &str = "(() => { const s = [...document.querySelectorAll('#cell-steps li')];
    return s.length > 0 && s.every(li => li.dataset.state === 'done' || li.dataset.state === 'failed')
        && document.querySelectorAll('#verdicts li.open').length === 0; })()";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_popular_advice_runs_in_the_cell_with_the_numbers_of_vramlab_run() {
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
        until(&page, SETTLED).await;
        let failed = js(
            &page,
            "[...document.querySelectorAll('#cell-steps li.failed')].map(li => li.textContent)",
        )
        .await;
        assert_eq!(failed, serde_json::json!([]), "{}", advice.id);
        let mut commands = vec![Command::Restart(RestartSettings {
            framework: Some(advice.framework),
            ..Default::default()
        })];
        for step in cell::steps(advice.source(), advice.framework).unwrap() {
            commands.extend(step.commands.unwrap());
        }
        assert_eq!(
            page_numbers(&page).await,
            cli_numbers(&commands),
            "{}",
            advice.id
        );
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
    until(
        &page,
        "document.getElementById('cell-source').value.length > 0",
    )
    .await;
    click(&page, "cell-run").await;
    until(&page, SETTLED).await;
    let first = js(&page, "document.getElementById('claim-0').className").await;
    assert_eq!(first, "failed");
    browser.close().await.ok();
    events.abort();
    std::fs::remove_dir_all(profile).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_step_one_by_one_buttons_write_theirs_and_a_bad_line_stops_the_run() {
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
    let code = "import torch\\nx = torch.randn(1024, 1024, device=\\\"cuda\\\")\\ny = x\\ndel x\\nz = torch.fft.fft(y)\\ndel y";
    js(&page, &format!("(() => {{ const e = document.getElementById('cell-source'); e.value = \"{code}\"; e.dispatchEvent(new Event('input', {{bubbles: true}})); }})()")).await;
    for (step, allocated) in [(0, 0), (1, 4 << 20), (2, 4 << 20), (3, 4 << 20)] {
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
    click(&page, "cell-step").await;
    until(
        &page,
        "document.getElementById('cell-step-4').dataset.state === 'failed'",
    )
    .await;
    let why = js(&page, "document.getElementById('cell-refused').textContent").await;
    assert!(
        why.as_str()
            .unwrap()
            .contains("line 5: `torch.fft.fft(...)` is not in the cell's Python"),
        "{why}"
    );
    // The statement after the bad one never ran: `y` still holds the tensor.
    assert_eq!(page_numbers(&page).await[0], 4 << 20);
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
