//! A session's thread: it owns the engine, runs the queued commands in
//! order, and publishes what the engine holds while a command runs and
//! after each one.

use super::updates::Change;
use super::{shutting_down, wire, Job, Session, EVENT_HISTORY, PEAK_HISTORY};
use crate::metrics::Metrics;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Instant;
use vramlab_shared::command::Command;
use vramlab_shared::engine::Progress;
use vramlab_shared::protocol::ServerMessage;
use vramlab_shared::Engine;

/// Publishes what the engine holds now, and what changed since the last
/// publication encoded once for every connection that follows it
/// (here, on the session's thread, not on the connections' runtime).
fn publish(session: &Session, engine: &mut Engine, progress: Option<(u64, Progress)>) {
    let snapshot = Arc::new(engine.snapshot(0));
    let peaks = engine.take_sample_peaks();
    let (old, since, followed) = {
        let state = session.state();
        let since = state.live.events.back().map_or(0, |e| e.seq + 1);
        (
            state.live.snapshot.clone(),
            since,
            !state.clients.is_empty(),
        )
    };
    let fresh: Vec<_> = engine.events_since(since).cloned().collect();
    let update = followed.then(|| {
        let change = Change {
            old: &old,
            new: &snapshot,
            peaks,
            events: &fresh,
            first_event: since,
            progress: progress.as_ref(),
        };
        change.encode()
    });
    let mut state = session.state();
    let live = &mut state.live;
    live.events.extend(fresh);
    while live.events.len() > EVENT_HISTORY {
        live.events.pop_front();
    }
    live.version += 1;
    let version = live.version;
    live.peaks.push_back((version, peaks.0, peaks.1));
    while live.peaks.len() > PEAK_HISTORY {
        live.peaks.pop_front();
    }
    live.snapshot = snapshot;
    live.progress = progress;
    live.updates.record(version, update);
    drop(state);
    session.live_tx.send_replace(version);
}

/// The session's thread: runs commands in order until the session ends.
pub(super) fn run_engine(session: Arc<Session>, mut engine: Engine, jobs: mpsc::Receiver<Job>) {
    let interval = session.config.snapshot_interval;
    let mut published = Instant::now();
    while let Ok(job) = jobs.recv() {
        let Job { id, line } = job;
        if session.stop.load(Ordering::SeqCst) && session.state().jobs.is_none() {
            // The session is ending: a command still queued is answered,
            // not run (the channel closes once they are all taken).
            let error = shutting_down();
            session.broadcast(
                wire(&ServerMessage::Error {
                    id: Some(id),
                    error,
                }),
                true,
            );
            session.state().queued -= 1;
            continue;
        }
        session.stop.store(false, Ordering::SeqCst);
        let started = Instant::now();
        let hook_session = session.clone();
        let mut last = Instant::now();
        engine.set_progress_hook(Some(Box::new(move |e: &mut Engine, p: &Progress| {
            if last.elapsed() >= interval || p.done == p.total {
                publish(&hook_session, e, Some((id, p.clone())));
                last = Instant::now();
            }
            !hook_session.stop.load(Ordering::SeqCst)
        })));
        let name = line.command.as_ref().map_or("?", Command::name);
        let record = engine.run_parsed(&line);
        engine.set_progress_hook(None);
        Metrics::inc(&session.metrics.commands);
        if !record.ok {
            Metrics::inc(&session.metrics.command_errors);
        }
        tracing::info!(
            session = %&session.id[..8],
            cmd = %name,
            ok = record.ok,
            duration_us = started.elapsed().as_micros() as u64,
            "command"
        );
        if let (Some(settings), Some(device)) = (&record.settings, &record.device) {
            session.state().hello = (settings.clone(), device.clone());
        }
        // After each command, unless more are queued behind it (a batch
        // the code cell sent): then at most every snapshot interval, as
        // while a command runs, and always after the batch's last. What a
        // command's numbers are goes with its result.
        let more = session.state().queued > 1;
        if !more || published.elapsed() >= interval {
            publish(&session, &mut engine, None);
            published = Instant::now();
        }
        session.broadcast(
            wire(&ServerMessage::Result {
                id,
                record: Box::new(record),
            }),
            true,
        );
        session.state().queued -= 1;
    }
    tracing::info!(session = %&session.id[..8], "session ended; its memory is released");
}
