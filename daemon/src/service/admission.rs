//! Disk reads on the bus: calls that read the caches run on blocking
//! threads, in two pools of two, one for anyone's reads and one for root's
//! operations; and anyone's reads are admitted per sender and in all, so a
//! flood is refused at once, not queued inside gpuarchd.

use zbus::fdo;
use zbus::message::Header;

/// Calls that read the cache from disk run on blocking threads, in two
/// pools of two: one for the unprivileged reads (ListKernels, UsedBytes),
/// one for root's operations (GarbageCollect, Verify), so root is never
/// queued behind anyone else's calls.
pub(super) static READ_WORK: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
pub(super) static ROOT_WORK: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// How many unprivileged disk reads may wait or run at once, from one
/// sender and from all: past that a call is answered `LimitsExceeded` at
/// once, so a flood is pushed back onto its senders instead of queueing
/// (as tasks, growing memory) inside gpuarchd.
pub const READS_PER_SENDER: usize = 4;
pub const READS_IN_ALL: usize = 32;

/// Unprivileged disk reads admitted now, by sender.
static ADMITTED: std::sync::Mutex<std::collections::BTreeMap<String, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// A place among the admitted reads, given back when dropped.
pub(super) struct Admission(String);

impl Admission {
    pub(super) fn take(hdr: Option<&Header<'_>>, method: &str) -> fdo::Result<Self> {
        let sender = hdr
            .and_then(|h| h.sender())
            .map(|s| s.to_string())
            .unwrap_or_default();
        let mut a = ADMITTED
            .lock()
            .map_err(|e| fdo::Error::Failed(e.to_string()))?;
        let all: usize = a.values().sum();
        let mine = a.get(&sender).copied().unwrap_or(0);
        if mine >= READS_PER_SENDER || all >= READS_IN_ALL {
            return Err(fdo::Error::LimitsExceeded(format!(
                "{method}: {mine} of this caller's and {all} in all are already in progress \
                 (at most {READS_PER_SENDER} and {READS_IN_ALL}); call again later"
            )));
        }
        *a.entry(sender.clone()).or_default() += 1;
        Ok(Self(sender))
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Ok(mut a) = ADMITTED.lock()
            && let Some(n) = a.get_mut(&self.0)
        {
            *n -= 1;
            if *n == 0 {
                a.remove(&self.0);
            }
        }
    }
}

pub(super) async fn blocking<T: Send + 'static>(
    pool: &'static tokio::sync::Semaphore,
    f: impl FnOnce() -> T + Send + 'static,
) -> fdo::Result<T> {
    let _turn = pool
        .acquire()
        .await
        .map_err(|e| fdo::Error::Failed(e.to_string()))?;
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| fdo::Error::Failed(e.to_string()))
}
