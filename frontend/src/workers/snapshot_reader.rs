//! Your snapshot's reader, in a Web Worker that loads the snapshots wasm
//! (`bin/vramlab-snapshots.rs`, `reader_main`): the page sends it the
//! file the user chose; it reads it through `File.stream()` (a pickle in
//! two passes, a chunk at a time, so its bytes are never whole here
//! either), saying how far after each chunk, and sends the snapshot back
//! as one transferable buffer (`torch_snapshot::wire`). The page ends the
//! worker then, which gives back all the memory the reading took.
//!
//! Messages to the page: `{"read": bytes, "pass": "first" | "second" |
//! "whole"}` as it goes, then the buffer, or `{"error": why}`.

use serde_json::json;
use vramlab_shared::torch_snapshot::stream::PickleStream;
use vramlab_shared::torch_snapshot::{self, wire, MAX_FILE_BYTES};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{DedicatedWorkerGlobalScope, File, MessageEvent, ReadableStreamDefaultReader};

/// Bytes handed to the reader at a time (the stream's own chunks are
/// smaller), and how often the page hears how far.
const CHUNK: usize = 8 << 20;

fn scope() -> DedicatedWorkerGlobalScope {
    js_sys::global().unchecked_into()
}

fn say(message: serde_json::Value) {
    let _ = scope().post_message(&JsValue::from_str(&message.to_string()));
}

/// Reads the file of the first message (one that came while the wasm
/// loaded, or the next).
pub fn run(early: js_sys::Array) {
    if let Some(file) = early.iter().find_map(|v| v.dyn_into::<File>().ok()) {
        return start(file);
    }
    let on_message = Closure::<dyn FnMut(MessageEvent)>::new(|e: MessageEvent| {
        if let Ok(file) = e.data().dyn_into::<File>() {
            start(file);
        }
    });
    scope().set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
}

fn start(file: File) {
    wasm_bindgen_futures::spawn_local(async move {
        match read(&file).await {
            Ok(buffer) => {
                let array = js_sys::Uint8Array::from(buffer.as_slice());
                drop(buffer);
                let transfer = js_sys::Array::of1(&array.buffer());
                let sent = scope().post_message_with_transfer(&array.buffer(), &transfer);
                if sent.is_err() {
                    say(json!({"error": "the reader could not hand the snapshot to the page"}));
                }
            }
            Err(why) => say(json!({ "error": why })),
        }
    });
}

/// The snapshot in `file`, as the page's buffer.
async fn read(file: &File) -> Result<Vec<u8>, String> {
    let snapshot = match is_pickle(file).await {
        true => {
            let mut s = PickleStream::new(file.size() as usize).map_err(|e| e.to_string())?;
            each_chunk(file, "first", &mut |c, last| {
                s.scan(c, last).map_err(|e| e.to_string())
            })
            .await?;
            each_chunk(file, "second", &mut |c, last| {
                s.read(c, last).map_err(|e| e.to_string())
            })
            .await?;
            s.finish()
        }
        false => {
            if file.size() > MAX_FILE_BYTES as f64 {
                return Err(format!(
                    "{} is {} MB; files of up to {} MB are read",
                    file.name(),
                    (file.size() / 1e6).round(),
                    MAX_FILE_BYTES / 1_000_000
                ));
            }
            let mut whole = Vec::new();
            each_chunk(file, "whole", &mut |c, _| {
                whole.extend_from_slice(c);
                Ok(())
            })
            .await?;
            torch_snapshot::read(&whole)
        }
    };
    Ok(wire::encode(&snapshot.map_err(|e| e.to_string())?))
}

/// What takes each chunk of a file (with whether it is the last).
type EachChunk<'a> = dyn FnMut(&[u8], bool) -> Result<(), String> + 'a;

/// Hands `file` to `each` in chunks of [`CHUNK`] bytes (with whether it
/// is the last), read through its stream; says how far after each.
async fn each_chunk(file: &File, pass: &str, each: &mut EachChunk<'_>) -> Result<(), String> {
    let failed = |_| format!("the browser could not read {}", file.name());
    let total = file.size() as usize;
    let reader: ReadableStreamDefaultReader = file.stream().get_reader().unchecked_into();
    let (mut at, mut chunk) = (0, Vec::with_capacity(CHUNK.min(total)));
    loop {
        let next = JsFuture::from(reader.read()).await.map_err(failed)?;
        let done = js_sys::Reflect::get(&next, &"done".into())
            .map_err(failed)?
            .is_truthy();
        if !done {
            let value = js_sys::Reflect::get(&next, &"value".into()).map_err(failed)?;
            let bytes: js_sys::Uint8Array = value.unchecked_into();
            let start = chunk.len();
            chunk.resize(start + bytes.length() as usize, 0);
            bytes.copy_to(&mut chunk[start..]);
        }
        let last = done || at + chunk.len() >= total;
        if chunk.len() >= CHUNK || last {
            at += chunk.len();
            each(&chunk, last)?;
            chunk.clear();
            say(json!({ "read": at, "pass": pass }));
        }
        if last {
            let _ = reader.cancel();
            return Ok(());
        }
    }
}

/// Whether the file starts as a pickle does (else it is read as JSON, or
/// refused as neither).
async fn is_pickle(file: &File) -> bool {
    let Ok(head) = file.slice_with_f64_and_f64(0.0, 64.0) else {
        return false;
    };
    let Ok(buffer) = JsFuture::from(head.array_buffer()).await else {
        return false;
    };
    let bytes = js_sys::Uint8Array::new(&buffer).to_vec();
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&0x80)
}
