//! Reading one line: JSON, lesson annotations split off, the command with
//! every problem named (unknown commands and unknown fields included).

use super::Command;
use crate::error::{CommandError, ErrorKind};
use serde::de::{Deserializer, Error as _, Unexpected};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Fields a lesson file may add to any command line; the runner ignores
/// them, the lesson checker reads them.
pub const ANNOTATION_KEYS: [&str; 3] = ["say", "expect", "why"];

/// A lesson step's words and expected observation.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Annotations {
    /// What the step asks the learner to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub say: Option<String>,
    /// Why the numbers move as they do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Stats (and `ok`, `error_kind`, `error_contains`, `note_contains`)
    /// expected after the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<BTreeMap<String, Value>>,
}

/// One parsed input line: the command as written (annotations removed),
/// the command, and any lesson annotations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "Value", into = "Value")]
pub struct CommandLine {
    /// The JSON as written, minus annotations (echoed in results).
    pub raw: Value,
    pub command: Result<Command, CommandError>,
    pub annotations: Annotations,
}

impl From<Value> for CommandLine {
    fn from(value: Value) -> Self {
        parse_value(value)
    }
}

impl From<CommandLine> for Value {
    /// The line as written: the command with its annotations.
    fn from(line: CommandLine) -> Self {
        let mut value = line.raw;
        if let (Value::Object(map), Ok(Value::Object(notes))) =
            (&mut value, serde_json::to_value(&line.annotations))
        {
            map.extend(notes);
        }
        value
    }
}

impl From<Command> for CommandLine {
    /// A command built in code: written as its own JSON, no annotations.
    fn from(command: Command) -> Self {
        CommandLine {
            raw: serde_json::to_value(&command).unwrap_or(Value::Null),
            command: Ok(command),
            annotations: Annotations::default(),
        }
    }
}

/// Parses one JSON line into a command, keeping what was written for the
/// echo even when it is not a valid command.
pub fn parse_line(line: &str) -> CommandLine {
    let value: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            return CommandLine {
                raw: Value::String(line.to_string()),
                command: Err(CommandError::new(
                    ErrorKind::ParseError,
                    format!("not JSON: {e}"),
                )),
                annotations: Annotations::default(),
            }
        }
    };
    parse_value(value)
}

/// Like [`parse_line`], from a JSON value.
pub fn parse_value(mut value: Value) -> CommandLine {
    let mut annotations = Annotations::default();
    let mut annotation_error = None;
    if let Value::Object(map) = &mut value {
        fn take<T: serde::de::DeserializeOwned>(
            map: &mut serde_json::Map<String, Value>,
            key: &str,
        ) -> Result<Option<T>, serde_json::Error> {
            map.remove(key).map(serde_json::from_value).transpose()
        }
        let read = |map: &mut _| -> Result<Annotations, serde_json::Error> {
            Ok(Annotations {
                say: take(map, "say")?,
                why: take(map, "why")?,
                expect: take(map, "expect")?,
            })
        };
        match read(map) {
            Ok(a) => annotations = a,
            Err(e) => {
                annotation_error = Some(CommandError::new(
                    ErrorKind::InvalidCommand,
                    format!("bad lesson annotation: {e}"),
                ))
            }
        }
    }
    let command = match annotation_error {
        Some(e) => Err(e),
        None => command_from_value(&value),
    };
    CommandLine {
        raw: value,
        command,
        annotations,
    }
}

fn command_from_value(value: &Value) -> Result<Command, CommandError> {
    let Value::Object(map) = value else {
        return Err(CommandError::new(
            ErrorKind::InvalidCommand,
            format!(
                "a command is a JSON object with a \"cmd\" field, not {}",
                json_type(value)
            ),
        ));
    };
    let cmd = match map.get("cmd") {
        None => {
            return Err(CommandError::new(
                ErrorKind::InvalidCommand,
                "missing field `cmd`: say which command, e.g. {\"cmd\":\"alloc\",\"name\":\"x\",\"bytes\":1024}",
            ))
        }
        Some(Value::String(cmd)) => cmd,
        Some(other) => {
            return Err(CommandError::new(
                ErrorKind::InvalidCommand,
                format!("`cmd` must be a string, not {}", json_type(other)),
            ))
        }
    };
    let mut fields = map.clone();
    fields.remove("cmd");
    read_args(cmd, fields).map_err(|e| {
        let text = e.to_string();
        let message = if text.starts_with("unknown variant") {
            format!("unknown command {cmd:?}: {text}")
        } else {
            format!("bad {cmd:?} command: {text}")
        };
        CommandError::new(ErrorKind::InvalidCommand, message)
    })
}

impl<'de> Deserialize<'de> for Command {
    /// Reads `{"cmd": name, ...}`: the name picks the arguments' struct,
    /// which reads the other fields and refuses unknown ones. (By hand:
    /// serde's tagged enums buffer each line into a tree of their own.)
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut fields = Map::deserialize(d)?;
        match fields.remove("cmd") {
            Some(Value::String(name)) => read_args(&name, fields).map_err(D::Error::custom),
            Some(other) => Err(D::Error::invalid_type(
                Unexpected::Other(json_type(&other)),
                &"a command name",
            )),
            None => Err(D::Error::missing_field("cmd")),
        }
    }
}

