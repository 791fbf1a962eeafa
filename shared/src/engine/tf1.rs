//! TensorFlow 1's sessions: `tf.compat.v1.Session()` owns the variables of
//! models built while it is open; `sess.close()` frees them.

use super::{check_name, error, Engine, Outcome};
use crate::error::{CommandError, ErrorKind};
use crate::runtime::{Class, ObjectKind};
use crate::train::SessionState;
use crate::types::Framework;
use crate::units::format_size;

impl Engine {
    pub(super) fn tf_session(&mut self, name: &str) -> Result<Outcome, CommandError> {
        check_name(name)?;
        if self.settings.framework != Framework::Tensorflow {
            return Err(error(
                ErrorKind::InvalidValue,
                "tf.compat.v1.Session needs the tensorflow framework: restart with {\"framework\":\"tensorflow\"}",
            ));
        }
        let s = self
            .process
            .runtime
            .new_local(ObjectKind::Instance(Class::Session), name);
        self.train
            .sessions
            .insert(s, SessionState { closed: false });
        self.train.open_session = Some(s);
        self.process.bind_local(name, s);
        Ok(Outcome::note(format!(
            "`{name}` is open: the variables of models built now belong to it."
        )))
    }

    pub(super) fn close(&mut self, name: &str) -> Result<Outcome, CommandError> {
        let s = self.instance(name, Class::Session)?;
        let freed = self.process.clear_refs(s);
        if let Some(state) = self.train.sessions.get_mut(&s) {
            state.closed = true;
        }
        if self.train.open_session == Some(s) {
            self.train.open_session = None;
        }
        Ok(Outcome::note(format!(
            "Closing `{name}` freed its variables inside the pool ({}): bytes_in_use fell, the pool and nvidia-smi did not.",
            format_size(freed)
        )))
    }
}
