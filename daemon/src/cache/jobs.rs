//! Jobs on the kernel cache: pre-warms (builds and pulls), pushes and
//! imports run as jobs, each an `io.gpuarch1.Job` object on the bus with
//! its progress, its one-line outcome and a line per step. Finished jobs
//! stay on the bus for late readers, the last few of them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuarch_kernels::build::{ArchResult, Fetch, Task};
use gpuarch_kernels::store;
use gpuarch_wire::dbus::JobState;
use tracing::{info, warn};
use zbus::object_server::SignalEmitter;
use zbus::{Connection, interface};

use super::{Cache, JOBS_PATH};

/// Finished jobs kept on the bus for late readers.
const KEEP_FINISHED: usize = 32;

/// One pre-warm job's progress and outcome, shared with its D-Bus object.
#[derive(Debug, Default)]
pub struct JobStatus {
    pub total: usize,
    pub done: usize,
    pub state: JobState,
    pub message: String,
    /// One line per task: `rmsnorm sm_86: built bf16`.
    pub lines: Vec<String>,
}

/// The job objects on the bus: kept here so that a new bus connection
/// (after a dbus-daemon restart) serves them again.
#[derive(Debug, Default)]
pub(super) struct Jobs {
    live: BTreeMap<String, Arc<Mutex<JobStatus>>>,
    /// Finished jobs, oldest first; past [`KEEP_FINISHED`] they are dropped.
    finished: Vec<String>,
}

impl Cache {
    /// Run `tasks` (at most `workers` at once), getting what is not stored
    /// by `fetch`, updating `state`, then publish. Pins what it serves when
    /// `pin`.
    pub async fn run_job(
        self: &Arc<Self>,
        tasks: Vec<Task>,
        fetch: Fetch,
        pin: bool,
        state: Arc<Mutex<JobStatus>>,
    ) {
        if let Ok(mut a) = self.archs.lock() {
            a.extend(tasks.iter().map(|t| t.arch));
        }
        if let Ok(mut s) = state.lock() {
            s.total = tasks.len();
            s.state = JobState::Running;
        }
        let pkgs = Arc::new(self.packages());
        let mut handles = Vec::new();
        for t in tasks {
            let permit = self.workers.clone().acquire_owned().await;
            let (b, pkgs, state) = (self.builder.clone(), pkgs.clone(), state.clone());
            handles.push(tokio::task::spawn_blocking(move || {
                let _permit = permit;
                let r = match pkgs.get(&t.package) {
                    Some(p) => b.resolve(p, t.arch, fetch),
                    None => ArchResult::failed(&t, "the package was removed"),
                };
                if pin
                    && let Some((e, _)) = &r.served
                    && let Err(err) = b.store.pin(&e.manifest.key)
                {
                    warn!("cannot pin {}: {err}", e.manifest.key);
                }
                let line = describe(&r);
                if let Ok(mut s) = state.lock() {
                    s.done += 1;
                    s.lines.push(line);
                }
                r
            }));
        }
        let mut failed = Vec::new();
        let mut touched = BTreeSet::new();
        let mut unbuildable = Vec::new();
        for h in handles {
            if let Ok(r) = h.await {
                touched.insert(r.package.clone());
                let key = gpuarch_wire::spool::request_name(&r.package, &r.arch.to_string());
                if r.served.is_none() {
                    let why = r
                        .error
                        .clone()
                        .unwrap_or_else(|| match r.unavailable.first() {
                            Some(u) => format!(
                                "no variant builds for it ({}: {})",
                                u.variant,
                                gpuarch_core::text::first_line(&u.reason)
                            ),
                            None => "no variant builds for it".into(),
                        });
                    failed.push((format!("{} {}", r.package, r.arch), why.clone()));
                    unbuildable.push((key, Some(why)));
                } else {
                    unbuildable.push((key, None));
                }
            }
        }
        // Only a build says what cannot be built (a pull's miss does not).
        if fetch == Fetch::Build {
            self.note_unbuildable(&unbuildable);
        }
        self.republish(touched.into_iter().collect()).await;
        finish(&state, &failed, "served");
    }