/// The command `name` with these fields.
fn read_args(name: &str, fields: Map<String, Value>) -> Result<Command, serde_json::Error> {
    Command::read(name, fields)
        .unwrap_or_else(|| Err(serde_json::Error::unknown_variant(name, Command::NAMES)))
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_built_in_code_reads_back_as_itself() {
        let restart = Command::Restart(crate::framework::RestartSettings {
            framework: Some(crate::types::Framework::Tensorflow),
            memory_limit_bytes: Some(None),
            max_split_size_mb: Some(Some(128)),
            mem_fraction: Some(0.5),
            ..Default::default()
        });
        let train = Command::Train(crate::command::TrainArgs {
            model: "model".into(),
            optimizer: "opt".into(),
            data: "data".into(),
            steps: 3,
            batch_size: 32,
            accumulate: 2,
            checkpointing: true,
            amp: crate::command::Amp::Off,
            set_to_none: false,
            loss_history: crate::command::LossHistory::Tensor,
            attention: crate::train::kinds::Attention::Sdpa,
            donate: false,
            jit_compile: false,
        });
        for command in [restart, train, Command::Gc {}] {
            let line = CommandLine::from(command.clone());
            assert_eq!(line.command, Ok(command.clone()));
            assert_eq!(parse_value(line.raw).command, Ok(command));
        }
    }

    #[test]
    fn parses_the_design_examples() {
        let c = parse_line(r#"{"cmd":"alloc", "name":"x", "bytes":1024}"#);
        assert_eq!(
            c.command.unwrap(),
            Command::Alloc(crate::command::AllocArgs {
                name: "x".into(),
                bytes: Some(1024),
                shape: None,
                dtype: None,
                category: None
            })
        );
        let c = parse_line(r#"{"cmd":"hold", "name":"h", "items":["x","y"], "cycle":true}"#);
        assert!(matches!(
            c.command.unwrap(),
            Command::Hold(crate::command::HoldArgs { cycle: true, .. })
        ));
        let c = parse_line(r#"{"cmd":"restart","framework":"jax","preallocate":false}"#);
        let Command::Restart(s) = c.command.unwrap() else {
            panic!()
        };
        assert_eq!(s.framework, Some(crate::types::Framework::Jax));
        assert_eq!(s.preallocate, Some(false));
        assert_eq!(s.memory_limit_bytes, None);
        let c = parse_line(r#"{"cmd":"restart","memory_limit_bytes":null}"#);
        let Command::Restart(s) = c.command.unwrap() else {
            panic!()
        };
        assert_eq!(s.memory_limit_bytes, Some(None));
        assert_eq!(
            parse_line(r#"{"cmd":"gc"}"#).command.unwrap(),
            Command::Gc {}
        );
    }

    #[test]
    fn every_command_name_is_read() {
        for &name in Command::NAMES {
            let line = parse_line(&format!(r#"{{"cmd":"{name}"}}"#));
            match line.command {
                Ok(c) => assert_eq!(c.name(), name),
                Err(e) => assert!(
                    e.message
                        .starts_with(&format!("bad \"{name}\" command: missing field")),
                    "{}",
                    e.message
                ),
            }
        }
    }

    #[test]
    fn unknown_fields_are_refused() {
        let msg = |line: &str| parse_line(line).command.unwrap_err().message;
        assert_eq!(
            msg(r#"{"cmd":"gc","x":1}"#),
            "bad \"gc\" command: unknown field `x`, there are no fields"
        );
        assert_eq!(
            msg(r#"{"cmd":"del","name":"x","y":1}"#),
            "bad \"del\" command: unknown field `y`, expected `name`"
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let msg = |line: &str| parse_line(line).command.unwrap_err();
        assert_eq!(msg("nope").kind, ErrorKind::ParseError);
        let e = msg(r#"{"cmd":"launch"}"#);
        assert_eq!(e.kind, ErrorKind::InvalidCommand);
        assert!(
            e.message.contains("unknown command \"launch\""),
            "{}",
            e.message
        );
        assert!(msg(r#"{"cmd":"del"}"#)
            .message
            .contains("missing field `name`"));
        assert!(msg(r#"{"cmd":"alloc","name":"x","bytes":-1}"#)
            .message
            .contains("invalid value"));
        assert!(msg(r#"{"cmd":"alloc","name":"x","byts":1}"#)
            .message
            .contains("unknown field `byts`"));
        assert!(
            msg(r#"{"cmd":"restart","expandable_segment":true}"#)
                .message
                .contains("unknown field `expandable_segment`"),
            "a setting the engine does not know is refused"
        );
        assert!(
            msg(r#"{"cmd":"train","model":"m","optimizer":"o","data":"d","step":3}"#)
                .message
                .contains("unknown field `step`")
        );
        assert!(msg(r#"{"cmd":"gc","now":true}"#)
            .message
            .contains("unknown field"));
        assert!(msg(r#"[1,2]"#).message.contains("not an array"));
        assert!(msg(r#"{"name":"x"}"#)
            .message
            .contains("missing field `cmd`"));
        assert!(msg(r#"{"cmd":7}"#).message.contains("must be a string"));
    }

    #[test]
    fn annotations_are_split_off() {
        let c = parse_line(r#"{"cmd":"gc","say":"collect","expect":{"allocated_bytes":0}}"#);
        assert_eq!(c.command.unwrap(), Command::Gc {});
        assert_eq!(c.raw, serde_json::json!({"cmd":"gc"}));
        assert_eq!(c.annotations.say.as_deref(), Some("collect"));
        assert_eq!(c.annotations.expect.unwrap()["allocated_bytes"], 0);
    }

    #[test]
    fn commands_round_trip() {
        for line in [
            r#"{"cmd":"alloc","name":"x","shape":[2,3],"dtype":"float16","category":"activation"}"#,
            r#"{"cmd":"del","name":"x"}"#,
            r#"{"cmd":"empty_cache"}"#,
            r#"{"cmd":"restart","framework":"tensorflow","allow_growth":true}"#,
        ] {
            let c = parse_line(line).command.unwrap();
            let back = serde_json::to_string(&c).unwrap();
            assert_eq!(parse_line(&back).command.unwrap(), c, "{back}");
        }
    }
}
