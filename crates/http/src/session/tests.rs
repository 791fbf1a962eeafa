//! Sessions under concurrency.

use super::*;
use std::sync::Condvar;
use vramlab_shared::engine::SimDeviceFactory;

/// (a session's device is starting, it may go on), and its signal.
static GATE: (Mutex<(bool, bool)>, Condvar) = (Mutex::new((false, false)), Condvar::new());

fn wait_for(test: impl Fn(&(bool, bool)) -> bool) {
    let (lock, signal) = &GATE;
    let mut state = lock.lock().unwrap();
    while !test(&state) {
        state = signal.wait(state).unwrap();
    }
}

fn set(change: impl Fn(&mut (bool, bool))) {
    let (lock, signal) = &GATE;
    change(&mut lock.lock().unwrap());
    signal.notify_all();
}

/// A simulated device that starts only when the test lets it.
struct Gated;

impl DeviceFactory for Gated {
    fn start(&mut self, settings: &Settings) -> Result<Box<dyn Device>, CommandError> {
        set(|s| s.0 = true);
        wait_for(|s| s.1);
        SimDeviceFactory.start(settings)
    }
}

fn gated(_ordinal: usize) -> Box<dyn DeviceFactory> {
    Box::new(Gated)
}

#[test]
fn the_session_map_stays_free_while_a_session_starts() {
    let config = SessionConfig {
        ttl: Duration::from_secs(60),
        snapshot_interval: Duration::from_millis(33),
        max_queue: 8,
        max_sessions: 4,
        max_per_client: 0,
        max_watchers: 100,
        quota: None,
        limits: crate::http::ServeOptions::default().limits,
        instance: None,
    };
    let sessions = Arc::new(Sessions::new(
        Backend::simulated_with(gated),
        config,
        Arc::new(Metrics::default()),
    ));
    let creating = sessions.clone();
    let starting = std::thread::spawn(move || creating.create());
    wait_for(|s| s.0);
    // The device is starting (a CUDA context, on a GPU): other
    // connections can still find, list and create sessions.
    assert!(sessions.map.try_lock().is_ok());
    set(|s| s.1 = true);
    let session = starting.join().unwrap().expect("a session");
    assert!(sessions.get(&session.id).is_some());
    session.shut_down();
}

fn sim_sessions() -> Arc<Sessions> {
    sim_sessions_with_ttl(Duration::from_secs(60))
}

fn sim_sessions_with_ttl(ttl: Duration) -> Arc<Sessions> {
    let config = SessionConfig {
        ttl,
        snapshot_interval: Duration::from_millis(33),
        max_queue: 8,
        max_sessions: 4,
        max_per_client: 2,
        max_watchers: 100,
        quota: None,
        limits: crate::http::ServeOptions::default().limits,
        instance: None,
    };
    let backend = vramlab_backend::select(vramlab_backend::DeviceChoice::Sim, 0).unwrap();
    Arc::new(Sessions::new(backend, config, Arc::new(Metrics::default())))
}

/// A connection that never reads: its outbox fills to its bound, then the
/// client is dropped (its channel closes) instead of the server holding
/// every later message for it. What waits for an absent owner is bounded too.
#[test]
fn a_client_that_does_not_read_is_dropped_at_its_outbox_bound() {
    let sessions = sim_sessions();
    let session = sessions.create().unwrap();
    let mut stuck = session.attach(Role::Watcher, None);
    let msg: Wire = Arc::from("{}");
    for _ in 0..=OUTBOX_MESSAGES {
        session.broadcast(msg.clone(), false);
    }
    assert!(session.state().clients.is_empty());
    let mut waiting = 0;
    while stuck.outbox.try_recv().is_ok() {
        waiting += 1;
    }
    assert_eq!(waiting, OUTBOX_MESSAGES);
    for _ in 0..2 * OUTBOX_MESSAGES {
        session.broadcast(msg.clone(), true);
    }
    assert_eq!(session.state().pending.len(), OUTBOX_MESSAGES);
    session.shut_down();
}

