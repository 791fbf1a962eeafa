//! Shareable state in the URL: `?framework=`, `?lesson=&step=`, `?hide=`
//! (control groups to hide for a focused exercise: `framework`, `tensor`,
//! `buttons`, `training`), `?view=projector`, `?watch=` (follow a session
//! read-only), `?engine=local|server` (where the engine runs; automatic
//! without it). The access token never stays in the address bar.

use crate::playground::lessons::LESSONS;
use vramlab_shared::types::Framework;

/// Where the engine runs: `?engine=server`, `?engine=local` (in this
/// page), or automatic (the server when one answers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineChoice {
    Auto,
    Server,
    Page,
}

impl EngineChoice {
    fn from_param(value: Option<&str>) -> Self {
        match value {
            Some("server") => Self::Server,
            Some("local") => Self::Page,
            _ => Self::Auto,
        }
    }
}

pub struct Initial {
    pub engine: EngineChoice,
    pub framework: Option<Framework>,
    pub lesson: Option<(usize, usize)>,
    pub hide: Vec<String>,
    pub watch: Option<String>,
    /// `?view=projector`: large type, dark, high contrast.
    pub projector: bool,
}

fn params() -> Option<web_sys::UrlSearchParams> {
    let search = web_sys::window()?.location().search().ok()?;
    web_sys::UrlSearchParams::new_with_str(&search).ok()
}

pub fn read() -> Initial {
    let p = params();
    let get = |k: &str| p.as_ref().and_then(|p| p.get(k));
    let framework = get("framework").and_then(|f| Framework::from_id(&f));
    // The step is held to the lesson's length once its file is here.
    let lesson = get("lesson").and_then(|l| lesson_index(&l)).map(|i| {
        // `step=N` is the step the page shows as "step N of …".
        let step = get("step").and_then(|s| s.parse::<usize>().ok());
        (i, step.map_or(0, |s| s.saturating_sub(1)))
    });
    let hide = get("hide")
        .map(|h| h.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    Initial {
        engine: EngineChoice::from_param(get("engine").as_deref()),
        framework,
        lesson,
        hide,
        watch: get("watch"),
        projector: get("view").as_deref() == Some("projector"),
    }
}

/// The `lesson` the URL names when no lesson has that name.
pub fn unknown_lesson() -> Option<String> {
    let name = params()?.get("lesson")?;
    lesson_index(&name).is_none().then_some(name)
}

/// A lesson named by its slug (`01-del-vs-empty-cache`), its number as
/// the list shows it (`1`, `01`), or the slug without its number.
fn lesson_index(name: &str) -> Option<usize> {
    let by_number = name
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_sub(1))
        .filter(|&i| i < LESSONS.len());
    by_number.or_else(|| {
        LESSONS.iter().position(|x| {
            x.slug == name || x.slug.split_once('-').is_some_and(|(_, rest)| rest == name)
        })
    })
}

/// Writes the framework, the lesson step `(index, step)` and the hidden
/// groups into the URL.
pub fn save(
    framework: Option<Framework>,
    lesson: Option<(usize, usize)>,
    hidden: &[String],
    projector: bool,
) {
    let Some(window) = web_sys::window() else {
        return;
    };
    let mut q = Vec::new();
    if let Some(f) = framework {
        q.push(format!("framework={}", f.id()));
    }
    if let Some((index, step)) = lesson {
        q.push(format!("lesson={}", LESSONS[index].slug));
        q.push(format!("step={}", step + 1));
    }
    if !hidden.is_empty() {
        q.push(format!("hide={}", hidden.join(",")));
    }
    if projector {
        q.push("view=projector".into());
    }
    for kept in ["watch", "engine"] {
        if let Some(v) = params().and_then(|p| p.get(kept)) {
            q.push(format!("{kept}={v}"));
        }
    }
    let url = format!("?{}", q.join("&"));
    if let Ok(history) = window.history() {
        let _ = history.replace_state_with_url(&wasm_bindgen::JsValue::NULL, "", Some(&url));
    }
}

/// The link others open to watch this session live.
pub fn watch_link(watch_id: &str) -> String {
    let origin = web_sys::window()
        .and_then(|w| w.location().origin().ok())
        .unwrap_or_default();
    format!("{origin}/?watch={watch_id}")
}

/// Loads the page again with the engine `local` or `server`.
pub fn switch_engine(engine: &str) {
    let Some(location) = web_sys::window().map(|w| w.location()) else {
        return;
    };
    let p = params().or_else(|| web_sys::UrlSearchParams::new().ok());
    if let Some(p) = p {
        p.set("engine", engine);
        let _ = location.set_search(&String::from(p.to_string()));
    }
}
