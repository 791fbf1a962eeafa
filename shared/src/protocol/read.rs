//! Reading a message, `{"type": ..., ...}`, by its tag: a server message
//! (the page reads one for every change it shows) and a client message (the
//! server and the page's engine read them). By hand: serde's internally
//! tagged enums first buffer every message into a tree of their own.

use super::{ClientMessage, CommandLine, Hello, ServerMessage, StepRecord};
use crate::fields::Fields;
use crate::torch_snapshot;
use serde::de::{Deserializer, Error as _};
use serde::Deserialize;
use serde_json::{Error, Map};

impl<'de> Deserialize<'de> for ServerMessage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut fields = Fields::new(Map::deserialize(d)?);
        let kind: String = fields.take("type").map_err(D::Error::custom)?;
        ServerMessage::read_fields(fields, &kind).map_err(D::Error::custom)
    }
}

impl<'de> Deserialize<'de> for ClientMessage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut fields = Fields::new(Map::deserialize(d)?);
        let kind: String = fields.take("type").map_err(D::Error::custom)?;
        ClientMessage::read_fields(fields, &kind).map_err(D::Error::custom)
    }
}

// ----- client messages: each reads its fields and refuses any other ------

/// `f` had no field but `names` (each read already).
fn only<T>(f: Fields, names: &'static [&'static str], message: T) -> Result<T, Error> {
    f.done(names)?;
    Ok(message)
}

pub(super) fn command(mut f: Fields) -> Result<ClientMessage, Error> {
    let id = f.take("id")?;
    let command = f.take("command")?;
    only(
        f,
        &["id", "command"],
        ClientMessage::Command { id, command },
    )
}

pub(super) fn commands(mut f: Fields) -> Result<ClientMessage, Error> {
    let first_id: u64 = f.take("first_id")?;
    let commands: Vec<CommandLine> = f.take("commands")?;
    if commands.is_empty() || commands.len() > super::MAX_BATCH {
        return Err(Error::custom(format!(
            "a `commands` message holds 1 to {} commands, not {}",
            super::MAX_BATCH,
            commands.len()
        )));
    }
    if first_id.checked_add(commands.len() as u64 - 1).is_none() {
        return Err(Error::custom(format!(
            "a `commands` message of {} commands from id {first_id} runs past the largest id (2^64 - 1): number them lower",
            commands.len()
        )));
    }
    let message = ClientMessage::Commands { first_id, commands };
    only(f, &["first_id", "commands"], message)
}

pub(super) fn subscribe(f: Fields) -> Result<ClientMessage, Error> {
    only(f, &[], ClientMessage::Subscribe {})
}

pub(super) fn unsubscribe(f: Fields) -> Result<ClientMessage, Error> {
    only(f, &[], ClientMessage::Unsubscribe {})
}

pub(super) fn snapshot_request(f: Fields) -> Result<ClientMessage, Error> {
    only(f, &[], ClientMessage::Snapshot {})
}

pub(super) fn export_snapshot(f: Fields) -> Result<ClientMessage, Error> {
    only(f, &[], ClientMessage::ExportSnapshot {})
}

pub(super) fn stop(f: Fields) -> Result<ClientMessage, Error> {
    only(f, &[], ClientMessage::Stop {})
}

pub(super) fn ping(mut f: Fields) -> Result<ClientMessage, Error> {
    let nonce: Option<u64> = f.take("nonce")?;
    let nonce = nonce.unwrap_or(0);
    only(f, &["nonce"], ClientMessage::Ping { nonce })
}

pub(super) fn presenter_view(mut f: Fields) -> Result<ClientMessage, Error> {
    let view = f.take("view")?;
    only(f, &["view"], ClientMessage::Presenter { view })
}

/// Every result's record, read by hand as the hello is (fields not named
/// here are ignored; the optional ones may be missing).
impl<'de> Deserialize<'de> for StepRecord {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::fields::read(d, record)
    }
}

