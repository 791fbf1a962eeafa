//! A snapshot file read in the page a chunk at a time, saying how far it
//! has got: a pickle in two passes ([`PickleStream`]: its bytes are never
//! whole in the page's memory), JSON whole; then read into a snapshot
//! after the page has said it is replaying.

use crate::clock::{after_paint, now_ms};
use crate::files::{self, each_chunk};
use leptos::prelude::*;
use vramlab_shared::torch_snapshot::stream::PickleStream;
use vramlab_shared::torch_snapshot::{self, MemorySnapshot, MAX_FILE_BYTES};
use wasm_bindgen_futures::JsFuture;

/// What is read: the file's name and size, and its snapshot or why not.
pub struct Done {
    pub name: String,
    pub bytes: usize,
    pub snapshot: Result<MemorySnapshot, String>,
    /// When the reading started (`clock::now_ms`).
    pub started: f64,
}

/// Reads `file`, saying how far in `progress`, then hands it to `then`.
pub fn read_snapshot(
    file: web_sys::File,
    progress: RwSignal<Option<String>>,
    then: impl FnOnce(Done) + 'static,
) {
    let started = now_ms();
    leptos::task::spawn_local(async move {
        let name = file.name();
        let total = file.size();
        let mb = |b: f64| format!("{:.0}", b / 1e6);
        let said = |pass: &'static str| {
            let name = name.clone();
            move |at: f64| {
                progress.set(Some(format!(
                    "Reading {name}{pass}: {} of {} MB",
                    mb(at),
                    mb(total)
                )))
            }
        };
        let read = match is_pickle(&file).await {
            true => (streamed(&file, &said(", first pass"), &said("")).await)
                .map(|s| Read::Pickle(Box::new(s))),
            false => (files::read(&file, MAX_FILE_BYTES, &said("")).await).map(Read::Whole),
        };
        let bytes = total as usize;
        match read {
            Ok(read) => {
                progress.set(Some(format!("Replaying {name} ({} MB)…", mb(total))));
                after_paint(move || {
                    then(Done {
                        name,
                        bytes,
                        snapshot: read.snapshot(),
                        started,
                    });
                    progress.set(None);
                });
            }
            Err(why) => {
                progress.set(None);
                then(Done {
                    name,
                    bytes,
                    snapshot: Err(why),
                    started,
                });
            }
        }
    });
}

/// A file read, its snapshot not yet made (that is the part the page says
/// it is replaying for).
enum Read {
    Pickle(Box<PickleStream>),
    Whole(Vec<u8>),
}

impl Read {
    fn snapshot(self) -> Result<MemorySnapshot, String> {
        match self {
            Read::Pickle(s) => s.finish(),
            Read::Whole(bytes) => torch_snapshot::read(&bytes),
        }
        .map_err(|e| e.0)
    }
}

/// Both passes over a pickle, a chunk at a time.
async fn streamed(
    file: &web_sys::File,
    first: &dyn Fn(f64),
    second: &dyn Fn(f64),
) -> Result<PickleStream, String> {
    let mut s = PickleStream::new(file.size() as usize).map_err(|e| e.0)?;
    each_chunk(file, first, &mut |c, last| s.scan(c, last).map_err(|e| e.0)).await?;
    each_chunk(file, second, &mut |c, last| {
        s.read(c, last).map_err(|e| e.0)
    })
    .await?;
    Ok(s)
}

/// Whether the file starts as a pickle does (else it is read as JSON, or
/// refused as neither).
async fn is_pickle(file: &web_sys::File) -> bool {
    let Ok(head) = file.slice_with_f64_and_f64(0.0, 64.0) else {
        return false;
    };
    let Ok(buffer) = JsFuture::from(head.array_buffer()).await else {
        return false;
    };
    let bytes = js_sys::Uint8Array::new(&buffer).to_vec();
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&0x80)
}
