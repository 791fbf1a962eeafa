//! A PyTorch memory snapshot opened in "Your snapshot" (snapshots/), in
//! headless Chromium: the file chosen through the real file input, replayed exactly in the page
//! with the same numbers the engine gives natively, a what-if beside it,
//! the segment map and stack frames at an event, a broken file refused,
//! and the playground's session saved, and replayed in a new tab of the
//! snapshot page. The in-page time to
//! read and replay a ~40,000-event file is printed as a figure.

mod chromium;

use chromium::*;
use chromiumoxide::cdp::browser_protocol::target::TargetId;
use chromiumoxide::{Browser, Page};
use vramlab_shared::framework::RestartSettings;
use vramlab_shared::torch_snapshot::active::active_timeline;
use vramlab_shared::torch_snapshot::diff::{diff, diff_lines};
use vramlab_shared::torch_snapshot::fix::{fix_lines, search_fix};
use vramlab_shared::torch_snapshot::replay::{replay_exact, replay_what_if, segments_at};
use vramlab_shared::torch_snapshot::what_if::describe_recorded;
use vramlab_shared::torch_snapshot::{self, MemorySnapshot};
use vramlab_shared::units::format_size;
use vramlab_tests::{export_lesson, root, session_snapshot, training_snapshot, two_gpus};

