//! The page for the room and for the keyboard, in headless Chromium against
//! the real server: the five buttons and a lesson by keyboard alone (a skip
//! link, visible focus, shortcuts), text contrast at WCAG AA in the light
//! theme and in projector mode, the bar's scale, the segment map in words,
//! a restart that sends the lesson back to its start. It also takes the
//! screenshots the README shows.

mod chromium;

use chromium::*;
use chromiumoxide::cdp::browser_protocol::input::{DispatchKeyEventParams, DispatchKeyEventType};
use chromiumoxide::Page;
use serde_json::json;

/// Presses a key as the keyboard does (down, then up).
async fn key(page: &Page, key: &str, code: i64) {
    let text = if key.len() == 1 {
        key.to_string()
    } else if key == "Enter" {
        "\r".into()
    } else {
        String::new()
    };
    for kind in [DispatchKeyEventType::KeyDown, DispatchKeyEventType::KeyUp] {
        let mut p = DispatchKeyEventParams::builder()
            .r#type(kind.clone())
            .key(key)
            .code(key)
            .windows_virtual_key_code(code);
        if kind == DispatchKeyEventType::KeyDown && !text.is_empty() {
            p = p.text(text.clone());
        }
        page.execute(p.build().unwrap()).await.unwrap();
    }
}

async fn focused(page: &Page) -> String {
    js(page, "document.activeElement?.id || ''")
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Tabs until the element `id` has the focus; returns how many presses.
async fn tab_to(page: &Page, id: &str) -> usize {
    for n in 1..=200 {
        key(page, "Tab", 9).await;
        if focused(page).await == id {
            let ring = js(
                page,
                "getComputedStyle(document.activeElement).outlineStyle",
            )
            .await;
            assert_ne!(ring, "none", "#{id} has no visible focus");
            return n;
        }
    }
    panic!("#{id} cannot be reached by Tab");
}

/// The lowest contrast ratio of the texts named, against what is behind them.
const CONTRAST: &str = r#"(ids => {
  const rgb = s => s.match(/[\d.]+/g).slice(0, 4).map(Number);
  const lum = ([r, g, b]) => { const f = c => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; }; return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const behind = e => { for (; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor); if (c.length < 4 || c[3] > 0) return c; } return [255, 255, 255]; };
  return ids.map(sel => { const e = document.querySelector(sel); const a = lum(rgb(getComputedStyle(e).color)), b = lum(behind(e)); return [sel, Math.round((Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05) * 100) / 100]; });
})"#;

const TEXTS: &str = "['#allocated', '#reserved', '#device-used', '#api-allocated', '.lead', '#timeline-tip', '#lesson-0', '.big .k']";

