//! The image audit at container start, gpuarchd's half (`audit:` in the
//! config; the hook's half is `gpuarch_container::audit`).
//!
//! The hook leaves a request per image not yet audited in
//! `audit.dir/requests/`, named by the image read's key, holding the
//! container's rootfs and the process variables that decide what the audit
//! reads. gpuarchd takes each (watching the directory, and every
//! [`SWEEP`]), runs the audit in a worker process (`gpuarchd
//! --audit-worker`: its own process, so that a file truncated while it is
//! mapped, or a crafted binary, ends that process and not gpuarchd; its
//! heap capped by `RLIMIT_DATA`; killed past `audit.max_seconds`), and
//! keeps the result as `audit.dir/<key>.json`, written whole, for every
//! later start of that image. A request that fails (the container gone,
//! its rootfs with it) is not retried for [`RETRY_AFTER`].

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuarch_audit::{MAX_WORKER_INPUT, WorkerInput};
use gpuarch_container::audit::Request;
use gpuarch_core::audit::ImageAudit;
use gpuarch_core::config::{AuditConfig, valid_key};
use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::state::Shared;

/// How often the request directory is read without an event.
pub const SWEEP: Duration = Duration::from_secs(30);
/// How long a request that failed is not taken again.
pub const RETRY_AFTER: Duration = Duration::from_secs(600);
/// Most requests taken in one pass.
const MOST_PER_PASS: usize = 64;
/// Most audits kept; past it the least recently written go.
pub const MOST_KEPT: usize = 4096;
/// Most bytes of a worker's answer read.
const MAX_ANSWER: u64 = 64 << 20;
/// The worker's heap (`RLIMIT_DATA`): files are mapped read-only, which
/// this does not count.
const WORKER_DATA: u64 = 1 << 30;

/// Why a request was not audited.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the request: {0}")]
    Request(#[source] serde_json::Error),
    #[error("the request is too large")]
    TooLarge,
    #[error("cannot start the audit worker: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("no pipes to the audit worker")]
    NoPipes,
    #[error("the audit worker ran past {0} s and was killed")]
    Killed(u64),
    #[error("the audit worker exited with {status}: {said}")]
    Exited {
        status: std::process::ExitStatus,
        said: String,
    },
    #[error("the audit worker's answer: {0}")]
    Answer(#[source] serde_json::Error),
}

/// Take requests until `stop`.
pub async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let mut watched: Option<(PathBuf, notify::RecommendedWatcher)> = None;
    let mut failed: HashMap<String, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(SWEEP);
    loop {
        let cfg = shared.config().audit.clone();
        if let Some(dir) = &cfg.dir
            && watched.as_ref().is_none_or(|(d, _)| d != dir)
        {
            watched = prepare(dir, tx.clone());
        }
        if cfg.dir.is_some() {
            let c = cfg.clone();
            let f = std::mem::take(&mut failed);
            failed = tokio::task::spawn_blocking(move || {
                let mut f = f;
                pass(&c, &mut f);
                f
            })
            .await
            .unwrap_or_default();
        }
        tokio::select! {
            _ = tick.tick() => {}
            Some(()) = rx.recv() => {
                // A burst of requests settles before the pass.
                tokio::time::sleep(Duration::from_millis(20)).await;
                while rx.try_recv().is_ok() {}
            }
            _ = stop.changed() => return,
        }
    }
}

/// Make the directories (root only) and watch the requests'.
fn prepare(
    dir: &Path,
    tx: mpsc::UnboundedSender<()>,
) -> Option<(PathBuf, notify::RecommendedWatcher)> {
    let requests = dir.join("requests");
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&requests)
    {
        warn!(
            "image audit: cannot create {}: {e}; no audits at start",
            requests.display()
        );
        return None;
    }
    let mut w = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if ev.is_ok() {
            let _ = tx.send(());
        }
    })
    .ok()?;
    match w.watch(&requests, RecursiveMode::NonRecursive) {
        Ok(()) => info!("image audit: taking requests in {}", requests.display()),
        Err(e) => warn!(
            "image audit: cannot watch {} ({e}); taken every {} s",
            requests.display(),
            SWEEP.as_secs()
        ),
    }
    Some((dir.to_owned(), w))
}

