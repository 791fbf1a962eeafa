//! The web app in headless Chromium: the page the server serves loads its
//! wasm, runs the first lesson in the browser, and shows the same numbers
//! the engine computes. Writes a screenshot to target/screenshots/.

use chromiumoxide::browser::{Browser, BrowserConfig};
use chromiumoxide::page::ScreenshotParams;
use futures::StreamExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vramlab_server::backend::{select, DeviceChoice};
use vramlab_server::http::{build, ServeOptions};
use vramlab_shared::units::format_size;
use vramlab_shared::Engine;
use vramlab_tests::root;

fn chromium() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("CHROMIUM").map(PathBuf::from),
        Some(PathBuf::from("/usr/bin/chromium")),
        Some(PathBuf::from("/usr/bin/chromium-browser")),
    ];
    candidates.into_iter().flatten().find(|p| p.exists())
}

/// Browser tests skip where Chromium or the built app is missing, unless
/// VRAMLAB_REQUIRE_BROWSER is set (the test command sets it).
fn prerequisites() -> Option<PathBuf> {
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

async fn serve() -> String {
    let backend = select(DeviceChoice::Sim).unwrap();
    let options = ServeOptions {
        dist: root().join("dist"),
        ..ServeOptions::default()
    };
    let server = build(&options, backend).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { vramlab_server::http::serve(listener, server).await });
    format!("http://{addr}/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_runs_the_first_lesson_in_the_browser() {
    let Some(chrome) = prerequisites() else {
        return;
    };
    let url = serve().await;
    let profile = std::env::temp_dir().join(format!("vramlab-chromium-{}", std::process::id()));
    let config = BrowserConfig::builder()
        .chrome_executable(chrome)
        .no_sandbox()
        .user_data_dir(&profile)
        .window_size(1280, 720)
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
    let (mut browser, mut handler) = Browser::launch(config).await.expect("Chromium starts");
    let events = tokio::spawn(async move { while handler.next().await.is_some() {} });

    let page = browser.new_page(url.as_str()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let button = loop {
        if let Ok(b) = page.find_element("#run").await {
            break b;
        }
        assert!(Instant::now() < deadline, "the app never rendered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    button.click().await.unwrap();

    // What the engine says, computed here from the same lesson.
    let lesson =
        std::fs::read_to_string(root().join("tests/lessons/01-del-vs-empty-cache.jsonl")).unwrap();
    let mut engine = Engine::new_simulated();
    let expected: Vec<[String; 3]> = lesson
        .lines()
        .map(|l| {
            let s = engine.run_line(l).stats;
            [
                format_size(s.allocated_bytes),
                format_size(s.reserved_bytes),
                format_size(s.device_used_bytes),
            ]
        })
        .collect();

    let rows = loop {
        let rows = page.find_elements("#results tbody tr").await.unwrap();
        if rows.len() == expected.len() {
            break rows;
        }
        assert!(Instant::now() < deadline, "results never appeared");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for (row, want) in rows.iter().zip(&expected) {
        let text = row.inner_text().await.unwrap().unwrap_or_default();
        for number in want {
            assert!(
                text.contains(number.as_str()),
                "row {text:?} lacks {number}"
            );
        }
    }

    let shots = root().join("target/screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    page.save_screenshot(
        ScreenshotParams::builder().full_page(true).build(),
        shots.join("playground.png"),
    )
    .await
    .unwrap();

    browser.close().await.unwrap();
    browser.wait().await.unwrap();
    events.abort();
    let _ = std::fs::remove_dir_all(&profile);
}
