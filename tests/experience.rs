//! The playground as a learner meets it, in headless Chromium against the
//! real server: at phone, laptop and desktop widths nothing overflows
//! sideways and the lesson's step and the numbers are on screen together;
//! a link to a lesson's step runs the steps before it; `?lesson=1` and
//! `?framework=` are taken; bad values in fields are refused where they
//! are typed and nothing is sent; a click while disconnected says so; each
//! step shows its picture beside it.

mod chromium;

use chromium::*;
use chromiumoxide::Page;

/// Whether the element is wholly inside the viewport.
async fn on_screen(page: &Page, id: &str) -> bool {
    js(
        page,
        &format!(
            "(() => {{ const r = document.getElementById('{id}').getBoundingClientRect();
                 return r.top >= 0 && r.bottom <= innerHeight && r.left >= 0 && r.right <= innerWidth; }})()"
        ),
    )
    .await
    .as_bool()
    .unwrap_or(false)
}

/// Whether the element is wholly inside the viewport and nothing covers
/// it (the sticky numbers over a scrolled step's outcome did): what lies
/// at its corners and centre is the element or inside it.
async fn seen(page: &Page, id: &str) -> bool {
    on_screen(page, id).await
        && js(
            page,
            &format!(
                "(() => {{ const e = document.getElementById('{id}'); const r = e.getBoundingClientRect();
                     const at = (x, y) => {{ const h = document.elementFromPoint(x, y); return h && (e.contains(h) || h.contains(e)); }};
                     return at((r.left + r.right) / 2, (r.top + r.bottom) / 2) && at(r.left + 2, r.top + 2) && at(r.right - 2, r.bottom - 2); }})()"
            ),
        )
        .await
        .as_bool()
        .unwrap_or(false)
}