fn record(f: &mut Fields) -> Result<StepRecord, Error> {
    Ok(StepRecord {
        step: f.take("step")?,
        cmd: f.take("cmd")?,
        ok: f.take("ok")?,
        error: f.take("error")?,
        note: f.take("note")?,
        value: f.take("value")?,
        settings: f.take("settings")?,
        device: f.take("device")?,
        stats: f.take("stats")?,
    })
}

// ----- server messages: fields not named are ignored ---------------------

/// A hello's fields (read by hand: a derived reader for a struct of
/// twelve costs the page kilobytes).
pub(super) fn hello(mut f: Fields) -> Result<ServerMessage, Error> {
    Ok(ServerMessage::Hello(Box::new(Hello {
        protocol_version: f.take("protocol_version")?,
        session_id: f.take("session_id")?,
        watch_id: f.take("watch_id")?,
        role: f.take("role")?,
        resumed: f.take("resumed")?,
        backend: f.take("backend")?,
        device: f.take("device")?,
        framework: f.take("framework")?,
        settings: f.take("settings")?,
        limits: f.take("limits")?,
        user: f.take("user")?,
        owner: f.take("owner")?,
    })))
}

pub(super) fn result(mut f: Fields) -> Result<ServerMessage, Error> {
    Ok(ServerMessage::Result {
        id: f.take("id")?,
        record: f.rest()?,
    })
}

pub(super) fn progress(mut f: Fields) -> Result<ServerMessage, Error> {
    Ok(ServerMessage::Progress {
        id: f.take("id")?,
        done: f.take("done")?,
        total: f.take("total")?,
        loss: f.take("loss")?,
    })
}

pub(super) fn snapshot(mut f: Fields) -> Result<ServerMessage, Error> {
    let snapshot = f.take("snapshot")?;
    Ok(ServerMessage::Snapshot { snapshot })
}

pub(super) fn watchers(mut f: Fields) -> Result<ServerMessage, Error> {
    let watchers = f.take("watchers")?;
    Ok(ServerMessage::Watchers { watchers })
}

pub(super) fn memory_snapshot(mut f: Fields) -> Result<ServerMessage, Error> {
    let snapshot = torch_snapshot::from_json(f.take("snapshot")?).map_err(Error::custom)?;
    Ok(ServerMessage::MemorySnapshot {
        snapshot: Box::new(snapshot),
    })
}

pub(super) fn delta(f: Fields) -> Result<ServerMessage, Error> {
    Ok(ServerMessage::Delta(f.rest()?))
}

pub(super) fn presenter(mut f: Fields) -> Result<ServerMessage, Error> {
    let view = f.take("view")?;
    Ok(ServerMessage::Presenter { view })
}

pub(super) fn events(mut f: Fields) -> Result<ServerMessage, Error> {
    Ok(ServerMessage::Events {
        events: f.take("events")?,
        dropped: f.take("dropped")?,
    })
}

pub(super) fn error(mut f: Fields) -> Result<ServerMessage, Error> {
    Ok(ServerMessage::Error {
        id: f.take("id")?,
        error: f.take("error")?,
    })
}