    /// Say, beside the spool, which builds could not be made and why (and
    /// forget those that now could), so that containers stop asking for
    /// what cannot be built until gpuarchd restarts
    /// (`gpuarch_wire::spool::unbuildable_path`).
    fn note_unbuildable(&self, results: &[(String, Option<String>)]) {
        use gpuarch_wire::spool::{MOST_UNBUILDABLE, read_unbuildable, unbuildable_path};
        let path = unbuildable_path(&self.cfg.spool_dir);
        let mut map = read_unbuildable(&self.cfg.spool_dir);
        let before = map.clone();
        for (key, why) in results {
            match why {
                Some(w) if map.len() < MOST_UNBUILDABLE || map.contains_key(key) => {
                    let w: String = gpuarch_core::text::first_line(w)
                        .chars()
                        .take(300)
                        .collect();
                    map.insert(key.clone(), serde_json::Value::from(w));
                }
                Some(_) => {}
                None => {
                    map.remove(key);
                }
            }
        }
        if map == before {
            return;
        }
        let text = serde_json::Value::Object(map).to_string();
        if let Err(e) = gpuarch_fs::write_atomic(&path, text.as_bytes()) {
            warn!(
                "cannot say which builds cannot be made at {}: {e}",
                path.display()
            );
        }
    }