async fn lowest_contrast(page: &Page) -> (String, f64) {
    let all = js(page, &format!("{CONTRAST}({TEXTS})")).await;
    all.as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_f64().unwrap()))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_keyboard_alone_and_for_the_room() {
    if prerequisites().is_none() {
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let addr = serve_on(0, stop_rx).await;
    let (mut browser, events, profile) = launch("room").await;
    let page = open(&browser, &format!("http://{addr}/")).await;
    viewport(&page, 1280, 800).await;
    // The skip link comes first and takes the focus to the numbers.
    key(&page, "Tab", 9).await;
    assert_eq!(js(&page, "document.activeElement.className").await, "skip");
    // The five buttons by keyboard: Tab to each, Enter presses it.
    let allocate = tab_to(&page, "btn-alloc").await;
    let before = results(&page).await;
    key(&page, "Enter", 13).await;
    until(&page, &format!("{COUNT} > {before}")).await;
    // The rare call is folded under "more"; open, it is reached the same way.
    js(&page, "document.getElementById('more-calls').open = true").await;
    for id in [
        "btn-del",
        "btn-gc",
        "btn-empty-cache",
        "btn-clear-cublas",
        "btn-restart",
    ] {
        tab_to(&page, id).await;
        let before = results(&page).await;
        key(&page, "Enter", 13).await;
        until(&page, &format!("{COUNT} > {before}")).await;
    }
    assert!(allocate < 60, "{allocate} Tab presses to Allocate");
    // Shortcuts outside the fields: g is gc.collect().
    js(&page, "document.activeElement.blur()").await;
    let before = results(&page).await;
    key(&page, "g", 71).await;
    until(&page, &format!("{COUNT} > {before}")).await;
    let code = js(&page, "document.getElementById('code').textContent").await;
    assert!(
        code.as_str().unwrap().trim_end().ends_with("gc.collect()"),
        "{code}"
    );
    // A lesson by keyboard: its first question, then n for each step.
    js(&page, "document.getElementById('lesson-0').focus()").await;
    key(&page, "Enter", 13).await;
    until(&page, "!!document.getElementById('lesson-do')").await;
    let tabs = {
        js(
            &page,
            "document.getElementById('lesson-0') || document.activeElement.blur()",
        )
        .await;
        js(
            &page,
            "window.scrollTo(0, 0); document.querySelector('.skip').focus()",
        )
        .await;
        tab_to(&page, "lesson-do").await
    };
    assert!(
        tabs <= 12,
        "{tabs} Tab presses from the top to 'Do this step'"
    );
    js(&page, "document.activeElement.blur()").await;
    for step in 1..=3 {
        let before = results(&page).await;
        key(&page, "n", 78).await;
        until(&page, &format!("{COUNT} > {before}")).await;
        until(&page, &format!("document.querySelector('.progress-line span').textContent.startsWith('step {} of')", step + 1)).await;
    }
    // A restart the lesson did not ask for sends it back to its start.
    let before = results(&page).await;
    click(&page, "btn-restart").await;
    until(&page, &format!("{COUNT} > {before}")).await;
    until(
        &page,
        "document.querySelector('.progress-line span').textContent.startsWith('step 1 of')",
    )
    .await;
    let outcome = js(
        &page,
        "document.getElementById('lesson-outcome').textContent",
    )
    .await;
    assert!(
        outcome.as_str().unwrap().contains("kernel restarted"),
        "{outcome}"
    );

    // Contrast at WCAG AA, light theme and projector mode.
    js(&page, "document.getElementById('lesson-all').click()").await;
    until(&page, "!!document.getElementById('lesson-0')").await;
    let (which, ratio) = lowest_contrast(&page).await;
    assert!(ratio >= 4.5, "light theme: {which} at {ratio}:1");
    click(&page, "projector").await;
    until(&page, "document.body.classList.contains('projector')").await;
    let (which, ratio) = lowest_contrast(&page).await;
    assert!(ratio >= 4.5, "projector mode: {which} at {ratio}:1");
    assert!(js(&page, "location.search")
        .await
        .as_str()
        .unwrap()
        .contains("view=projector"));
    viewport(&page, 1920, 1080).await;
    open_lesson(&page, "lesson-4").await;
    for _ in 0..5 {
        let before = results(&page).await;
        click(&page, "lesson-do").await;
        until(&page, &format!("{COUNT} > {before}")).await;
    }
    shot_screen(&page, "projector-1920.png").await;
    click(&page, "projector").await;

    // The bar: this process by default, the whole GPU on request; the
    // segment map in words.
    let bar = js(
        &page,
        "document.getElementById('bar').getAttribute('aria-label')",
    )
    .await;
    assert!(
        bar.as_str().unwrap().contains("CUDA context")
            && !bar.as_str().unwrap().contains(", free "),
        "{bar}"
    );
    click(&page, "bar-scale").await;
    until(
        &page,
        "document.getElementById('bar').getAttribute('aria-label').includes(', free ')",
    )
    .await;
    let words = js(
        &page,
        "[...document.querySelectorAll('#segment-list li')].map(l => l.textContent)",
    )
    .await;
    assert!(
        words.as_array().unwrap().iter().any(|w| {
            let w = w.as_str().unwrap();
            w.starts_with("segment of 700.00 MiB") && w.contains("500.00 MiB free (inactive splits")
        }),
        "{words}"
    );
    assert_eq!(
        js(
            &page,
            "document.getElementById('segment-map').getAttribute('aria-describedby')"
        )
        .await,
        json!("segment-list")
    );
    page.close().await.unwrap();

    // The first screen, and the phone layout in a lesson.
    let first = open(&browser, &format!("http://{addr}/")).await;
    viewport(&first, 1280, 800).await;
    until(
        &first,
        "document.getElementById('status').textContent === 'connected'",
    )
    .await;
    shot_screen(&first, "first-screen-1280.png").await;
    viewport(&first, 390, 844).await;
    open_lesson(&first, "lesson-0").await;
    for _ in 0..4 {
        let before = results(&first).await;
        click(&first, "lesson-do").await;
        until(&first, &format!("{COUNT} > {before}")).await;
    }
    shot_screen(&first, "phone-390.png").await;
    // Rows to scale: the far right of the 256 MiB segment's row is a block,
    // of the 2 MiB segment's row nothing.
    let mut tips = Vec::new();
    for row in [0, 1] {
        js(&first, &format!("(() => {{ const c = document.getElementById('segment-map'); const r = c.getBoundingClientRect(); c.dispatchEvent(new MouseEvent('mousemove', {{clientX: r.right - 3, clientY: r.top + {row} * 16 + 8, bubbles: true}})); }})()")).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        tips.push(js(&first, "document.getElementById('segment-tip').textContent").await);
    }
    let sizes = js(&first, "[...document.querySelectorAll('#segment-list li')].map(l => l.textContent.split(' at ')[0])").await;
    assert_eq!(
        sizes,
        json!(["segment of 256.00 MiB", "segment of 2.00 MiB"])
    );
    assert!(tips[0].as_str().unwrap().contains("256.00 MiB"), "{tips:?}");
    assert_eq!(tips[1], "", "{tips:?}");
    // Tensors made by hand have their own name in the bar.
    let bar = js(
        &first,
        "document.getElementById('bar').getAttribute('aria-label')",
    )
    .await;
    assert!(bar.as_str().unwrap().contains("tensors you made"), "{bar}");
    first.close().await.unwrap();
    browser.close().await.unwrap();
    let _ = events.await;
    let _ = stop_tx.send(());
    let _ = std::fs::remove_dir_all(profile);
}