/// The tab a click opened: the page that was not there before.
async fn new_tab(browser: &Browser, before: &[TargetId]) -> Page {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let pages = browser.pages().await.unwrap();
        if let Some(page) = pages.into_iter().find(|p| !before.contains(p.target_id())) {
            return page;
        }
        assert!(std::time::Instant::now() < deadline, "no new tab opened");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn text(page: &Page, id: &str) -> String {
    js(
        page,
        &format!("document.getElementById('{id}').textContent"),
    )
    .await
    .as_str()
    .unwrap_or_default()
    .to_string()
}

/// The segment and block counts in a segment map's heading.
async fn map_counts(page: &Page) -> (usize, usize) {
    let heading = text(page, "replay-segments-heading").await;
    let number = |word: &str| -> usize {
        let before = heading.split(word).next().unwrap().trim_end();
        before.rsplit(' ').next().unwrap().parse().unwrap()
    };
    (number(" segments"), number(" blocks"))
}

fn counts(s: &[vramlab_shared::snapshot::SegmentSnapshot]) -> (usize, usize) {
    (s.len(), s.iter().map(|g| g.blocks.len()).sum())
}

/// The table's cell for a row and column (1: as recorded, 2: what if).
async fn cell(page: &Page, row: usize, column: usize) -> String {
    js(page, &format!("document.querySelectorAll('#what-if-table tbody tr')[{row}].children[{column}].textContent"))
        .await
        .as_str()
        .unwrap()
        .to_string()
}

/// Where the page looks first: where reserved peaked (no OOM recorded).
fn peak_event(s: &MemorySnapshot) -> usize {
    let run = replay_exact(s, 0).unwrap();
    let peak = run.peak_reserved_bytes;
    run.timeline
        .iter()
        .find(|p| p.reserved_bytes == peak)
        .unwrap()
        .event
}

/// The fragmentation row's cell for a run.
fn fragmentation(run: &vramlab_shared::torch_snapshot::replay::ReplayRun) -> String {
    let f = &run.fragmentation;
    format!("{} {}", format_size(f.bytes), f.moment())
}

/// The bytes a button offers as a download.
async fn saved_by(page: &Page, button: &str) -> Vec<u8> {
    js(page, "(() => { window.saved = null; if (!window.made) { window.made = URL.createObjectURL; URL.createObjectURL = b => { window.saved = b; return window.made(b); }; } })()").await;
    click(page, button).await;
    until(page, "window.saved !== null").await;
    let saved = js(
        page,
        "(async () => Array.from(new Uint8Array(await window.saved.arrayBuffer())))()",
    )
    .await;
    serde_json::from_value(saved).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_opens_in_the_page_and_a_what_if_runs_beside_it() {
    if prerequisites().is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("vramlab-snapshot-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("training.pickle");
    let bytes = training_snapshot(48, 34);
    std::fs::write(&file, &bytes).unwrap();
    let native = torch_snapshot::read(&bytes).unwrap();
    let events = native.device_traces[0].len();
    // What the page downloads (the .gz copies scripts/build-web writes).
    let page_bytes: u64 = std::fs::read_dir(root().join("dist/snapshots"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gz"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    println!("figure: Your snapshot's download (gzip): {page_bytes} bytes");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (browser, handler, profile) = launch("snapshot").await;
    // The playground links to the page.
    let play = open(&browser, &format!("http://{addr}/")).await;
    let href = js(&play, "document.getElementById('snapshot-page').href").await;
    assert_eq!(href.as_str().unwrap(), format!("http://{addr}/snapshots/"));
    let page = open_snapshots(&browser, &format!("http://{addr}/snapshots/")).await;

    // Open: read by the page's reader worker a chunk at a time in two
    // passes (the page says how far), replayed exactly, with the engine's
    // own numbers.
    js(&page, "(() => { window.said = []; const p = document.getElementById('snapshot-progress'); new MutationObserver(() => { if (p.textContent) window.said.push(p.textContent); }).observe(p, {childList: true, subtree: true, characterData: true}); })()").await;
    choose_file(&page, "snapshot-file", &file).await;
    let verdict = until(
        &page,
        "document.getElementById('snapshot-verdict').textContent",
    )
    .await;
    assert!(
        verdict.as_str().unwrap().starts_with("Replayed exactly"),
        "{verdict}"
    );
    let summary = text(&page, "snapshot-summary").await;
    assert!(summary.contains(&format!("{events} events")), "{summary}");
    let said: Vec<String> = serde_json::from_value(js(&page, "window.said").await).unwrap();
    let mb = |b: usize| format!("{:.0}", b as f64 / 1e6);
    let total = mb(bytes.len());
    for expected in [
        format!(
            "Reading training.pickle, first pass: {} of {total} MB",
            mb(8 << 20)
        ),
        format!("Reading training.pickle: {} of {total} MB", mb(8 << 20)),
        format!("Replaying training.pickle ({total} MB)…"),
    ] {
        assert!(said.contains(&expected), "{expected}: {said:?}");
    }
    assert_eq!(text(&page, "snapshot-progress").await, "");
    let reader = js(
        &page,
        "performance.getEntriesByType('resource').some(e => /\\/snapshots\\/reader-[0-9a-f]+\\.js$/.test(e.name))",
    )
    .await;
    assert_eq!(reader, serde_json::json!(true), "the reader's worker ran");
    let ms = text(&page, "snapshot-ms").await;
    println!(
        "figure: a {:.1} MB snapshot with {events} events read and replayed in the page in {ms} ms",
        bytes.len() as f64 / 1e6
    );
    let recorded = replay_exact(&native, 0).unwrap();
    assert_eq!(
        cell(&page, 0, 1).await,
        format_size(recorded.peak_reserved_bytes)
    );
    assert_eq!(cell(&page, 2, 1).await, fragmentation(&recorded));
    assert!(recorded
        .fragmentation
        .moment()
        .starts_with("at the peak allocated"));
    let at = peak_event(&native);
    until(
        &page,
        "document.getElementById('replay-segments-heading').textContent.includes('blocks')",
    )
    .await;
    assert_eq!(
        map_counts(&page).await,
        counts(&segments_at(&native, 0, None, at).unwrap())
    );
    shot(&page, "snapshot-recorded.png").await;

    // What if: expandable segments on a T4, beside the recording. The
    // form starts at the recorded settings, and says them.
    let recorded_words = js(
        &page,
        "document.getElementById('what-if-recorded').textContent",
    )
    .await;
    assert_eq!(
        recorded_words,
        serde_json::json!(describe_recorded(&native))
    );
    let ticked = "document.querySelector('.what-if input[type=checkbox]').checked";
    assert_eq!(
        js(&page, ticked).await,
        serde_json::json!(false),
        "as recorded"
    );
    js(
        &page,
        "document.querySelector('.what-if input[type=checkbox]').click()",
    )
    .await;
    js(&page, "(() => { const s = document.getElementById('what-if-gpu'); s.value = 't4'; s.dispatchEvent(new Event('change', {bubbles: true})); })()").await;
    click(&page, "btn-what-if").await;
    let command = until(
        &page,
        "document.getElementById('what-if-command').textContent",
    )
    .await;
    assert_eq!(
        command.as_str().unwrap(),
        "vramlab replay training.pickle --what-if 'gpu=t4,expandable_segments=true'"
    );
    let what_if = RestartSettings {
        gpu: vramlab_shared::gpu::GpuModel::from_id("t4"),
        expandable_segments: Some(true),
        ..Default::default()
    };
    let native_what_if = replay_what_if(&native, 0, &what_if).unwrap();
    assert_eq!(
        cell(&page, 0, 2).await,
        format_size(native_what_if.peak_reserved_bytes)
    );
    assert_ne!(
        native_what_if.peak_reserved_bytes,
        recorded.peak_reserved_bytes
    );
    let dashed = js(&page, "document.querySelectorAll('#replay-chart polyline')[0].getAttribute('points').split(' ').length").await;
    assert!(dashed.as_u64().unwrap() > 100, "{dashed}");
    // The what-if's segments at the same event: expandable ranges.
    until(
        &page,
        "document.getElementById('segments-of').value === 'what-if'",
    )
    .await;
    let expected = counts(&segments_at(&native, 0, Some(&what_if), at).unwrap());
    until(&page, &format!("document.getElementById('replay-segments-heading').textContent.includes(' {} segments')", expected.0)).await;
    assert_eq!(map_counts(&page).await, expected);
    js(
        &page,
        "document.getElementById('your-snapshot').scrollIntoView({block: 'start'})",
    )
    .await;
    shot_screen(&page, "snapshot.png").await;

    // A GPU of 64 MiB: where the same run runs out of memory.
    js(&page, "(() => { const s = document.getElementById('what-if-gpu'); s.value = ''; s.dispatchEvent(new Event('change', {bubbles: true})); })()").await;
    set_input(&page, "what-if-mib", "64").await;
    click(&page, "btn-what-if").await;
    until(&page, "document.getElementById('what-if-command').textContent.includes('device_total_bytes=67108864')").await;
    let small = RestartSettings {
        device_total_bytes: Some(64 << 20),
        expandable_segments: Some(true),
        ..Default::default()
    };
    let native_small = replay_what_if(&native, 0, &small).unwrap();
    let first_oom = native_small.ooms.first().expect("64 MiB is too small");
    assert_eq!(
        cell(&page, 3, 2).await,
        format!(
            "{} (first at event {})",
            native_small.ooms.len(),
            first_oom.event
        )
    );
    let marks = js(
        &page,
        "document.querySelectorAll('#replay-chart .what-if-oom').length",
    )
    .await;
    assert_eq!(marks.as_u64().unwrap() as usize, native_small.ooms.len());

    // The what-if saved as a snapshot: its own out-of-memory errors.
    let saved = torch_snapshot::read(&saved_by(&page, "btn-export-what-if").await).unwrap();
    assert!(
        saved
            .allocator_settings
            .as_ref()
            .unwrap()
            .expandable_segments
    );
    let ooms = saved.device_traces[0]
        .iter()
        .filter(|e| e.action == torch_snapshot::Action::Oom)
        .count();
    assert_eq!(ooms, native_small.ooms.len());

    // An event's stack: the row clicked, its frame listed.
    js(
        &page,
        "document.querySelector('#trace-events tbody tr').click()",
    )
    .await;
    let first = at.saturating_sub(12);
    until(
        &page,
        &format!(
            "document.querySelector('#trace-events tr.selected td').textContent === '{first}'"
        ),
    )
    .await;
    let frames = js(&page, "document.getElementById('trace-frames').textContent").await;
    let expected: String = native.device_traces[0]
        .frames(first)
        .iter()
        .map(|f| f.label())
        .collect();
    assert_eq!(frames.as_str().unwrap(), expected);

    // A file that is not a snapshot: said, and what was open stays.
    let broken = dir.join("notes.pickle");
    std::fs::write(&broken, b"\x80\x04not really").unwrap();
    choose_file(&page, "snapshot-file", &broken).await;
    let error = until(
        &page,
        "document.getElementById('snapshot-error').textContent",
    )
    .await;
    assert!(error.as_str().unwrap().contains("pickle"), "{error}");
    assert!(text(&page, "snapshot-summary")
        .await
        .contains("training.pickle"));

    // A pickle that nests one value 150,000 deep (150 KB): refused (its
    // tuples would take more than twice the file), and the page goes on
    // (what it built was dropped without recursion).
    let mut nested = b"\x80\x02N".to_vec();
    nested.extend(std::iter::repeat_n(0x85u8, 150_000));
    nested.push(b'.');
    let deep = dir.join("nested.pickle");
    std::fs::write(&deep, &nested).unwrap();
    choose_file(&page, "snapshot-file", &deep).await;
    let error = until(
        &page,
        "document.getElementById('snapshot-error').textContent.includes('twice its size') && document.getElementById('snapshot-error').textContent",
    )
    .await;
    assert!(
        error.as_str().unwrap().contains("twice its size"),
        "{error}"
    );
    assert!(text(&page, "snapshot-summary")
        .await
        .contains("training.pickle"));

    // A recording of CUDA graphs' private pools (recorded on an H100):
    // replayed exactly in the page, with the command line's numbers.
    let graph = root().join("tests/golden/snapshot-graph.pickle");
    let graph_native = torch_snapshot::read(&std::fs::read(&graph).unwrap()).unwrap();
    let graph_run = replay_exact(&graph_native, 0).unwrap();
    assert_eq!(graph_run.exact, Some(true));
    choose_file(&page, "snapshot-file", &graph).await;
    until(
        &page,
        "document.getElementById('snapshot-summary').textContent.includes('snapshot-graph.pickle')",
    )
    .await;
    assert!(
        text(&page, "snapshot-verdict")
            .await
            .starts_with("Replayed exactly"),
        "{}",
        text(&page, "snapshot-verdict").await
    );
    assert_eq!(
        cell(&page, 0, 1).await,
        format_size(graph_run.peak_reserved_bytes)
    );
    assert_eq!(
        cell(&page, 1, 1).await,
        format_size(graph_run.peak_allocated_bytes)
    );
    choose_file(&page, "snapshot-file", &file).await;
    until(
        &page,
        "document.getElementById('snapshot-summary').textContent.includes('training.pickle')",
    )
    .await;

    // A recording of two GPUs opens on the one that ran out of memory;
    // the picker shows the other.
    let two = dir.join("two-gpus.pickle");
    std::fs::write(&two, torch_snapshot::write_pickle(&two_gpus(&native))).unwrap();
    choose_file(&page, "snapshot-file", &two).await;
    until(
        &page,
        "document.getElementById('snapshot-summary').textContent.includes('two-gpus.pickle')",
    )
    .await;
    let picked = js(&page, "(() => { const s = document.getElementById('snapshot-device'); return [s.value, s.selectedOptions[0].textContent]; })()").await;
    assert_eq!(
        picked,
        serde_json::json!([
            "1",
            format!("cuda:1 · {} events · 1 out of memory", events + 1)
        ])
    );
    assert_eq!(cell(&page, 3, 1).await, "none here; 1 in the recording");
    assert_eq!(
        cell(&page, 2, 1).await,
        format!(
            "{} at the out-of-memory (event {events})",
            format_size(
                recorded.timeline[events - 1].reserved_bytes
                    - recorded.timeline[events - 1].allocated_bytes
            )
        )
    );
    js(&page, "(() => { const s = document.getElementById('snapshot-device'); s.value = '0'; s.dispatchEvent(new Event('change', {bubbles: true})); })()").await;
    until(&page, "document.querySelectorAll('#what-if-table tbody tr')[3].children[1].textContent === 'none'").await;
    assert_eq!(cell(&page, 2, 1).await, fragmentation(&recorded));

    // A what-if on a device too small for what a mid-run recording holds
    // at its start: said beside the button, in MiB, with the size to try.
    let mid = torch_snapshot::window::window(&native, 0, at..events).unwrap();
    let mid_file = dir.join("mid-run.pickle");
    std::fs::write(&mid_file, torch_snapshot::write_pickle(&mid)).unwrap();
    choose_file(&page, "snapshot-file", &mid_file).await;
    until(
        &page,
        "document.getElementById('snapshot-summary').textContent.includes('mid-run.pickle')",
    )
    .await;
    set_input(&page, "what-if-mib", "1").await;
    click(&page, "btn-what-if").await;
    let said = until(
        &page,
        "document.getElementById('what-if-error').textContent",
    )
    .await;
    // (The form of a newly opened file starts at its recorded settings.)
    let tiny = RestartSettings {
        device_total_bytes: Some(1 << 20),
        ..Default::default()
    };
    let native_error = replay_what_if(&mid, 0, &tiny).unwrap_err().to_string();
    assert_eq!(said.as_str().unwrap(), native_error);
    let smallest: String = native_error
        .split("holds them: ")
        .nth(1)
        .unwrap()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    set_input(&page, "what-if-mib", &smallest).await;
    click(&page, "btn-what-if").await;
    until(&page, "document.getElementById('what-if-error').textContent === '' && document.getElementById('what-if-command').textContent.includes('device_total_bytes')").await;
    assert_eq!(text(&page, "snapshot-error").await, "");

    // The playground's session, saved as a snapshot, and replayed in a new
    // tab of the snapshot page.
    for _ in 0..3 {
        click(&play, "btn-alloc").await;
    }
    until(
        &play,
        "document.getElementById('last-step').textContent === '2'",
    )
    .await;
    let session = torch_snapshot::read(&saved_by(&play, "btn-export").await).unwrap();
    let allocs = session.device_traces[0]
        .iter()
        .filter(|e| e.action == torch_snapshot::Action::Alloc)
        .count();
    assert_eq!(allocs, 3);
    assert_eq!(replay_exact(&session, 0).unwrap().exact, Some(true));
    let before: Vec<TargetId> = browser
        .pages()
        .await
        .unwrap()
        .iter()
        .map(|p| p.target_id().clone())
        .collect();
    click(&play, "btn-replay-session").await;
    let tab = new_tab(&browser, &before).await;
    until(&tab, "document.getElementById('snapshot-summary').textContent.includes('vramlab-session.pickle')").await;
    assert!(text(&tab, "snapshot-verdict")
        .await
        .starts_with("Replayed exactly"));
    let summary = text(&tab, "snapshot-summary").await;
    let session_events = session.device_traces[0].len();
    assert!(
        summary.contains(&format!(" {session_events} events")),
        "{summary}"
    );
    // The fragment that carried the session is dropped: a reload opens
    // an empty page.
    let url = js(&tab, "location.href").await;
    assert_eq!(url.as_str().unwrap(), format!("http://{addr}/snapshots/"));

    let _ = stop_tx.send(());
    finish(browser, handler, profile).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The texts of the `li`s under element `id`.
async fn items(page: &Page, id: &str) -> Vec<String> {
    let v = js(
        page,
        &format!("[...document.querySelectorAll('#{id} li')].map(l => l.textContent)"),
    )
    .await;
    serde_json::from_value(v).unwrap()
}

/// The snapshot page's questions after "what happened": the fix searched
/// for the fragmentation lesson's out-of-memory (the lines `vramlab
/// replay --fix` prints, and the setting replayed as a what-if that runs
/// through); two sessions that differ in the batch size compared (the
/// lines `vramlab diff` prints, the difference named); the active memory
/// timeline; a window of events opened, the whole recording back, the
/// events around the peak; an expandable recording that starts mid-run,
/// replayed exactly.
/// A real recording's out-of-memory (an H100's, with its stack frames):
/// at a laptop's width and a phone's, the headline says it in full and
/// the events table shows each event's code line whole (its "from"
/// column was clipped, the user's own line in it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_out_of_memory_and_its_code_lines_read_whole() {
    if prerequisites().is_none() {
        return;
    }
    let golden = root().join("tests/golden/snapshot-oom.pickle");
    let native = torch_snapshot::read(&std::fs::read(&golden).unwrap()).unwrap();
    let headline = search_fix(&native, 0).unwrap().unwrap().headline();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (browser, handler, profile) = launch("snapshot-oom").await;
    let page = open_snapshots(&browser, &format!("http://{addr}/snapshots/")).await;
    choose_file(&page, "snapshot-file", &golden).await;
    let script = format!(
        "document.getElementById('snapshot-headline').textContent === {}",
        serde_json::to_string(&headline).unwrap()
    );
    until(&page, &script).await;
    // The events around the out-of-memory, each "from" cell whole inside
    // its table, the table inside its box.
    let whole = "(() => { const box = document.querySelector('.trace'); const cells = [...document.querySelectorAll('#trace-events tbody td:last-child')]; return cells.length > 0 && cells.some((c) => c.textContent.includes('step_trace.py:')) && cells.every((c) => c.scrollWidth <= c.clientWidth + 1 && c.getBoundingClientRect().right <= box.getBoundingClientRect().right + 1) && box.scrollWidth <= box.clientWidth + 1; })()";
    for (width, height) in [(1280, 800), (390, 844)] {
        viewport(&page, width, height).await;
        assert_eq!(
            js(&page, whole).await,
            serde_json::Value::Bool(true),
            "at {width} x {height}"
        );
        let headline_box = js(&page, "(() => { const h = document.getElementById('snapshot-headline'); return h.scrollWidth <= h.clientWidth + 1 && h.getBoundingClientRect().right <= window.innerWidth + 1; })()").await;
        assert_eq!(
            headline_box,
            serde_json::Value::Bool(true),
            "at {width} x {height}"
        );
        // Nothing on the page runs past the screen's edge (the summary's
        // values were cut off on a phone).
        let over = js(&page, "JSON.stringify([...document.querySelectorAll('#your-snapshot *')].filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1 && !e.closest('.map-scroll, .trace, .frames')).slice(0, 5).map((e) => e.id || e.className || e.tagName))").await;
        assert_eq!(
            over,
            serde_json::Value::String("[]".into()),
            "at {width} x {height}"
        );
    }
    let _ = stop_tx.send(());
    finish(browser, handler, profile).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_searches_the_fix_compares_two_runs_and_opens_a_window() {
    if prerequisites().is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("vramlab-snapshot-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fragmented = export_lesson(&dir, "05-fragmentation-oom");
    let native = torch_snapshot::read(&std::fs::read(&fragmented).unwrap()).unwrap();
    let report = search_fix(&native, 0).unwrap();
    let lines = [
        r#"{"cmd":"model","name":"model","layers":2,"width":1024,"input_dim":784,"classes":10}"#,
        r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}"#,
        r#"{"cmd":"data","name":"data","samples":4096,"features":784,"classes":10}"#,
    ];
    let session = |batch: u32| {
        let train = format!(
            r#"{{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":2,"batch_size":{batch}}}"#
        );
        let mut all = lines.to_vec();
        all.push(&train);
        let path = dir.join(format!("b{batch}.pickle"));
        std::fs::write(&path, session_snapshot(&all)).unwrap();
        path
    };
    let (b64, b128) = (session(64), session(128));

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (browser, handler, profile) = launch("snapshot-compare").await;
    let page = open_snapshots(&browser, &format!("http://{addr}/snapshots/")).await;

    // The fix: the same lines as the command line's, and the best setting
    // replayed here runs through.
    choose_file(&page, "snapshot-file", &fragmented).await;
    until(&page, "document.getElementById('snapshot-summary').textContent.includes('05-fragmentation-oom.pickle')").await;
    // The out-of-memory in plain words first, searched as it opens: where
    // it ran out, what it asked for with how much live, the setting that
    // runs it through, who held the memory; the command line's headline.
    let headline = report.as_ref().unwrap().headline();
    assert!(headline.starts_with("Ran out of memory"), "{headline}");
    assert!(headline.contains("PYTORCH_CUDA_ALLOC_CONF="), "{headline}");
    let script = format!(
        "document.getElementById('snapshot-headline').textContent === {}",
        serde_json::to_string(&headline).unwrap()
    );
    until(&page, &script).await;
    click(&page, "btn-fix").await;
    until(
        &page,
        "document.querySelectorAll('#fix-lines li').length > 0",
    )
    .await;
    assert_eq!(items(&page, "fix-lines").await, fix_lines(report.as_ref()));
    let report = report.unwrap();
    let best = (report.ranked().into_iter())
        .find(|c| c.alloc_conf.is_some())
        .unwrap()
        .clone();
    let first = js(
        &page,
        "document.querySelector('#fix-table tbody td').textContent",
    )
    .await;
    assert_eq!(first.as_str(), best.alloc_conf.as_deref());
    js(
        &page,
        "document.querySelector('#fix-table .fix-replay').click()",
    )
    .await;
    until(
        &page,
        &format!(
            "document.getElementById('what-if-command').textContent.includes('{}')",
            best.what_if
        ),
    )
    .await;
    assert_eq!(cell(&page, 3, 2).await, "none here; 1 in the recording");
    // The same setting asked through the what-if form, with no card or
    // size: replayed in the room the fix searched in (the form says so),
    // it agrees with the fix, number for number.
    let room = format_size(report.room_bytes);
    assert_eq!(
        text(&page, "what-if-room").await,
        format!("Without a card or size, it replays in {room}: what the process held at its out-of-memory and the driver still had free (the room the fix searches in).")
    );
    let split = (report.candidates.iter())
        .find(|c| c.alloc_conf.as_deref() == Some("max_split_size_mb:128"))
        .unwrap()
        .clone();
    set_input(&page, "what-if-max-split", "128").await;
    click(&page, "btn-what-if").await;
    until(
        &page,
        "document.getElementById('what-if-command').textContent.endsWith(\"--what-if 'max_split_size_mb=128'\")",
    )
    .await;
    assert_eq!(
        (cell(&page, 0, 2).await, split.runs),
        (format_size(split.peak_reserved_bytes), true)
    );
    assert_eq!(cell(&page, 3, 2).await, "none here; 1 in the recording");
    let command = js(
        &page,
        "[...document.querySelectorAll('#fix-table ~ .cli code')].map(c => c.textContent)[0]",
    )
    .await;
    assert_eq!(
        command.as_str().unwrap(),
        "vramlab replay 05-fragmentation-oom.pickle --fix"
    );
    shot(&page, "snapshot-fix.png").await;

    // Two runs: batch 64 against batch 128, as `vramlab diff` says it.
    choose_file(&page, "snapshot-file", &b64).await;
    until(
        &page,
        "document.getElementById('snapshot-summary').textContent.includes('b64.pickle')",
    )
    .await;
    assert!(js(&page, "document.getElementById('btn-fix').disabled")
        .await
        .as_bool()
        .unwrap());
    choose_file(&page, "diff-file", &b128).await;
    until(
        &page,
        "document.querySelectorAll('#diff-lines li').length > 0",
    )
    .await;
    let (a, b) = (
        torch_snapshot::read(&std::fs::read(&b64).unwrap()).unwrap(),
        torch_snapshot::read(&std::fs::read(&b128).unwrap()).unwrap(),
    );
    let expected = diff_lines(
        &diff((&a, 0), (&b, 0)).unwrap(),
        "b64.pickle",
        "b128.pickle",
    );
    let shown = items(&page, "diff-lines").await;
    assert_eq!(shown, expected);
    assert!(
        shown
            .iter()
            .any(|l| l == "B's peak is 452.50 KiB higher; 100% of it is in:"),
        "{shown:?}"
    );
    assert_eq!(
        text(&page, "diff-command").await,
        "vramlab diff b64.pickle b128.pickle"
    );
    let polylines = js(
        &page,
        "document.querySelectorAll('#diff-chart polyline').length",
    )
    .await;
    assert_eq!(polylines.as_u64(), Some(2));
    shot(&page, "snapshot-diff.png").await;

    // The active memory timeline, drawn when asked: the engine's bands.
    click(&page, "btn-active").await;
    until(
        &page,
        "document.querySelectorAll('#active-chart polygon').length > 0",
    )
    .await;
    let native_active = active_timeline(&a, 0, 400).unwrap();
    let drawn = js(
        &page,
        "document.querySelectorAll('#active-chart polygon').length",
    )
    .await;
    assert_eq!(drawn.as_u64(), Some(native_active.bands.len() as u64));
    let first = js(
        &page,
        "document.querySelector('#active-chart polygon title').textContent",
    )
    .await;
    let band = &native_active.bands[0];
    assert!(
        first.as_str().unwrap().starts_with(&format!(
            "{} · events {}..{} · ",
            format_size(band.size),
            band.start,
            band.end
        )),
        "{first}"
    );
    shot(&page, "snapshot-active.png").await;
    // Dragged across its middle half: zoomed to those events, the largest
    // allocations alive in them, as the engine's `active_timeline_in`.
    let events = native_active.events;
    let drag = |kind: &str, f: f64| {
        format!("(() => {{ const s = document.getElementById('active-chart'); const r = s.getBoundingClientRect(); s.dispatchEvent(new MouseEvent({kind:?}, {{clientX: r.left + {f} * r.width, clientY: r.top + r.height / 2, bubbles: true}})); }})()")
    };
    js(&page, &drag("mousedown", 0.25)).await;
    js(&page, &drag("mouseup", 0.75)).await;
    until(&page, "!document.getElementById('active-reset').disabled").await;
    let keys = until(&page, "(() => { const t = document.getElementById('active-keys').textContent; return !t.startsWith('Events 0..') && t; })()").await;
    let keys = keys.as_str().unwrap();
    let shown: Vec<usize> = keys["Events ".len()..keys.find(':').unwrap()]
        .split("..")
        .map(|n| n.parse().unwrap())
        .collect();
    let (from, to) = (shown[0], shown[1]);
    // A pixel's rounding from the quarters.
    assert!(
        from.abs_diff(events / 4) <= 1 && to.abs_diff(events * 3 / 4 + 1) <= 1,
        "{keys}"
    );
    let zoomed =
        vramlab_shared::torch_snapshot::active::active_timeline_in(&a, 0, 400, from..to).unwrap();
    assert!(
        keys.contains(&format!("{} allocations drawn", zoomed.bands.len())),
        "{keys}"
    );
    let drawn = js(
        &page,
        "document.querySelectorAll('#active-chart polygon').length",
    )
    .await;
    assert_eq!(drawn.as_u64(), Some(zoomed.bands.len() as u64));
    click(&page, "active-reset").await;
    until(
        &page,
        &format!(
            "document.getElementById('active-keys').textContent.startsWith('Events 0..{events}:')"
        ),
    )
    .await;

    // A window: events 10..40 as a recording of its own, then the whole.
    set_input(&page, "window-from", "10").await;
    set_input(&page, "window-to", "40").await;
    click(&page, "btn-window").await;
    until(&page, "document.getElementById('snapshot-summary').textContent.includes('b64.pickle events 10..40')").await;
    let summary = text(&page, "snapshot-summary").await;
    assert!(summary.contains(" 30 events"), "{summary}");
    assert!(text(&page, "snapshot-verdict")
        .await
        .starts_with("Replayed exactly"));
    click(&page, "btn-whole").await;
    until(
        &page,
        &format!(
            "document.getElementById('snapshot-summary').textContent.includes(' {} events')",
            a.device_traces[0].len()
        ),
    )
    .await;
    assert_eq!(
        js(&page, "document.getElementById('btn-whole')").await,
        serde_json::Value::Null
    );
    // Ten events either side of the peak, as `--around-peak 10` cuts them.
    let (range, _) = torch_snapshot::window::around_peak(&a, 0, 10).unwrap();
    let end = range.end.min(a.device_traces[0].len());
    set_input(&page, "window-around", "10").await;
    click(&page, "btn-around-peak").await;
    until(
        &page,
        &format!(
            "document.getElementById('snapshot-summary').textContent.includes('b64.pickle events {}..{} ')",
            range.start, range.end
        ),
    )
    .await;
    let summary = text(&page, "snapshot-summary").await;
    assert!(
        summary.contains(&format!(" {} events", end - range.start)),
        "{summary}"
    );

    // A recording with expandable segments that starts mid-run (a window
    // of the expandable-segments lesson's): exact in the page too.
    let expandable = export_lesson(&dir, "15-expandable-segments");
    let whole = torch_snapshot::read(&std::fs::read(&expandable).unwrap()).unwrap();
    let half = whole.device_traces[0].len() / 2;
    let mid = torch_snapshot::window::window(&whole, 0, half..usize::MAX).unwrap();
    assert_eq!(replay_exact(&mid, 0).unwrap().exact, Some(true));
    let mid_file = dir.join("expandable-mid-run.pickle");
    std::fs::write(&mid_file, torch_snapshot::write_pickle(&mid)).unwrap();
    choose_file(&page, "snapshot-file", &mid_file).await;
    until(&page, "document.getElementById('snapshot-summary').textContent.includes('expandable-mid-run.pickle')").await;
    let verdict = text(&page, "snapshot-verdict").await;
    assert!(verdict.starts_with("Replayed exactly"), "{verdict}");

    let _ = stop_tx.send(());
    finish(browser, handler, profile).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The peak resident memory (`VmHWM`) of the largest of Chromium's
/// renderer processes under `browser` (a tab's), in bytes.
fn renderer_peak_bytes(browser: u32) -> u64 {
    let parent = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let under = |mut pid: u32| {
        while let Some(p) = parent(pid).filter(|&p| p > 1) {
            if p == browser {
                return true;
            }
            pid = p;
        }
        false
    };
    let peak = |pid: u32| -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("--type=renderer"))
                && under(pid)
        })
        .filter_map(peak)
        .max()
        .unwrap_or(0)
}

/// A generated gigabyte recording opened in Your snapshot: the time from
/// choosing the file to its verdict, and the tab's peak resident memory,
/// printed as figures (a benchmark, run by hand:
/// `cargo run --release -p vramlab-shared --example synthetic_snapshot -- 1024 big.pickle`,
/// then `VRAMLAB_BIG_SNAPSHOT=big.pickle cargo test -p vramlab-tests --test
/// snapshot_page -- --ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark of a generated gigabyte file: run by hand"]
async fn a_gigabyte_recording_in_the_page() {
    let Some(path) = std::env::var_os("VRAMLAB_BIG_SNAPSHOT").map(std::path::PathBuf::from) else {
        eprintln!("skip: VRAMLAB_BIG_SNAPSHOT names no file");
        return;
    };
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, handler, profile) = launch("snapshot-big").await;
    let pid = (browser.get_mut_child())
        .and_then(|c| c.as_mut_inner().id())
        .unwrap();
    let page = open_snapshots(&browser, &format!("http://{addr}/snapshots/")).await;
    let start = std::time::Instant::now();
    choose_file(&page, "snapshot-file", &path).await;
    // The page is busy for seconds at a time while it replays: asked
    // with a long patience, until it has answered.
    let said = loop {
        let answer = tokio::time::timeout(
            std::time::Duration::from_secs(600),
            page.evaluate("document.getElementById('snapshot-verdict')?.textContent || document.getElementById('snapshot-error').textContent"),
        )
        .await
        .unwrap()
        .unwrap()
        .into_value::<String>()
        .unwrap_or_default();
        if !answer.is_empty() {
            break answer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let wall = start.elapsed();
    let summary = text(&page, "snapshot-summary").await;
    let ms = text(&page, "snapshot-ms").await;
    println!(
        "figure: {} ({:.0} MB) chosen to its verdict in the page in {:.1} s (read and replayed in {ms} ms of it); the tab's peak resident memory {:.2} GB: {summary}",
        path.display(),
        std::fs::metadata(&path).unwrap().len() as f64 / 1e6,
        wall.as_secs_f64(),
        renderer_peak_bytes(pid) as f64 / 1e9,
    );
    assert!(said.starts_with("Replayed exactly"), "{said}");
    // memory_viz's view of it, drawn when asked.
    let start = std::time::Instant::now();
    click(&page, "btn-active").await;
    loop {
        let drawn = tokio::time::timeout(
            std::time::Duration::from_secs(600),
            page.evaluate("document.querySelectorAll('#active-chart polygon').length"),
        )
        .await
        .unwrap()
        .unwrap()
        .into_value::<u64>()
        .unwrap_or(0);
        if drawn > 0 {
            println!(
                "figure: its active memory timeline ({drawn} bands) drawn in {:.1} s; the tab's peak resident memory then {:.2} GB",
                start.elapsed().as_secs_f64(),
                renderer_peak_bytes(pid) as f64 / 1e9
            );
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(());
    finish(browser, handler, profile).await;
}

/// One tool's time from the file given to its drawn timeline, in the
/// page's own clock (`None` when it drew nothing in ten minutes, or its
/// tab died), and the tab's peak resident memory.
async fn time_to_drawn(
    url: &str,
    file: &std::path::Path,
    give: &str,
    drawn: &str,
) -> (Option<f64>, u64) {
    let (mut browser, handler, profile) = launch("bench").await;
    let pid = (browser.get_mut_child())
        .and_then(|c| c.as_mut_inner().id())
        .unwrap();
    let page = browser.new_page("about:blank").await.unwrap();
    page.goto(url).await.unwrap();
    until(&page, "document.readyState === 'complete' && document.querySelector('select, input[type=file]') !== null").await;
    js(&page, "(() => { const i = document.createElement('input'); i.type = 'file'; i.id = 'bench-file'; i.hidden = true; document.body.append(i); })()").await;
    choose_file(&page, "bench-file", file).await;
    js(&page, &format!("(() => {{ window.t1 = 0; new MutationObserver(() => {{ if (!window.t1 && ({drawn})) window.t1 = performance.now(); }}).observe(document.body, {{childList: true, subtree: true, attributes: true}}); window.t0 = performance.now(); {give}; }})()")).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    let mut took = None;
    while std::time::Instant::now() < deadline {
        // A page busy replaying answers late; one that has not answered
        // in two minutes has stopped.
        let answer = tokio::time::timeout(
            std::time::Duration::from_secs(120),
            page.evaluate("window.t1 ? window.t1 - window.t0 : 0"),
        )
        .await;
        match answer {
            Ok(Ok(v)) => {
                let ms = v.into_value::<f64>().unwrap_or(0.0);
                if ms > 0.0 {
                    took = Some(ms / 1e3);
                    break;
                }
            }
            _ => break,
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let peak = renderer_peak_bytes(pid);
    let _ = browser.close().await;
    let _ = browser.wait().await;
    handler.abort();
    let _ = std::fs::remove_dir_all(&profile);
    (took, peak)
}

/// pytorch.org/memory_viz beside Your snapshot on the same files in the
/// same headless Chromium: the time from dropping the file (memory_viz)
/// or choosing it (Your snapshot) to the drawn timeline, and the tab's
/// peak resident memory, as ratios. A benchmark, run by hand:
/// `scripts/memory-viz-bench PATH/TO/MemoryViz.js DIR`, then
/// `VRAMLAB_MEMORY_VIZ=DIR cargo test -p vramlab-tests --test snapshot_page
/// memory_viz -- --ignored --nocapture` (with `VRAMLAB_BIG_SNAPSHOT=FILE`,
/// that file too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark beside memory_viz: run by hand"]
async fn memory_viz_beside_your_snapshot() {
    let Some(viz) = std::env::var_os("VRAMLAB_MEMORY_VIZ").map(std::path::PathBuf::from) else {
        eprintln!("skip: VRAMLAB_MEMORY_VIZ names no folder (scripts/memory-viz-bench makes it)");
        return;
    };
    if prerequisites().is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("vramlab-viz-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let training = dir.join("training.pickle");
    std::fs::write(&training, training_snapshot(48, 34)).unwrap();
    let mut files = vec![training];
    files.extend(std::env::var_os("VRAMLAB_BIG_SNAPSHOT").map(std::path::PathBuf::from));

    let port = vramlab_tests::free_port();
    let mut static_server = std::process::Command::new("python3")
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--directory",
        ])
        .arg(&viz)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 serves memory_viz");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    std::thread::sleep(std::time::Duration::from_millis(500));
    for file in &files {
        let mb = std::fs::metadata(file).unwrap().len() as f64 / 1e6;
        let viz_run = time_to_drawn(
            &format!("http://127.0.0.1:{port}/"),
            file,
            "const f = document.getElementById('bench-file').files[0]; const dt = new DataTransfer(); dt.items.add(f); document.body.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}))",
            "document.querySelector('svg polygon')",
        )
        .await;
        let ours = time_to_drawn(
            &format!("http://{addr}/snapshots/"),
            file,
            "const i = document.getElementById('snapshot-file'); const dt = new DataTransfer(); dt.items.add(document.getElementById('bench-file').files[0]); i.files = dt.files; i.dispatchEvent(new Event('change', {bubbles: true}))",
            "document.querySelector('#replay-chart polyline[points*=\",\"]')",
        )
        .await;
        let said = |(took, bytes): (Option<f64>, u64)| {
            let gb = bytes as f64 / 1e9;
            match took {
                Some(s) => format!("{s:.2} s, {gb:.2} GB"),
                None => format!("no timeline drawn in ten minutes, {gb:.2} GB"),
            }
        };
        let ratio = match (viz_run, ours) {
            ((Some(v), vb), (Some(o), ob)) => format!(
                "; Your snapshot / memory_viz: time {:.2}, memory {:.2}",
                o / v,
                ob as f64 / vb as f64
            ),
            _ => String::new(),
        };
        println!(
            "figure: {} ({mb:.0} MB), file to drawn timeline and the tab's peak memory: memory_viz {}; Your snapshot {}{ratio}",
            file.file_name().unwrap().to_string_lossy(),
            said(viz_run),
            said(ours)
        );
    }
    let _ = stop_tx.send(());
    let _ = static_server.kill();
    let _ = static_server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