    /// Publish `names` again and sweep the views no one mounts.
    pub(super) async fn republish(self: &Arc<Self>, names: Vec<String>) {
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || {
            me.publish(Some(&names));
            me.sweep_views(&me.mounted().views);
        })
        .await;
    }

    /// Push `entries` to the registry, one at a time, updating `state`.
    pub async fn run_push(
        self: &Arc<Self>,
        entries: Vec<store::Entry>,
        state: Arc<Mutex<JobStatus>>,
    ) {
        let mut failed = Vec::new();
        for e in entries {
            let b = self.builder.clone();
            let m = &e.manifest;
            let head = format!("{} {} {}", m.package, m.arch, m.variant);
            let permit = self.workers.clone().acquire_owned().await;
            let pushed = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                match b.remote() {
                    Some(r) => r.push(&e).map_err(|e| e.to_string()),
                    None => Err("no registry (kernels.remote)".to_owned()),
                }
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
            let line = match pushed {
                Ok(at) => format!("{head}: pushed to {at}"),
                Err(why) => {
                    failed.push((head.clone(), why.clone()));
                    format!("{head}: failed: {why}")
                }
            };
            if let Ok(mut s) = state.lock() {
                s.done += 1;
                s.lines.push(line);
            }
        }
        finish(&state, &failed, "pushed");
    }

    /// A new job number and its object path.
    pub fn new_job_path(&self) -> String {
        format!(
            "{JOBS_PATH}/{}",
            self.next_job.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn add_job(&self, path: &str, state: Arc<Mutex<JobStatus>>) {
        if let Ok(mut j) = self.jobs.lock() {
            j.live.insert(path.to_owned(), state);
        }
    }

    /// Remember a finished job; returns the paths of jobs to drop.
    fn retire_job(&self, path: String) -> Vec<String> {
        let Ok(mut j) = self.jobs.lock() else {
            return Vec::new();
        };
        j.finished.push(path);
        let excess = j.finished.len().saturating_sub(KEEP_FINISHED);
        let old: Vec<String> = j.finished.drain(..excess).collect();
        for p in &old {
            j.live.remove(p);
        }
        old
    }

    /// Serve every job still kept on `conn` (a new bus connection).
    pub async fn serve_jobs(&self, conn: &Connection) -> zbus::Result<()> {
        let jobs: Vec<_> = match self.jobs.lock() {
            Ok(j) => j.live.iter().map(|(p, s)| (p.clone(), s.clone())).collect(),
            Err(_) => return Ok(()),
        };
        for (path, state) in jobs {
            conn.object_server()
                .at(path.as_str(), Job { state })
                .await?;
        }
        Ok(())
    }
}

fn describe(r: &ArchResult) -> String {
    let head = format!("{} {}", r.package, r.arch);
    match (&r.served, &r.error) {
        (Some((e, true)), _) => match &e.manifest.origin {
            Some(from) => format!("{head}: pulled {} from {from}", e.manifest.variant),
            None => format!("{head}: built {}", e.manifest.variant),
        },
        (Some((e, false)), _) => format!("{head}: cached {}", e.manifest.variant),
        (None, Some(err)) => format!("{head}: failed: {err}"),
        (None, None) => format!(
            "{head}: no variant builds ({})",
            r.unavailable
                .iter()
                .map(|u| format!(
                    "{}: {}",
                    u.variant,
                    gpuarch_core::text::first_line(&u.reason)
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

/// The job's end: done, or failed with one line per distinct reason
/// (`(what, why)` pairs), so that one missing NVRTC across every package
/// and arch is one reason and a count, not a line for each.
pub(super) fn finish(state: &Mutex<JobStatus>, failed: &[(String, String)], verb: &str) {
    if let Ok(mut s) = state.lock() {
        if failed.is_empty() {
            s.state = JobState::Done;
            s.message = format!("{} of {} {verb}", s.total, s.total);
        } else {
            s.state = JobState::Failed;
            s.message = format!(
                "{} of {} not {verb}: {}",
                failed.len(),
                s.total,
                by_reason(failed)
            );
        }
    }
}

/// `why (for a, b, c and N more)` per distinct reason, in first-seen order.
fn by_reason(failed: &[(String, String)]) -> String {
    const NAMED: usize = 4;
    let mut reasons: Vec<(&str, Vec<&str>)> = Vec::new();
    for (what, why) in failed {
        match reasons.iter_mut().find(|(w, _)| w == why) {
            Some((_, whats)) => whats.push(what),
            None => reasons.push((why, vec![what])),
        }
    }
    reasons
        .iter()
        .map(|(why, whats)| {
            let named = whats
                .iter()
                .take(NAMED)
                .copied()
                .collect::<Vec<_>>()
                .join(", ");
            let more = whats.len().saturating_sub(NAMED);
            if more > 0 {
                format!("{why} (for {named} and {more} more)")
            } else {
                format!("{why} (for {named})")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Run `tasks` as a job: built (or pulled) by `fetch`, pinned when `pin`.
pub async fn start_job(
    cache: Arc<Cache>,
    tasks: Vec<Task>,
    fetch: Fetch,
    pin: bool,
) -> zbus::Result<zbus::OwnedObjectPath> {
    let c = cache.clone();
    start_work(cache, tasks.len(), move |state| async move {
        c.run_job(tasks, fetch, pin, state).await;
    })
    .await
}

/// Run `work` (of `total` steps, counted in its [`JobStatus`]) as a job
/// whose object is served on the bus (now, and again after a reconnect);
/// emits progress and `Finished`, then leaves the object for late readers.
/// The job runs whether or not the bus is up.
pub async fn start_work<F, Fut>(
    cache: Arc<Cache>,
    total: usize,
    work: F,
) -> zbus::Result<zbus::OwnedObjectPath>
where
    F: FnOnce(Arc<Mutex<JobStatus>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let path = cache.new_job_path();
    let owned = zbus::OwnedObjectPath::try_from(path.clone())?;
    let state = Arc::new(Mutex::new(JobStatus {
        total,
        state: JobState::Running,
        ..JobStatus::default()
    }));
    cache.add_job(&path, state.clone());
    for conn in cache.shared.buses() {
        let job = Job {
            state: state.clone(),
        };
        conn.object_server().at(path.as_str(), job).await?;
    }
    let fut = work(state.clone());
    tokio::spawn(async move {
        let run = tokio::spawn(fut);
        // Progress as it goes, at most every 200 ms.
        let mut last = usize::MAX;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        while !run.is_finished() {
            tick.tick().await;
            let done = state.lock().map(|s| s.done).unwrap_or(0);
            if done != last {
                last = done;
                emit_progress(cache.shared.buses(), &path).await;
            }
        }
        let _ = run.await;
        emit_progress(cache.shared.buses(), &path).await;
        let (ok, msg) = state
            .lock()
            .map(|s| (s.state == JobState::Done, s.message.clone()))
            .unwrap_or((false, "job state lost".into()));
        if ok {
            info!("{path}: {msg}");
        } else {
            warn!("{path}: {msg}");
        }
        let conns = cache.shared.buses();
        for conn in &conns {
            if let Ok(iface) = conn
                .object_server()
                .interface::<_, Job>(path.as_str())
                .await
            {
                let em = iface.signal_emitter();
                let i = iface.get().await;
                let _ = i.state_changed(em).await;
                let _ = Job::finished(em, ok, &msg).await;
            }
        }
        for old in cache.retire_job(path) {
            for conn in &conns {
                let _ = conn.object_server().remove::<Job, _>(old.as_str()).await;
            }
        }
    });
    Ok(owned)
}

async fn emit_progress(conns: Vec<Connection>, path: &str) {
    for conn in conns {
        if let Ok(iface) = conn.object_server().interface::<_, Job>(path).await {
            let i = iface.get().await;
            let _ = i.progress_changed(iface.signal_emitter()).await;
        }
    }
}

/// `io.gpuarch1.Job`: one pre-warm.
/// (Served here, where jobs are made, so that the cache needs nothing of
/// the bus service that hands it requests.)
#[derive(Debug)]
pub struct Job {
    pub state: Arc<std::sync::Mutex<JobStatus>>,
}

/// A job on the kernel cache: a pre-warm, pull, push or import.
#[interface(name = "io.gpuarch1.Job")]
impl Job {
    /// Fraction of its steps (builds, pulls, pushes, files) finished, 0 to 1.
    #[zbus(property)]
    fn progress(&self) -> f64 {
        self.state.lock().map_or(0.0, |s| {
            if s.total == 0 {
                1.0
            } else {
                s.done as f64 / s.total as f64
            }
        })
    }

    /// "running", "done" (everything asked for is served) or "failed".
    #[zbus(property)]
    fn state(&self) -> JobState {
        self.state.lock().map_or(JobState::Failed, |s| s.state)
    }

    /// The outcome in one line, once finished.
    #[zbus(property(emits_changed_signal = "false"))]
    fn message(&self) -> String {
        self.state
            .lock()
            .map(|s| s.message.clone())
            .unwrap_or_default()
    }

    /// One line per finished step: `rmsnorm sm_75: built fp16`.
    #[zbus(property(emits_changed_signal = "false"))]
    fn log(&self) -> Vec<String> {
        self.state
            .lock()
            .map(|s| s.lines.clone())
            .unwrap_or_default()
    }

    /// The job ended: ok when everything asked for is served.
    #[zbus(signal)]
    pub async fn finished(emitter: &SignalEmitter<'_>, ok: bool, message: &str)
    -> zbus::Result<()>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// One missing NVRTC across packages and archs is one reason and a
    /// count, not a 2 KB line; distinct reasons stay apart, in order.
    #[test]
    fn job_failures_are_one_line_per_reason() {
        let nvrtc = "NVRTC (libnvrtc.so.13 or libnvrtc.so.12) not found: install ...";
        let mut failed: Vec<(String, String)> = ["saxpy", "rmsnorm", "rotary"]
            .iter()
            .flat_map(|p| ["sm_75", "sm_86"].map(|a| (format!("{p} {a}"), nvrtc.to_owned())))
            .collect();
        failed.insert(1, ("saxpy sm_90".into(), "no variant builds for it".into()));
        assert_eq!(
            by_reason(&failed),
            format!(
                "{nvrtc} (for saxpy sm_75, saxpy sm_86, rmsnorm sm_75, rmsnorm sm_86 and 2 more); no variant builds for it (for saxpy sm_90)"
            )
        );
    }
}
