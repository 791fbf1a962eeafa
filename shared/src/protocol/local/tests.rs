use super::*;
use crate::protocol::session::event_batch;
use crate::protocol::StepRecord;
use crate::protocol::LIVE_EVENT_BATCH;
use crate::snapshot::apply;
use crate::snapshot::Event;
use std::cell::{Cell, RefCell};

thread_local! {
    static POSTED: RefCell<Vec<ServerMessage>> = const { RefCell::new(Vec::new()) };
    static CLOCK: Cell<f64> = const { Cell::new(0.0) };
}

fn post(msg: &ServerMessage) {
    POSTED.with(|p| p.borrow_mut().push(msg.clone()));
}

/// A clock that moves 20 ms each time it is read.
fn now_ms() -> f64 {
    CLOCK.with(|c| {
        c.set(c.get() + 20.0);
        c.get()
    })
}

fn taken() -> Vec<ServerMessage> {
    POSTED.with(|p| std::mem::take(&mut *p.borrow_mut()))
}

/// A session, with what it said on starting already taken.
fn start() -> LocalSession {
    started().0
}

fn started() -> (LocalSession, Vec<ServerMessage>) {
    taken();
    let session = LocalSession::start(Outlet { post, now_ms });
    (session, taken())
}

fn command(id: u64, line: &str) -> String {
    format!(r#"{{"type":"command","id":{id},"command":{line}}}"#)
}

fn results(messages: &[ServerMessage]) -> Vec<StepRecord> {
    messages
        .iter()
        .filter_map(|m| match m {
            ServerMessage::Result { record, .. } => Some((**record).clone()),
            _ => None,
        })
        .collect()
}

const TRAINING: [&str; 4] = [
    r#"{"cmd":"model","name":"model","layers":2,"width":128}"#,
    r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}"#,
    r#"{"cmd":"data","name":"data"}"#,
    r#"{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":6,"batch_size":32}"#,
];

#[test]
fn it_says_hello_as_the_owner_then_sends_everything() {
    let (session, sent) = started();
    let [ServerMessage::Hello(hello), ServerMessage::Snapshot { snapshot }] = &sent[..] else {
        panic!("expected hello and snapshot, got {sent:?}");
    };
    assert_eq!(hello.role, Role::Owner);
    assert_eq!(
        (hello.session_id.as_str(), hello.backend.as_str()),
        (SESSION_ID, BACKEND)
    );
    assert_eq!(hello.watch_id, None);
    assert_eq!(hello.settings, *session.engine().settings());
    assert_eq!(snapshot.stats, session.engine().stats());
}

#[test]
fn results_are_those_of_vramlab_run_for_the_same_lines() {
    let mut session = start();
    let lines = [
        r#"{"cmd":"alloc","name":"x","bytes":268435456}"#,
        r#"{"cmd":"alloc","name":"y","bytes":100}"#,
        r#"{"cmd":"del","name":"x"}"#,
        r#"{"cmd":"empty_cache"}"#,
        r#"{"cmd":"nonsense"}"#,
    ];
    for (id, line) in lines.iter().enumerate() {
        session.handle(&command(id as u64, line));
    }
    let mut plain = Engine::new_simulated();
    let expected: Vec<StepRecord> = lines.iter().map(|l| plain.run_line(l)).collect();
    assert_eq!(results(&taken()), expected);
}