async fn no_sideways_overflow(page: &Page) -> (bool, String) {
    let v = js(page, "[document.documentElement.scrollWidth, innerWidth]").await;
    let (wide, inner) = (v[0].as_i64().unwrap(), v[1].as_i64().unwrap());
    // The outermost elements past the window's edge, to say which.
    let past = js(page, "JSON.stringify([...document.body.querySelectorAll('*')].filter((e) => e.getBoundingClientRect().right > innerWidth + 1 && !(e.parentElement && e.parentElement.getBoundingClientRect().right > innerWidth + 1)).slice(0, 6).map((e) => `${e.tagName.toLowerCase()}#${e.id}.${e.className} ${Math.round(e.getBoundingClientRect().width)}px`))").await;
    (
        wide <= inner,
        format!("page {wide} px wide in a {inner} px window: {past}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_every_width_the_step_and_the_numbers_are_on_screen_together() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("widths").await;
    let sizes = [(390, 844), (1280, 800), (1920, 1080)];
    // Each size as a learner sees it, and in projector mode as a class does.
    for (width, height, view) in (sizes.iter().map(|&(w, h)| (w, h, "")))
        .chain(sizes.iter().map(|&(w, h)| (w, h, "?view=projector")))
    {
        let page = browser.new_page("about:blank").await.unwrap();
        viewport(&page, width, height).await;
        page.goto(format!("http://{addr}/{view}")).await.unwrap();
        until(
            &page,
            "document.getElementById('status').textContent === 'connected'",
        )
        .await;
        open_lesson(&page, "lesson-0").await;
        for step in 0..4 {
            until(&page, "document.getElementById('lesson-do')").await;
            let at = js(&page, "JSON.stringify([document.getElementById('lesson-do').getBoundingClientRect(), innerHeight, scrollY])").await;
            assert!(
                on_screen(&page, "lesson-do").await,
                "{width}{view}: step {step} off screen: {at}"
            );
            press(&page, "lesson-do").await;
            for id in ["lesson-outcome", "allocated", "reserved", "device-used"] {
                assert!(
                    seen(&page, id).await,
                    "{width}{view}: #{id} off screen or covered after step {step}"
                );
            }
            let (fits, why) = no_sideways_overflow(&page).await;
            assert!(fits, "{width}{view}: {why}");
            // The "Will it fit?" link covers nothing in the status bar.
            let covered = js(&page, "(() => { const l = document.querySelector('a.plan').getBoundingClientRect(); return [...document.querySelectorAll('.bar *')].filter((e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.left < l.right && l.left < r.right && r.top < l.bottom && l.top < r.bottom; }).map((e) => e.id || e.className || e.tagName).join(', '); })()").await;
            assert_eq!(covered, "", "{width}{view}: the link covers these");
        }
        // A long line in the Python pane scrolls inside it.
        let long = "t".repeat(60);
        chromium::set_input(&page, "name", &long).await;
        press(&page, "btn-alloc").await;
        until(
            &page,
            &format!("document.getElementById('code').textContent.includes('{long}')"),
        )
        .await;
        let (fits, why) = no_sideways_overflow(&page).await;
        assert!(fits, "{width}{view}, a long line: {why}");
        let projector = if view.is_empty() { "" } else { "-projector" };
        shot(&page, &format!("lesson-{width}{projector}.png")).await;
        page.close().await.unwrap();
    }
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}

/// The lesson's progress line ("step 4 of 8").
async fn step_text(page: &Page) -> String {
    until(
        page,
        "document.querySelector('.progress-line span')?.textContent",
    )
    .await
    .as_str()
    .unwrap()
    .to_string()
}

/// Over the server, a lesson's steps run back to back (a link to its last
/// step): the timeline has one slot per command, and a delta that comes
/// after its command's result adds no point. Live samples became slots
/// and drew allocated 0 -> 700 MiB -> 0 right after `del big`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeline_has_one_slot_per_command_over_the_server() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("slots").await;
    let page = open(
        &browser,
        &format!("http://{addr}/?lesson=05-fragmentation-oom&step=13"),
    )
    .await;
    until(&page, &format!("{COUNT} >= 12")).await;
    // Let every delta still in flight arrive.
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let slots = js(
        &page,
        "Number(document.querySelector('.timeline h2 small').textContent.split(' ')[0])",
    )
    .await;
    assert_eq!(slots, js(&page, COUNT).await, "one slot per command");
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}

/// A lesson's commands come when it opens; a fetch that fails is said,
/// once, and not tried again in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lesson_that_cannot_be_fetched_says_so_once() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("offline-lesson").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    js(&page, "(() => { window.__lessonFetches = 0; const f = window.fetch.bind(window); window.fetch = (u, ...a) => { if (String(u).includes('lessons/')) { window.__lessonFetches++; return Promise.reject(new TypeError('offline')); } return f(u, ...a); }; })()").await;
    click(&page, "lesson-1").await;
    let said = until(
        &page,
        "document.getElementById('lesson-loading')?.getAttribute('role') === 'alert' && document.getElementById('lesson-loading').textContent",
    )
    .await;
    assert!(
        said.as_str().unwrap().contains("02-cycle-needs-gc.jsonl"),
        "{said}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(js(&page, "window.__lessonFetches").await.as_u64(), Some(1));
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_to_a_lesson_step_run_the_steps_before_it() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("links").await;
    // Step 4 of the first lesson, as the page numbers it (the link once
    // opened step 5): steps 1 to 3 run first, each checked.
    let page = open(
        &browser,
        &format!("http://{addr}/?lesson=01-del-vs-empty-cache&step=4"),
    )
    .await;
    until(&page, &format!("{COUNT} >= 3")).await;
    assert!(
        step_text(&page).await.starts_with("step 4 of"),
        "{}",
        step_text(&page).await
    );
    let outcome = until(
        &page,
        "document.getElementById('lesson-outcome').textContent",
    )
    .await;
    assert!(outcome.as_str().unwrap().starts_with('✓'), "{outcome}");
    // And the step itself then passes.
    press(&page, "lesson-do").await;
    let outcome = js(
        &page,
        "document.getElementById('lesson-outcome').textContent",
    )
    .await;
    assert!(outcome.as_str().unwrap().starts_with('✓'), "{outcome}");
    assert!(step_text(&page).await.starts_with("step 5 of"));
    // The same tab (its session kept) opened at the lesson by its number.
    page.goto(format!("http://{addr}/?lesson=1&step=3"))
        .await
        .unwrap();
    until(&page, &format!("{COUNT} >= 2")).await;
    until(
        &page,
        "document.querySelector('.progress-line span').textContent.startsWith('step 3 of')",
    )
    .await;
    let title = js(&page, "document.querySelector('.lesson-title').textContent").await;
    assert_eq!(title, "Does del free GPU memory?", "{title}");
    // ?framework= in a tab that already has a session.
    page.goto(format!("http://{addr}/?framework=jax"))
        .await
        .unwrap();
    until(
        &page,
        "document.getElementById('framework').value === 'jax'",
    )
    .await;
    until(
        &page,
        "document.getElementById('device').textContent.length > 0",
    )
    .await;
    // A lesson that does not exist is said so, over the list.
    page.goto(format!("http://{addr}/?lesson=99"))
        .await
        .unwrap();
    let said = until(
        &page,
        "document.getElementById('unknown-lesson')?.textContent",
    )
    .await;
    assert!(said.as_str().unwrap().contains("no lesson “99”"), "{said}");
    page.close().await.unwrap();
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}

/// Types `value` into field `field`, clicks `button`: the reason shows
/// beside the button and no command is sent.
async fn refused(page: &Page, field: &str, value: &str, button: &str, reason: &str) {
    let before = results(page).await;
    let sent = js(page, "document.getElementById('code').textContent").await;
    chromium::set_input(page, field, value).await;
    click(page, button).await;
    let said = until(
        page,
        &format!("document.getElementById('{button}-refused')?.textContent"),
    )
    .await;
    assert!(
        said.as_str().unwrap().contains(reason),
        "{field}={value}: {said}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        results(page).await,
        before,
        "{field}={value} sent a command"
    );
    assert_eq!(
        js(page, "document.getElementById('code').textContent").await,
        sent
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_values_are_refused_where_they_are_typed() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("values").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    refused(
        &page,
        "layers",
        "100000",
        "btn-build",
        "layers must be 1 to 1024, not 100000",
    )
    .await;
    chromium::set_input(&page, "layers", "4").await;
    press(&page, "btn-build").await;
    refused(&page, "size", "-5", "btn-alloc", "MiB must be more than 0").await;
    refused(&page, "size", "abc", "btn-alloc", "\"abc\" is not a number").await;
    chromium::set_input(&page, "size", "64").await;
    refused(
        &page,
        "shape",
        "foo",
        "btn-alloc",
        "\"foo\" is not a dimension",
    )
    .await;
    refused(
        &page,
        "shape",
        "-1, 5",
        "btn-alloc",
        "\"-1\" is not a dimension",
    )
    .await;
    chromium::set_input(&page, "shape", "").await;
    refused(
        &page,
        "steps",
        "ten",
        "btn-play",
        "steps: \"ten\" is not a whole number",
    )
    .await;
    refused(&page, "batch", "0", "btn-train-1", "batch must be 1 to").await;
    chromium::set_input(&page, "batch", "64").await;
    // The reason goes once the value is good.
    press(&page, "btn-train-1").await;
    assert_eq!(
        js(&page, "document.getElementById('btn-train-1-refused')").await,
        serde_json::Value::Null
    );
    // A size of one's own: the card's sizes give way to the fields.
    js(
        &page,
        "(() => { const g = document.getElementById('gpu'); g.value = 'custom'; g.dispatchEvent(new Event('change', {bubbles: true})); })()",
    )
    .await;
    refused(
        &page,
        "device-gib",
        "big",
        "btn-restart-settings",
        "GPU memory (GiB): \"big\" is not a number",
    )
    .await;
    // While disconnected, a click says so and sends nothing.
    let _ = stop_tx.send(());
    until(
        &page,
        "document.getElementById('status').textContent !== 'connected'",
    )
    .await;
    click(&page, "btn-gc").await;
    let said = until(
        &page,
        "document.getElementById('btn-gc-refused')?.textContent",
    )
    .await;
    assert!(said.as_str().unwrap().contains("Not connected"), "{said}");
    page.close().await.unwrap();
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = std::fs::remove_dir_all(profile);
}

/// Text of the first element the selector finds ("" when none).
async fn text(page: &Page, selector: &str) -> String {
    js(
        page,
        &format!("document.querySelector({selector:?})?.textContent ?? ''"),
    )
    .await
    .as_str()
    .unwrap_or_default()
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lesson_played_from_the_first_screen_to_the_next_lesson() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("first-screen").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    // The first screen: what vramlab shows, the lessons by their question,
    // the words it uses.
    assert!(text(&page, ".lead").await.contains("really give back"));
    assert_eq!(text(&page, "#lesson-0").await, "Does del free GPU memory?");
    assert_eq!(
        text(&page, "#lesson-4").await,
        "Why did it run out of memory with 300 MiB free?"
    );
    assert!(text(&page, "#glossary").await.contains("inactive split"));
    open_lesson(&page, "lesson-0").await;
    let mut predicted = 0;
    for step in 0..8 {
        assert!(
            text(&page, ".progress-line span")
                .await
                .starts_with(&format!("step {} of 8", step + 1)),
            "step {step}"
        );
        // Words that are only the step's code are not shown twice.
        let words_shown = js(&page, "!document.querySelector('.step').hidden").await;
        assert_eq!(
            words_shown,
            serde_json::Value::Bool(step == 0 || step == 7),
            "step {step}"
        );
        // Step 4 is `del x`: the prediction asks about reserved, the number
        // that stays; the learner says it falls and is told otherwise.
        let asked = text(&page, ".predict b").await;
        if step == 3 {
            assert_eq!(asked, "reserved");
        }
        if !asked.is_empty() {
            click(&page, "guess-falls").await;
            predicted += 1;
        }
        press(&page, "lesson-do").await;
        let outcome = text(&page, "#lesson-outcome").await;
        // A step with a prediction marks the prediction, right or wrong;
        // one without marks the step's own outcome.
        let mark = outcome.starts_with('✓');
        assert!(
            mark == asked.is_empty() && !outcome.starts_with('✗') && outcome.len() > 4,
            "step {step}: {outcome}"
        );
        if !asked.is_empty() {
            let verdict = text(&page, "#guess-verdict").await;
            let right = verdict.contains("Right.");
            let marked = if right { '✓' } else { '✗' };
            assert!(verdict.starts_with(marked), "step {step}: {verdict}");
        }
        if step == 3 {
            let verdict = text(&page, "#guess-verdict").await;
            assert_eq!(
                verdict,
                "✗ You said reserved falls; it stayed. Not what you expected: read why below."
            );
            // The number that moved is marked; the ones that stayed are not.
            let marked = js(
                &page,
                "[...document.querySelectorAll('.big.moved')].map(e => e.classList[1])",
            )
            .await;
            assert_eq!(marked, serde_json::json!(["allocated"]));
        }
    }
    assert!(predicted >= 5, "{predicted} predictions asked");
    // A link to this step: copied, or shown to copy by hand.
    click(&page, "lesson-link").await;
    let said = until(&page, "document.getElementById('lesson-link-said').textContent.length > 0 && (document.getElementById('lesson-link-text')?.value || document.getElementById('lesson-link-said').textContent)").await;
    let link = said.as_str().unwrap().to_string();
    let search = js(&page, "location.search").await;
    assert!(
        search
            .as_str()
            .unwrap()
            .contains("lesson=01-del-vs-empty-cache&step=9"),
        "{search}"
    );
    assert!(
        link.contains("copied") || link.contains("lesson=01-del-vs-empty-cache&step=9"),
        "{link}"
    );
    assert!(text(&page, "#lesson-recap").await.contains("CUDA context"));
    assert_eq!(
        text(&page, "#lesson-next").await,
        "Why does del not free a tensor held in a cycle?"
    );
    click(&page, "lesson-next").await;
    until(
        &page,
        "document.querySelector('.lesson-title').textContent.includes('cycle')",
    )
    .await;
    // Lesson 2 up to `del h`: the explanation no longer contradicts itself.
    for _ in 0..5 {
        press(&page, "lesson-do").await;
    }
    let explained = text(&page, "#explanation").await;
    assert!(
        explained.contains("still referenced (by itself: a reference cycle"),
        "{explained}"
    );
    page.close().await.unwrap();
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}

/// Clicks the step picture's canvas over the block `at` of the way along
/// its first row (the largest segment spans the row).
async fn click_picture(page: &Page, at: f64) {
    js(
        page,
        &format!(
            "(() => {{ const c = document.getElementById('step-segments'); const r = c.getBoundingClientRect();
                 const x = r.left + 70 + (r.width - 70) * {at}; const y = r.top + 8;
                 c.dispatchEvent(new MouseEvent('click', {{clientX: x, clientY: y, bubbles: true}})); }})()"
        ),
    )
    .await;
}

