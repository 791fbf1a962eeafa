//! Files in the browser: the one the user opened or dropped (read by
//! `reading`), fetching one from beside the page, and offering bytes as a
//! download. Nothing is uploaded anywhere.

use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

/// The text at `url` (relative to the page), when it answers 200.
pub async fn fetch_text(url: &str) -> Option<String> {
    let response = JsFuture::from(web_sys::window()?.fetch_with_str(url))
        .await
        .ok()?;
    let response: web_sys::Response = response.dyn_into().ok()?;
    if !response.ok() {
        return None;
    }
    JsFuture::from(response.text().ok()?)
        .await
        .ok()?
        .as_string()
}

/// The first file of a file input's change event or of a drop.
pub fn first(files: Option<web_sys::FileList>) -> Option<web_sys::File> {
    files?.get(0)
}

/// The files of an `<input type=file>`'s change event.
pub fn of_input(e: &web_sys::Event) -> Option<web_sys::FileList> {
    e.target()?
        .dyn_into::<web_sys::HtmlInputElement>()
        .ok()?
        .files()
}

/// The bytes at `url` (a `blob:` URL another page of this site made, or a
/// file beside the page).
pub async fn fetch_bytes(url: &str) -> Result<Vec<u8>, String> {
    let failed = |_| format!("the browser could not fetch {url}");
    let window = web_sys::window().ok_or("no window to fetch from")?;
    let response = JsFuture::from(window.fetch_with_str(url))
        .await
        .map_err(failed)?;
    let response: web_sys::Response = response.dyn_into().map_err(failed)?;
    if !response.ok() {
        return Err(format!("{url} answered {}", response.status()));
    }
    let buffer = JsFuture::from(response.array_buffer().map_err(failed)?)
        .await
        .map_err(failed)?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
}

/// `bytes` as a `blob:` URL of this page (alive while the page is).
pub fn blob_url(bytes: &[u8], mime: &str) -> Result<String, String> {
    let failed = |_| "the browser could not hold the file".to_string();
    let parts = js_sys::Array::of1(&js_sys::Uint8Array::from(bytes));
    let options = web_sys::BlobPropertyBag::new();
    options.set_type(mime);
    let blob =
        web_sys::Blob::new_with_u8_array_sequence_and_options(&parts, &options).map_err(failed)?;
    web_sys::Url::create_object_url_with_blob(&blob).map_err(failed)
}

/// Offers `bytes` as a download named `name`.
pub fn download(name: &str, bytes: &[u8], mime: &str) -> Result<(), String> {
    let failed = |_| format!("the browser could not save {name}");
    let url = blob_url(bytes, mime)?;
    let document = web_sys::window()
        .and_then(|w| w.document())
        .ok_or_else(|| format!("no document to save {name} from"))?;
    let link: web_sys::HtmlAnchorElement = document
        .create_element("a")
        .map_err(failed)?
        .unchecked_into();
    link.set_href(&url);
    link.set_download(name);
    link.click();
    // The download starts after this returns: the URL lives a while.
    leptos::prelude::set_timeout(
        move || _ = web_sys::Url::revoke_object_url(&url),
        std::time::Duration::from_secs(60),
    );
    Ok(())
}
