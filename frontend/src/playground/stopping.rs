//! ❚❚ pause: play stops, the code cell's run stops where the session is
//! (`pyworker::interrupt`), and so does the command that runs. The server
//! stops it after its current step. The engine in the page cannot read a
//! stop while it runs a command, so the page ends that engine and starts
//! a new one, which replays the session's earlier lines (the engine is
//! deterministic: the same state comes back) and runs the stopped command
//! again up to the step the page had seen done; the session's lines keep it
//! as the steps it ran (`as_run`), so a later stop, or a move to the server,
//! replays it without stopping. Commands sent after it are sent again.

use crate::playground::socket;
use crate::playground::state::App;
use crate::playground::to_server;
use leptos::prelude::*;
use serde_json::json;
use vramlab_shared::command::parse_value;
use vramlab_shared::protocol::ClientMessage;

pub fn stop(app: App) {
    app.play.stop();
    crate::playground::pyworker::interrupt(app);
    if !socket::is_page() {
        socket::send(&ClientMessage::Stop {});
        return;
    }
    // Only a loop of steps reports progress; nothing else can be stopped.
    let Some((done, _)) = app.memory.progress.get_untracked() else {
        return;
    };
    let pending = app.pending_ids();
    // Commands run one at a time, in the order sent.
    let Some(&running) = pending.iter().min() else {
        return;
    };
    let (before, from) = to_server::split_at(running);
    let Some(((_, line), queued)) = from.split_first() else {
        return;
    };
    // At least one step runs, as on the server.
    let steps = done.max(1);
    let resume = json!({
        "lines": &before,
        "stopped": {"id": running, "line": line, "after_steps": steps},
    });
    to_server::stopped(running, steps);
    app.words.banner.set(Some(format!(
        "Stopping: the engine in this page starts again and replays this session's {} earlier commands…",
        before.len()
    )));
    crate::playground::conn::restart_page(app, &resume.to_string());
    for (id, line) in queued.iter().filter(|(id, _)| pending.contains(id)) {
        socket::send(&ClientMessage::Command {
            id: *id,
            command: Box::new(parse_value(line.clone())),
        });
    }
}
