//! CPU-heavy work a connection asks for (a session's export as a memory
//! snapshot): run on the blocking pool, off the runtime that serves every
//! connection, and a few at a time (half the cores, at least one), so
//! that one session's heavy request delays no other session's messages.

use std::sync::Arc;
use tokio::sync::Semaphore;

#[derive(Clone, Debug)]
pub struct Heavy {
    permits: Arc<Semaphore>,
}

impl Default for Heavy {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Heavy::new((cores / 2).max(1))
    }
}

impl Heavy {
    /// At most `at_once` at a time.
    pub fn new(at_once: usize) -> Heavy {
        Heavy {
            permits: Arc::new(Semaphore::new(at_once)),
        }
    }

    /// `work`'s result, once a turn comes and it ran (`None` if it
    /// panicked: the connection answers nothing, the server goes on).
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let _turn = self.permits.acquire().await.ok()?;
        tokio::task::spawn_blocking(work).await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// While heavy work runs, the runtime's other tasks go on at once;
    /// the heavy work itself takes its turn.
    #[tokio::test(flavor = "current_thread")]
    async fn heavy_work_leaves_the_runtime_free_and_waits_its_turn() {
        let heavy = Heavy::new(1);
        let spin = || {
            let until = Instant::now() + Duration::from_millis(300);
            while Instant::now() < until {}
            7
        };
        let (a, b) = (heavy.clone(), heavy.clone());
        let first = tokio::spawn(async move { a.run(spin).await });
        let second = tokio::spawn(async move { b.run(spin).await });
        // On a one-thread runtime, a quick task answers while both run.
        let started = Instant::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(started.elapsed() < Duration::from_millis(200));
        let both = Instant::now();
        assert_eq!(
            (first.await.unwrap(), second.await.unwrap()),
            (Some(7), Some(7))
        );
        // One at a time: the second waited for the first.
        assert!(
            both.elapsed() >= Duration::from_millis(550),
            "{:?}",
            both.elapsed()
        );
        assert_eq!(heavy.run(|| panic!("a bug")).await, None::<()>);
    }
}
