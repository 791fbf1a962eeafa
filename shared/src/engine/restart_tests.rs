//! `restart`: the old process exits before the new one starts, as on a
//! real GPU, where the new process's free memory (TensorFlow's pool) must
//! not count the old one's context and segments.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A simulated device that counts the devices alive.
struct Counted {
    inner: Box<dyn Device>,
    live: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Device for Counted {
    fn malloc(&mut self, bytes: u64) -> Result<u64, crate::error::DeviceError> {
        self.inner.malloc(bytes)
    }
    fn free(&mut self, address: u64, bytes: u64) {
        self.inner.free(address, bytes)
    }
    fn mem_get_info(&self) -> (u64, u64) {
        self.inner.mem_get_info()
    }
    fn context_bytes(&self) -> u64 {
        self.inner.context_bytes()
    }
    fn other_processes_bytes(&self) -> u64 {
        self.inner.other_processes_bytes()
    }
    fn segment_bytes(&self) -> u64 {
        self.inner.segment_bytes()
    }
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }
}

/// Starts counted devices, noting how many were alive at each start; a
/// JAX kernel fails to start (as a driver might refuse a context).
#[derive(Default)]
struct Factory {
    live: Arc<AtomicUsize>,
    alive_at_start: Arc<Mutex<Vec<usize>>>,
}

impl DeviceFactory for Factory {
    fn start(&mut self, settings: &Settings) -> Result<Box<dyn Device>, CommandError> {
        let alive = self.live.load(Ordering::SeqCst);
        self.alive_at_start.lock().unwrap().push(alive);
        if settings.framework == Framework::Jax {
            return Err(CommandError::new(ErrorKind::DeviceError, "no context"));
        }
        let inner = SimDeviceFactory.start(settings)?;
        self.live.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(Counted {
            inner,
            live: self.live.clone(),
        }))
    }
}

fn line(e: &mut Engine, text: &str) -> crate::protocol::StepRecord {
    e.run_line(text)
}

#[test]
fn the_old_process_is_gone_before_the_new_one_starts() {
    let factory = Factory::default();
    let alive = factory.alive_at_start.clone();
    let mut e = Engine::new(Box::new(factory), Settings::default()).unwrap();
    assert!(line(&mut e, r#"{"cmd":"alloc","name":"x","bytes":1048576}"#).ok);
    let r = line(&mut e, r#"{"cmd":"restart","framework":"tensorflow"}"#);
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(*alive.lock().unwrap(), [0, 0]);
}

#[test]
fn a_process_that_cannot_start_leaves_one_with_the_previous_settings() {
    let factory = Factory::default();
    let alive = factory.alive_at_start.clone();
    let mut e = Engine::new(Box::new(factory), Settings::default()).unwrap();
    assert!(line(&mut e, r#"{"cmd":"alloc","name":"x","bytes":1048576}"#).ok);
    let r = line(&mut e, r#"{"cmd":"restart","framework":"jax"}"#);
    let error = r.error.expect("the new process could not start");
    assert!(
        error.message.contains("with the previous settings"),
        "{}",
        error.message
    );
    // The old process had exited: `x` is gone, and a fresh PyTorch one runs.
    assert_eq!(e.settings().framework, Framework::Pytorch);
    assert_eq!(e.stats().allocated_bytes, 0);
    assert!(line(&mut e, r#"{"cmd":"alloc","name":"y","bytes":1048576}"#).ok);
    assert_eq!(*alive.lock().unwrap(), [0, 0, 0]);
}