pub(super) fn pong(mut f: Fields) -> Result<ServerMessage, Error> {
    let nonce = f.take("nonce")?;
    Ok(ServerMessage::Pong { nonce })
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use crate::snapshot::delta;
    use crate::torch_snapshot::export;

    /// One message of every type, as a session sends them.
    fn messages() -> Vec<ServerMessage> {
        let mut engine = Engine::new_simulated();
        let before = engine.snapshot(100);
        let record = engine.run_line(r#"{"cmd":"alloc","name":"x","bytes":1048576}"#);
        let after = engine.snapshot(100);
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            session_id: "s".into(),
            watch_id: Some("w".into()),
            role: Role::Owner,
            resumed: false,
            backend: "sim".into(),
            device: engine.device_info(),
            framework: Framework::Pytorch,
            settings: engine.settings().clone(),
            limits: Limits {
                max_message_bytes: 65536,
                commands_per_second: 50,
                snapshot_interval_ms: 100,
                session_ttl_seconds: 600,
                session_quota_bytes: None,
            },
            user: None,
            owner: Some("ada".into()),
        };
        let view = PresenterView {
            lesson: Some((1, 2, Some((true, "freed".into())))),
            cell: "del x".into(),
            code: vec![
                "x = torch.empty(2**20, device='cuda')".into(),
                "del x".into(),
            ],
            statements: vec![StatementView {
                lines: (1, 1),
                state: "failed".into(),
                output: "4194304\n".into(),
                errors: String::new(),
                why: "NameError: name 'x' is not defined".into(),
                allocated: Some(4 << 20),
            }],
            play: Some(PlayView {
                done: 3,
                total: 10,
                losses: vec![2.3, 2.1, 1.9],
            }),
            ..Default::default()
        };
        vec![
            ServerMessage::Hello(Box::new(hello)),
            ServerMessage::Result {
                id: 7,
                record: Box::new(record),
            },
            ServerMessage::Progress {
                id: 7,
                done: 1,
                total: 3,
                loss: None,
            },
            ServerMessage::Snapshot {
                snapshot: Box::new(after.clone()),
            },
            ServerMessage::Watchers {
                watchers: vec!["anonymous".into()],
            },
            ServerMessage::MemorySnapshot {
                snapshot: Box::new(export::from_session(&after)),
            },
            ServerMessage::Delta(Box::new(delta::diff(&before, &after, (1, 2)))),
            ServerMessage::Presenter {
                view: Box::new(view),
            },
            ServerMessage::Events {
                events: after.events.clone(),
                dropped: 0,
            },
            ServerMessage::Error {
                id: None,
                error: ConnectionError::new(ConnectionErrorKind::Busy, "busy"),
            },
            ServerMessage::Pong { nonce: 9 },
        ]
    }

    #[test]
    fn every_message_reads_back_as_written() {
        let all = messages();
        assert_eq!(all.len(), ServerMessage::TYPES.len());
        for (msg, kind) in all.into_iter().zip(ServerMessage::TYPES) {
            assert_eq!(msg.type_name(), *kind);
            let text = serde_json::to_string(&msg).unwrap();
            assert!(text.starts_with(&format!(r#"{{"type":"{kind}""#)), "{text}");
            assert_eq!(serde_json::from_str::<ServerMessage>(&text).unwrap(), msg);
        }
    }

    #[test]
    fn errors_name_the_problem() {
        let err = |text: &str| {
            serde_json::from_str::<ServerMessage>(text)
                .unwrap_err()
                .to_string()
        };
        assert!(err(r#"{"id":1}"#).starts_with("missing field `type`"));
        assert!(err(r#"{"type":"launch"}"#)
            .starts_with("unknown variant `launch`, expected one of `hello`"));
        assert!(err(r#"{"type":"pong"}"#).starts_with("missing field `nonce`"));
        assert!(err(r#"{"type":"pong","nonce":"x"}"#).starts_with("invalid type: string \"x\""));
        assert_eq!(
            serde_json::from_str::<ServerMessage>(
                r#"{"type":"error","error":{"kind":"busy","message":"m"}}"#
            )
            .unwrap(),
            ServerMessage::Error {
                id: None,
                error: ConnectionError::new(ConnectionErrorKind::Busy, "m")
            }
        );
    }

    fn client_messages() -> Vec<ClientMessage> {
        use crate::command::parse_line;
        let line = parse_line(r#"{"cmd":"alloc","name":"x","bytes":1024,"say":"x = ..."}"#);
        vec![
            ClientMessage::Command {
                id: 3,
                command: Box::new(line.clone()),
            },
            ClientMessage::Commands {
                first_id: 4,
                commands: vec![line.clone(), line],
            },
            ClientMessage::Subscribe {},
            ClientMessage::Unsubscribe {},
            ClientMessage::Snapshot {},
            ClientMessage::ExportSnapshot {},
            ClientMessage::Stop {},
            ClientMessage::Ping { nonce: 5 },
            ClientMessage::Presenter {
                view: Box::new(PresenterView {
                    cell: "x = 1".into(),
                    ..PresenterView::default()
                }),
            },
        ]
    }

    #[test]
    fn every_client_message_reads_back_as_written() {
        let all = client_messages();
        assert_eq!(all.len(), ClientMessage::TYPES.len());
        for (msg, kind) in all.into_iter().zip(ClientMessage::TYPES) {
            assert_eq!(msg.type_name(), *kind);
            let text = serde_json::to_string(&msg).unwrap();
            assert!(text.starts_with(&format!(r#"{{"type":"{kind}""#)), "{text}");
            assert_eq!(serde_json::from_str::<ClientMessage>(&text).unwrap(), msg);
        }
    }

    #[test]
    fn client_errors_name_the_problem() {
        let err = |text: &str| {
            serde_json::from_str::<ClientMessage>(text)
                .unwrap_err()
                .to_string()
        };
        assert!(err(r#"{"type":"launch"}"#)
            .starts_with("unknown variant `launch`, expected one of `command`"));
        assert!(
            err(r#"{"type":"command","command":{"cmd":"gc"}}"#).starts_with("missing field `id`")
        );
        assert!(err(r#"{"type":"command","id":"one","command":{}}"#)
            .starts_with("invalid type: string \"one\", expected u64"));
        assert!(
            err(r#"{"type":"command","id":9,"bogus":1,"command":{"cmd":"gc"}}"#)
                .starts_with("unknown field `bogus`, expected `id` or `command`")
        );
        assert!(err(r#"{"type":"stop","now":true}"#)
            .starts_with("unknown field `now`, there are no fields"));
        assert!(err("[1,2,3]").starts_with("invalid type: sequence, expected a map"));
        assert!(err(r#"{"type":"commands","first_id":1,"commands":[]}"#)
            .starts_with("a `commands` message holds 1 to 64 commands, not 0"));
        // Each command its own id: a batch whose ids would run past the
        // largest gave them all the same one.
        let last = u64::MAX;
        assert!(err(&format!(
            r#"{{"type":"commands","first_id":{last},"commands":[{{"cmd":"gc"}},{{"cmd":"gc"}}]}}"#
        ))
        .starts_with("a `commands` message of 2 commands from id 18446744073709551615 runs past"));
        assert!(serde_json::from_str::<ClientMessage>(&format!(
            r#"{{"type":"commands","first_id":{last},"commands":[{{"cmd":"gc"}}]}}"#
        ))
        .is_ok());
        // A ping's nonce may be left out.
        assert_eq!(
            serde_json::from_str::<ClientMessage>(r#"{"type":"ping"}"#).unwrap(),
            ClientMessage::Ping { nonce: 0 }
        );
    }

    #[test]
    fn a_record_reads_without_its_optional_fields_and_names_a_missing_one() {
        let mut engine = Engine::new_simulated();
        let record = engine.run_line(r#"{"cmd":"restart","framework":"jax"}"#);
        assert!(record.settings.is_some() && record.device.is_some());
        let mut v = serde_json::to_value(&record).unwrap();
        assert_eq!(
            serde_json::from_value::<StepRecord>(v.clone()).unwrap(),
            record
        );
        for key in ["error", "note", "value", "settings", "device"] {
            v.as_object_mut().unwrap().remove(key);
        }
        let bare = serde_json::from_value::<StepRecord>(v.clone()).unwrap();
        assert_eq!((bare.settings, bare.note, bare.value), (None, None, None));
        v.as_object_mut().unwrap().remove("stats");
        let e = serde_json::from_value::<StepRecord>(v).unwrap_err();
        assert_eq!(e.to_string(), "missing field `stats`");
    }
}