/// The picture in the step: beside the fragmentation lesson's next step,
/// the segment map with the blocks the step changed outlined (named in
/// words), within reach of the step's button at a phone's width and a
/// laptop's; a click on a tensor's block `del`s its name, on a free block
/// says there is nothing to del; after a training command, the
/// timeline's newest slot with the step's peak and where it settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_step_shows_its_picture_beside_it() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("picture").await;
    for (width, height) in [(390, 844), (1280, 800)] {
        let page = browser.new_page("about:blank").await.unwrap();
        viewport(&page, width, height).await;
        // Steps 0 to 11 run first (the last, `del c`).
        page.goto(format!(
            "http://{addr}/?lesson=05-fragmentation-oom&step=13"
        ))
        .await
        .unwrap();
        until(&page, &format!("{COUNT} >= 12")).await;
        let kind = until(
            &page,
            "document.getElementById('step-picture')?.dataset.picture",
        )
        .await;
        assert_eq!(kind, "segments");
        // Caught up: nothing marked, nothing said.
        assert_eq!(
            js(&page, "document.getElementById('step-changes').textContent").await,
            ""
        );
        press(&page, "lesson-do").await; // del e
        let said = until(&page, "document.getElementById('step-changes').textContent").await;
        assert_eq!(said, "Outlined, what this step changed: 100.00 MiB free.");
        // The picture and the step's button are a glance apart.
        let gap = js(&page, "document.getElementById('lesson-do').getBoundingClientRect().top - document.getElementById('step-picture').getBoundingClientRect().bottom").await;
        let gap = gap.as_f64().unwrap();
        assert!(
            (0.0..=320.0).contains(&gap),
            "{width}: {gap} px between the picture and the step"
        );
        js(
            &page,
            "document.getElementById('step-picture').scrollIntoView({block: 'center'})",
        )
        .await;
        let rect = js(&page, "JSON.stringify(document.getElementById('step-picture').getBoundingClientRect()) + ' ' + innerWidth + 'x' + innerHeight").await;
        assert!(on_screen(&page, "step-picture").await, "{width}: {rect}");
        shot_screen(&page, &format!("picture-{width}.png")).await;
        // z = 150 MiB: out of memory, no block changed.
        press(&page, "lesson-do").await;
        until(
            &page,
            "document.getElementById('step-changes').textContent === 'This step changed no block.'",
        )
        .await;
        // b is the second of seven 100 MiB blocks; a the first, freed.
        let before = results(&page).await;
        click_picture(&page, 1.5 / 7.0).await;
        until(&page, &format!("{COUNT} > {before}")).await;
        assert_eq!(
            js(
                &page,
                "document.getElementById('step-picture-said').textContent"
            )
            .await,
            "del b"
        );
        until(
            &page,
            "document.getElementById('allocated').textContent.includes('300.00 MiB')",
        )
        .await;
        click_picture(&page, 0.5 / 7.0).await;
        let free = until(&page, "document.getElementById('step-picture-said').textContent !== 'del b' && document.getElementById('step-picture-said').textContent").await;
        assert_eq!(free, "a free block: nothing to del");
        page.close().await.unwrap();
    }

    // A training lesson: after a forward, its slot.
    let page = open(
        &browser,
        &format!("http://{addr}/?lesson=06-activations-and-batch-size&step=5"),
    )
    .await;
    until(&page, &format!("{COUNT} >= 4")).await;
    let kind = until(
        &page,
        "document.getElementById('step-picture')?.dataset.picture",
    )
    .await;
    assert_eq!(kind, "slot");
    js(
        &page,
        "document.getElementById('step-picture').scrollIntoView({block: 'center'})",
    )
    .await;
    shot_screen(&page, "picture-slot.png").await;
    let caption = until(&page, "document.getElementById('step-changes').textContent").await;
    let caption = caption.as_str().unwrap();
    assert!(caption.starts_with("forward (command "), "{caption}");
    assert!(caption.contains("allocated peaked at "), "{caption}");
    let slots = js(
        &page,
        "document.querySelectorAll('#step-slot .slot').length",
    )
    .await;
    assert!(slots.as_u64().unwrap() >= 4, "{slots}");
    assert_eq!(
        js(
            &page,
            "document.querySelectorAll('#step-slot .slot.newest').length"
        )
        .await,
        1
    );
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}