/// One pass over the requests.
pub fn pass(cfg: &AuditConfig, failed: &mut HashMap<String, Instant>) {
    let (Some(dir), Some(requests)) = (&cfg.dir, cfg.requests_dir()) else {
        return;
    };
    failed.retain(|_, at| at.elapsed() < RETRY_AFTER);
    let Ok(entries) = std::fs::read_dir(&requests) else {
        return;
    };
    let names: Vec<String> = entries
        .flatten()
        .take(MOST_PER_PASS)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    // Only a pass that kept an audit can take the directory past its bound.
    let mut kept_any = false;
    for key in names {
        let path = requests.join(&key);
        if key.starts_with('.') {
            // A request the hook is still writing; one a hook that died
            // left behind goes after a minute.
            let stale = path
                .symlink_metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(60));
            if stale {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        let body = read_request(&path);
        let _ = std::fs::remove_file(&path);
        if !valid_key(&key) {
            warn!("image audit: dropping request {key:?}: not an image key");
            continue;
        }
        let entry = dir.join(format!("{key}.json"));
        if entry.exists() || failed.contains_key(&key) {
            continue;
        }
        let req = match body
            .and_then(|b| serde_json::from_slice::<Request>(&b).map_err(RunError::Request))
        {
            Ok(r) => r,
            Err(e) => {
                warn!("image audit: dropping request {key}: {e}");
                continue;
            }
        };
        let t0 = Instant::now();
        let a = match audit_in_worker(req, &key, cfg.max_seconds) {
            Ok(a) => a,
            Err(e) => {
                warn!(
                    "image audit {key}: {e}; not asked again for {} s",
                    RETRY_AFTER.as_secs()
                );
                failed.insert(key, Instant::now());
                continue;
            }
        };
        if let Err(e) = keep(&entry, &a).and_then(|()| index(dir, &key, &a.images)) {
            warn!("image audit {key}: not kept: {e}");
            continue;
        }
        kept_any = true;
        info!(
            "image audit {key}: {} binaries with GPU code in {} files ({} MiB) in {} ms{}",
            a.binaries.len(),
            a.files,
            a.bytes >> 20,
            t0.elapsed().as_millis(),
            a.stopped
                .as_ref()
                .map(|s| format!("; stopped {s}"))
                .unwrap_or_default()
        );
    }
    if kept_any {
        prune(dir);
    }
}

/// A request's bytes (never through a link, at most 64 KiB).
fn read_request(path: &Path) -> Result<Vec<u8>, RunError> {
    Ok(gpuarch_container::audit::read_private(path, 64 << 10)?)
}

/// Run the audit of `req` in `gpuarchd --audit-worker`.
fn audit_in_worker(request: Request, key: &str, max_seconds: u64) -> Result<ImageAudit, RunError> {
    let input = serde_json::to_vec(&WorkerInput {
        request,
        key: key.to_owned(),
        max_seconds,
    })
    .map_err(RunError::Request)?;
    if input.len() as u64 > MAX_WORKER_INPUT {
        return Err(RunError::TooLarge);
    }
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg("--audit-worker")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the
    // parent.
    unsafe {
        cmd.pre_exec(|| {
            use nix::sys::resource::{Resource, setrlimit};
            setrlimit(Resource::RLIMIT_DATA, WORKER_DATA, WORKER_DATA)
                .and_then(|()| setrlimit(Resource::RLIMIT_CORE, 0, 0))
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().map_err(RunError::Spawn)?;
    let pid = child.id();
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(RunError::NoPipes);
    };
    let feed = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stdout.take(MAX_ANSWER).read_to_end(&mut b);
        b
    });
    let err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stderr.take(4096).read_to_end(&mut b);
        b
    });
    // The audit stops itself at max_seconds; the worker is killed a little
    // after, whatever one system call of it costs.
    let limit = Duration::from_secs(max_seconds) + Duration::from_secs(10);
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() >= limit => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e.into()),
        }
    };
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
        nix::sys::signal::Signal::SIGKILL,
    );
    let status = match status {
        Some(s) => s,
        None => {
            let _ = child.wait();
            return Err(RunError::Killed(limit.as_secs()));
        }
    };
    let _ = feed.join();
    let stdout = out.join().unwrap_or_default();
    let said = String::from_utf8_lossy(&err.join().unwrap_or_default())
        .trim()
        .to_owned();
    if !status.success() {
        return Err(RunError::Exited { status, said });
    }
    serde_json::from_slice(&stdout).map_err(RunError::Answer)
}

/// Write `a` as `entry`, whole, root's alone.
fn keep(entry: &Path, a: &ImageAudit) -> std::io::Result<()> {
    let body = serde_json::to_vec(a).map_err(std::io::Error::other)?;
    gpuarch_fs::write_atomic_private(entry, &body)
}

/// Most names kept in `index.json`.
const MOST_NAMES: usize = 4 * MOST_KEPT;

/// Record in `dir/index.json` that `names` are the image of `key`: a
/// scheduler asks by the name the engine gave it. Names whose audit is
/// gone are dropped once the index is full.
fn index(dir: &Path, key: &str, names: &[String]) -> std::io::Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let mut map = gpuarch_container::audit::read_index(dir);
    for n in names {
        map.insert(n.clone(), key.to_owned());
    }
    if map.len() > MOST_NAMES {
        map.retain(|_, k| dir.join(format!("{k}.json")).exists());
        while map.len() > MOST_NAMES {
            let Some(first) = map.keys().next().cloned() else {
                break;
            };
            map.remove(&first);
        }
    }
    let body = serde_json::to_vec(&map).map_err(std::io::Error::other)?;
    gpuarch_fs::write_atomic_private(&dir.join("index.json"), &body)
}

/// Past [`MOST_KEPT`] audits, remove the least recently written tenth.
fn prune(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut kept: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.ends_with(".json") && n != "index.json"
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if kept.len() <= MOST_KEPT {
        return;
    }
    kept.sort();
    for (_, p) in kept.iter().take(kept.len() - MOST_KEPT + MOST_KEPT / 10) {
        let _ = std::fs::remove_file(p);
    }
}
