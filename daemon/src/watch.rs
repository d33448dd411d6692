//! Watching the config file with `notify`. The directory is watched, not the
//! file, so an editor's write-to-temp-and-rename and a file created after
//! start are both seen.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::service::Request;
use crate::state::Shared;

/// Bursts of events closer than this are one change.
const SETTLE: Duration = Duration::from_millis(150);

/// Start watching; returns the watcher, which stops watching when dropped.
pub fn start(
    shared: Arc<Shared>,
    requests: mpsc::Sender<Request>,
) -> Option<notify::RecommendedWatcher> {
    let path = shared.config_path.clone();
    if path.exists() && !path.is_file() {
        info!(
            "{} is not a regular file; not watching it for changes",
            path.display()
        );
        return None;
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map(ToOwned::to_owned);
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = match notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev
            && ev
                .paths
                .iter()
                .any(|p| p.file_name().map(ToOwned::to_owned) == name)
        {
            let _ = tx.send(());
        }
    }) {
        Ok(w) => w,
        Err(e) => {
            warn!("cannot watch the config for changes ({e}); send SIGHUP after editing it");
            return None;
        }
    };
    if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        warn!(
            "cannot watch {} for config changes ({e}); send SIGHUP after editing {}",
            dir.display(),
            path.display()
        );
        return None;
    }
    info!("watching {} for changes", path.display());
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            tokio::time::sleep(SETTLE).await;
            while rx.try_recv().is_ok() {}
            if let Ok(true) = shared.reload_config() {
                let _ = requests.send(Request::ConfigChanged).await;
            }
        }
    });
    Some(watcher)
}
