//! Every invocation has a time budget: the work runs on a thread, and when
//! the budget is spent the caller goes on without it (fail open or strict)
//! and the process exits, taking a stuck filesystem call with it (and,
//! through `PR_SET_PDEATHSIG`, a gpuarchctl reading NVML: crate::nvml).

use std::sync::mpsc;
use std::time::Duration;

/// The work did not finish within its budget.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error("gave up after {0:?} (hook.timeout_ms in the config)")]
    Elapsed(Duration),
    #[error("cannot start a thread: {0}")]
    Spawn(std::io::Error),
}

impl From<std::io::Error> for BudgetError {
    fn from(e: std::io::Error) -> Self {
        Self::Spawn(e)
    }
}

/// Run `work` with at most `budget` of wall-clock time.
pub fn within<T: Send + 'static>(
    budget: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BudgetError> {
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("gpuarch-plan".into())
        .spawn(move || {
            let _ = tx.send(work());
        })?;
    rx.recv_timeout(budget)
        .map_err(|_| BudgetError::Elapsed(budget))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finishes_or_gives_up() {
        assert_eq!(within(Duration::from_secs(5), || 7).unwrap(), 7);
        let t = std::time::Instant::now();
        let r = within(Duration::from_millis(50), || {
            std::thread::sleep(Duration::from_secs(10));
        });
        assert!(
            matches!(r, Err(BudgetError::Elapsed(d)) if d == Duration::from_millis(50)),
            "{r:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}