#[test]
fn deltas_rebuild_the_engines_snapshot_with_the_exact_peaks() {
    let (mut session, mut sent) = started();
    let ServerMessage::Snapshot { snapshot } = sent.pop().unwrap() else {
        panic!("no snapshot");
    };
    let mut page = *snapshot;
    let mut peak = 0;
    for (id, line) in TRAINING.iter().enumerate() {
        session.handle(&command(id as u64, line));
    }
    session.handle(&command(9, r#"{"cmd":"del","name":"model"}"#));
    let mut progress = Vec::new();
    for msg in taken() {
        match msg {
            ServerMessage::Delta(d) => {
                peak = peak.max(d.peak_allocated_bytes);
                apply(&mut page, &d);
            }
            ServerMessage::Progress {
                done, total, loss, ..
            } => {
                assert!(loss.is_some(), "a small MLP computes its loss");
                progress.push((done, total));
            }
            _ => {}
        }
    }
    let engine = session.engine().snapshot(0);
    assert_eq!(
        (page.segments, page.objects),
        (engine.segments, engine.objects)
    );
    assert_eq!(page.stats, engine.stats);
    // The training step's peak happened between updates; the deltas carry it.
    assert_eq!(peak, engine.stats.peak_allocated_bytes);
    assert!(
        engine.stats.allocated_bytes < peak,
        "{} vs {peak}",
        engine.stats.allocated_bytes
    );
    // The clock moves 20 ms a read: a step every other read is due.
    assert_eq!(progress.last(), Some(&(6, 6)));
    assert!(progress.len() >= 3, "{progress:?}");
}

#[test]
fn events_arrive_once_each_in_order_or_are_counted() {
    let mut session = start();
    for (id, line) in TRAINING.iter().enumerate() {
        session.handle(&command(id as u64, line));
    }
    let (mut seqs, mut dropped) = (Vec::new(), 0);
    for msg in taken() {
        if let ServerMessage::Events { events, dropped: d } = msg {
            seqs.extend(events.iter().map(|e| e.seq));
            dropped += d;
        }
    }
    let all: Vec<u64> = session.engine().events_since(0).map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(seqs.len() as u64 + dropped, all.len() as u64);
    assert_eq!(seqs.last(), all.last());
}

#[test]
fn a_long_batch_of_events_sends_the_latest_and_counts_the_rest() {
    let mut engine = Engine::new_simulated();
    for i in 0..150 {
        engine.run_line(&format!(r#"{{"cmd":"alloc","name":"t{i}","bytes":1024}}"#));
    }
    let all: Vec<&Event> = engine.events_since(0).collect();
    let (events, dropped) = event_batch(engine.events_since(0), 0);
    assert_eq!(events.len(), LIVE_EVENT_BATCH);
    assert_eq!(dropped as usize, all.len() - LIVE_EVENT_BATCH);
    assert_eq!(events.last().map(|e| e.seq), all.last().map(|e| e.seq));
    // Events the log no longer holds count as dropped too.
    let (events, dropped) = event_batch(engine.events_since(0).skip(all.len() - 3), 0);
    assert_eq!((events.len(), dropped as usize), (3, all.len() - 3));
}

#[test]
fn unsubscribed_it_sends_only_results() {
    let mut session = start();
    session.handle(r#"{"type":"unsubscribe"}"#);
    session.handle(&command(1, r#"{"cmd":"alloc","name":"x","bytes":1024}"#));
    let sent = taken();
    assert!(
        matches!(&sent[..], [ServerMessage::Result { id: 1, .. }]),
        "{sent:?}"
    );
}

#[test]
fn ping_snapshot_export_and_bad_messages_are_answered() {
    let mut session = start();
    session.handle(&command(1, r#"{"cmd":"alloc","name":"x","bytes":1048576}"#));
    let results = results(&taken());
    assert!(results[0].ok, "{results:?}");
    session.handle(r#"{"type":"ping","nonce":7}"#);
    session.handle(r#"{"type":"snapshot"}"#);
    session.handle(r#"{"type":"export_snapshot"}"#);
    session.handle(r#"{"type":"stop"}"#);
    session.handle("{not json");
    let sent = taken();
    let [ServerMessage::Pong { nonce: 7 }, ServerMessage::Snapshot { snapshot }, ServerMessage::MemorySnapshot { snapshot: exported }, ServerMessage::Error { id: None, error }] =
        &sent[..]
    else {
        panic!("unexpected answers: {sent:?}");
    };
    assert_eq!(snapshot.stats.allocated_bytes, 1048576);
    assert_eq!(exported.segments.len(), snapshot.segments.len());
    assert_eq!(error.kind, crate::protocol::ConnectionErrorKind::BadMessage);
}

/// A page stops a running command by starting its engine again: the lines
/// before it replay silently, and the command runs to where it stopped,
/// with the same state as an engine that stopped it there.
#[test]
fn a_resumed_session_replays_and_stops_where_the_page_stopped() {
    let lines: Vec<CommandLine> = TRAINING
        .iter()
        .map(|l| crate::command::parse_value(serde_json::from_str(l).unwrap()))
        .collect();
    let (before, train) = lines.split_at(3);
    taken();
    let session = LocalSession::resume(
        Outlet { post, now_ms },
        before,
        Some(Stopped {
            id: 9,
            line: train[0].clone(),
            after_steps: 2,
        }),
    );
    let said = taken();
    let ServerMessage::Hello(hello) = &said[0] else {
        panic!("{:?}", said[0]);
    };
    assert!(hello.resumed);
    assert!(matches!(said[1], ServerMessage::Snapshot { .. }));
    let results = results(&said);
    assert_eq!(results.len(), 1, "only the stopped command answers");
    let record = &results[0];
    assert_eq!(record.value.as_ref().unwrap()["stopped"], true);
    assert!(
        record
            .note
            .as_deref()
            .unwrap()
            .starts_with("Stopped after 2 of 6 steps."),
        "{:?}",
        record.note
    );

    // The same as an engine that ran the lines and stopped after step 2.
    let mut engine = Engine::new_simulated();
    for l in before {
        engine.run_parsed(l);
    }
    engine.set_progress_hook(Some(Box::new(|_: &mut Engine, p: &Progress| p.done < 2)));
    let expected = engine.run_parsed(&train[0]);
    assert_eq!(*record, expected);
    assert_eq!(session.engine().snapshot(0), engine.snapshot(0));
}

/// Replaying a session that stopped a loop runs the steps it ran: the same
/// state as the stopped loop.
#[test]
fn a_stopped_loop_replays_as_the_steps_it_ran() {
    let mut lines: Vec<serde_json::Value> = TRAINING
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let parsed: Vec<CommandLine> = lines
        .iter()
        .cloned()
        .map(crate::command::parse_value)
        .collect();
    taken();
    let stopped = LocalSession::resume(
        Outlet { post, now_ms },
        &parsed[..3],
        Some(Stopped {
            id: 1,
            line: parsed[3].clone(),
            after_steps: 4,
        }),
    );
    as_run(&mut lines[3], 4);
    assert_eq!(lines[3]["steps"], 4);
    let mut replayed = Engine::new_simulated();
    for line in &lines {
        assert!(replayed.run_line(&line.to_string()).ok);
    }
    assert_eq!(stopped.engine().snapshot(0), replayed.snapshot(0));
    let mut other = serde_json::json!({"cmd": "gc"});
    as_run(&mut other, 4);
    assert_eq!(other, serde_json::json!({"cmd": "gc"}));
}