/// Connect-and-drop: a session that never ran a command goes after 30 s
/// without its owner, not after the whole TTL (60 s here); a used one stays
/// for the TTL.
#[test]
fn an_unused_session_goes_sooner_than_a_used_one() {
    let sessions = sim_sessions();
    let idle = sessions.create().unwrap();
    let used = sessions.create().unwrap();
    let line = Box::new(vramlab_shared::command::parse_line(r#"{"cmd":"gc"}"#));
    used.submit(1, line).unwrap();
    let now = Instant::now();
    let later = |s: u64| now + Duration::from_secs(s);
    assert!(!idle.expired(later(29)));
    assert!(idle.expired(later(31)));
    assert!(!used.expired(later(31)));
    assert!(used.expired(later(61)));
    idle.shut_down();
    used.shut_down();
}

/// One address may hold `max_per_client` sessions (2 here); others, and
/// loopback clients (a local proxy speaks for everyone), are not held back.
#[test]
fn one_client_address_holds_a_bounded_number_of_sessions() {
    let sessions = sim_sessions();
    let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
    let mut made = Vec::new();
    for _ in 0..2 {
        made.push(sessions.create_for(ip("203.0.113.7")).unwrap());
    }
    let refused = sessions.create_for(ip("203.0.113.7")).unwrap_err();
    assert_eq!(refused.kind, ConnectionErrorKind::SessionLimit);
    assert!(
        refused.message.contains("already holds 2 sessions"),
        "{}",
        refused.message
    );
    made.push(sessions.create_for(ip("198.51.100.1")).unwrap());
    made.push(sessions.create_for(ip("127.0.0.1")).unwrap());
    // An IPv6 /64 is one client, whichever of its addresses it uses.
    let sessions = sim_sessions();
    made.push(sessions.create_for(ip("2001:db8:5:6::1")).unwrap());
    made.push(sessions.create_for(ip("2001:db8:5:6::2")).unwrap());
    let refused = sessions.create_for(ip("2001:db8:5:6:abcd::9")).unwrap_err();
    assert!(refused.message.contains("already holds 2 sessions"));
    made.push(sessions.create_for(ip("2001:db8:5:7::1")).unwrap());
    for s in made {
        s.shut_down();
    }
}

/// A full server makes room: a session left without any connection for
/// long enough ends for a new one; sessions with a connection are never
/// taken, and with all of them connected the server says it is full.
#[test]
fn a_full_server_ends_a_session_no_one_is_connected_to() {
    let sessions = sim_sessions_with_ttl(Duration::from_millis(200));
    let made: Vec<_> = (1..=4)
        .map(|i| {
            sessions
                .create_for(Some(format!("192.0.2.{i}").parse().unwrap()))
                .unwrap()
        })
        .collect();
    let attached: Vec<_> = (made.iter())
        .filter(|s| !std::ptr::eq(*s, &made[2]))
        .map(|s| s.attach(Role::Owner, None))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let new = sessions
        .create_for(Some("198.51.100.9".parse().unwrap()))
        .unwrap();
    assert!(
        sessions.get(&made[2].id).is_none(),
        "the one left alone ended"
    );
    assert!(made
        .iter()
        .enumerate()
        .all(|(i, s)| i == 2 || sessions.get(&s.id).is_some()));
    let _new_attached = new.attach(Role::Owner, None);
    std::thread::sleep(Duration::from_millis(300));
    let full = sessions
        .create_for(Some("198.51.100.10".parse().unwrap()))
        .unwrap_err();
    assert_eq!(full.kind, ConnectionErrorKind::SessionLimit);
    drop(attached);
    sessions.shut_down_all();
}

/// A user who opens many connections at once gets `max_per_client`
/// sessions (2 here), not one per connection: the limit is checked again
/// where a session is inserted, after its slow start outside the lock.
#[test]
fn sessions_started_at_once_keep_to_the_per_user_limit() {
    let sessions = sim_sessions();
    let started: Vec<_> = std::thread::scope(|s| {
        let tries: Vec<_> = (0..6)
            .map(|_| s.spawn(|| sessions.create_as(None, Some("alice".into()))))
            .collect();
        tries.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let made: Vec<_> = started.into_iter().filter_map(Result::ok).collect();
    assert_eq!(made.len(), 2);
    assert_eq!(sessions.len(), 2);
    for s in made {
        s.shut_down();
    }
}

/// A result handed to an owner's connection that closed before writing it
/// (a stalled client, dropped) waits for the owner's next connection.
#[test]
fn results_a_closed_connection_never_wrote_wait_for_the_owner() {
    let sessions = sim_sessions();
    let session = sessions.create().unwrap();
    let mut first = session.attach(Role::Owner, None);
    let (a, b): (Wire, Wire) = (Arc::from("{\"n\":1}"), Arc::from("{\"n\":2}"));
    session.broadcast(a.clone(), true);
    session.broadcast(b.clone(), true);
    // The connection wrote neither: the first failed, the second waited.
    let written = first.outbox.try_recv().unwrap();
    let mut unsent = vec![written];
    while let Ok(msg) = first.outbox.try_recv() {
        unsent.push(msg);
    }
    session.detach(first.client, Role::Owner, unsent);
    let mut again = session.attach(Role::Owner, None);
    assert_eq!(again.outbox.try_recv().unwrap(), a);
    assert_eq!(again.outbox.try_recv().unwrap(), b);
    session.shut_down();
}
