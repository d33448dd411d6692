//! Jobs gpuarchd runs on the kernel cache, each followed with a progress
//! bar until it ends: `gpuarchctl prewarm` (build kernel packages ahead of
//! time and pin them), `prewarm --from-registry` and `kernels pull` (only
//! from the registry), `kernels push` and `kernels import`. A
//! `DIST==VERSION` among the packages of a pre-warm or a pull is a
//! consumer's library (`flashinfer-cubin==0.6.13`): pulled from the
//! registry and imported, never built. Exit status 1 when a job did not do
//! all it was asked.

use std::fmt::Write as _;

use anyhow::{Context as _, Result};
use futures_util::StreamExt;
use gpuarch_wire::dbus::{JobProxy, JobState, KernelCacheProxy};
use serde_json::json;

use crate::cli::{ImportArgs, PrewarmArgs, SelectArgs};
use crate::render;
use crate::source::{BusError, Daemon};

fn bar(json: bool, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(1000);
    if json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{spinner}} {what} [{{bar:40}}] {{percent:>3}}% {{elapsed}}"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// `7.5,8.6` as a list.
fn arch_list(arch: Option<&str>) -> Vec<&str> {
    arch.map(|l| {
        l.split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect()
    })
    .unwrap_or_default()
}

/// A consumer's library as asked for: (dist, version).
type Library<'a> = (&'a str, &'a str);

/// The packages of a pre-warm or pull apart from its libraries
/// (`DIST==VERSION`).
fn split_libraries(args: &[String]) -> Result<(Vec<&str>, Vec<Library<'_>>)> {
    let mut pkgs = Vec::new();
    let mut libs = Vec::new();
    for a in args {
        match a.split_once("==") {
            Some((dist, version)) if !dist.is_empty() && !version.is_empty() => {
                libs.push((dist.trim(), version.trim()));
            }
            Some(_) => {
                anyhow::bail!("{a:?}: a library is DIST==VERSION (flashinfer-cubin==0.6.13)")
            }
            None => pkgs.push(a.as_str()),
        }
    }
    Ok((pkgs, libs))
}

pub fn run(json: bool, d: Daemon, args: &PrewarmArgs, out: &mut String) -> Result<u8> {
    let pick = SelectArgs {
        packages: args.packages.clone(),
        arch: args.arch.clone(),
    };
    if args.from_registry {
        return pull(json, d, &pick, true, out);
    }
    let (pkgs, libs) = split_libraries(&args.packages)?;
    let mut jobs = Jobs::default();
    pull_libraries(json, &d, &libs, &mut jobs)?;
    if libs.is_empty() || !pkgs.is_empty() {
        let archs = arch_list(args.arch.as_deref());
        let e = |e| BusError::of("prewarm", e);
        // Starting the job is answered at once; the job then takes as long
        // as its builds take, and reports progress.
        let path = d.ask(async {
            let kc = d.proxy::<KernelCacheProxy>().await.map_err(e)?;
            kc.prewarm(&pkgs, &archs).await.map_err(e)
        })?;
        jobs.add(follow(json, &d, path, "pre-warming")?);
    }
    jobs.render(json, out)
}

/// Pull `args` from the registry, pinning when `pin` (a pre-warm).
pub fn pull(json: bool, d: Daemon, args: &SelectArgs, pin: bool, out: &mut String) -> Result<u8> {
    let (pkgs, libs) = split_libraries(&args.packages)?;
    let mut jobs = Jobs::default();
    pull_libraries(json, &d, &libs, &mut jobs)?;
    if libs.is_empty() || !pkgs.is_empty() {
        let archs = arch_list(args.arch.as_deref());
        let e = |e| BusError::of("pull", e);
        let path = d.ask(async {
            let kc = d.proxy::<KernelCacheProxy>().await.map_err(e)?;
            kc.pull(&pkgs, &archs, pin).await.map_err(e)
        })?;
        jobs.add(follow(json, &d, path, "pulling")?);
    }
    jobs.render(json, out)
}

/// Pull and import each library from the registry, a job each.
fn pull_libraries(json: bool, d: &Daemon, libs: &[Library<'_>], jobs: &mut Jobs) -> Result<()> {
    for (dist, version) in libs {
        let e = |e| BusError::of("pull", e);
        let path = d.ask(async {
            let kc = d.proxy::<KernelCacheProxy>().await.map_err(e)?;
            kc.pull_library(dist, version).await.map_err(e)
        })?;
        jobs.add(follow(json, d, path, "pulling")?);
    }
    Ok(())
}

pub fn push(json: bool, d: Daemon, args: &SelectArgs, out: &mut String) -> Result<u8> {
    let archs = arch_list(args.arch.as_deref());
    let (pkgs, libs) = split_libraries(&args.packages)?;
    if let Some((dist, version)) = libs.first() {
        // The node keeps the unpacked files, not the wheel they came in.
        anyhow::bail!(
            "{dist} {version} is pushed as it is imported, with kernels.remote.push on: \
             gpuarchctl kernels import-wheel its wheel again"
        );
    }
    let e = |e| BusError::of("push", e);
    let path = d.ask(async {
        let kc = d.proxy::<KernelCacheProxy>().await.map_err(e)?;
        kc.push(&pkgs, &archs).await.map_err(e)
    })?;
    follow(json, &d, path, "pushing")?.render(json, out)
}

/// The files are opened here, as the caller, and passed to gpuarchd as
/// descriptors: it reads what the caller may read, wherever it is.
pub fn import(json: bool, d: Daemon, args: &ImportArgs, out: &mut String) -> Result<u8> {
    let mut files = Vec::new();
    for p in &args.files {
        files.push(open_named(p)?);
    }
    let e = |e| BusError::of("import", e);
    let path = d.ask(async {
        let kc = d.proxy::<KernelCacheProxy>().await.map_err(e)?;
        let fds: Vec<(&str, zbus::Fd<'_>)> = files
            .iter()
            .map(|(n, f)| (n.as_str(), zbus::Fd::from(f)))
            .collect();
        kc.import(&args.name, &fds, args.ldconfig).await.map_err(e)
    })?;
    follow(json, &d, path, "importing")?.render(json, out)
}

/// The wheel is opened here, as the caller, and passed as a descriptor.
pub fn import_wheel(
    json: bool,
    d: Daemon,
    wheel: &std::path::Path,
    out: &mut String,
) -> Result<u8> {
    let (name, f) = open_named(wheel)?;
    let e = |e| BusError::of("import-wheel", e);
    let path = d.ask(async {
        let kc = d.proxy::<KernelCacheProxy>().await.map_err(e)?;
        kc.import_library(zbus::Fd::from(&f), &name)
            .await
            .map_err(e)
    })?;
    follow(json, &d, path, "importing")?.render(json, out)
}

/// `p` opened for reading, as the caller, with its file name.
fn open_named(p: &std::path::Path) -> Result<(String, std::fs::File)> {
    let f = std::fs::File::open(p).with_context(|| format!("{}", p.display()))?;
    let name = p
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: no file name", p.display()))?
        .to_owned();
    Ok((name, f))
}

/// A job that ended: where it was, and what it says.
struct Ended {
    path: zbus::OwnedObjectPath,
    state: JobState,
    message: String,
    log: Vec<String>,
}

impl Ended {
    fn value(&self) -> serde_json::Value {
        json!({"job": self.path.as_str(), "state": self.state, "message": self.message, "log": self.log})
    }

    fn render(self, json: bool, out: &mut String) -> Result<u8> {
        let mut jobs = Jobs::default();
        jobs.add(self);
        jobs.render(json, out)
    }
}

/// The jobs of one command: one is shown as it always was, several as
/// `{"jobs": [...]}` under `--json`.
#[derive(Default)]
struct Jobs(Vec<Ended>);

impl Jobs {
    fn add(&mut self, e: Ended) {
        self.0.push(e);
    }

    /// Exit status 1 when any did not do all it was asked.
    fn render(self, json: bool, out: &mut String) -> Result<u8> {
        let failed = self.0.iter().any(|j| j.state != JobState::Done);
        if json {
            match self.0.as_slice() {
                [one] => render::json(out, &one.value())?,
                all => render::json(
                    out,
                    &json!({"jobs": all.iter().map(Ended::value).collect::<Vec<_>>()}),
                )?,
            }
        } else {
            for j in &self.0 {
                for l in &j.log {
                    let _ = writeln!(out, "{l}");
                }
                let _ = writeln!(out, "{}: {}", j.state, j.message);
            }
        }
        Ok(u8::from(failed))
    }
}

/// Follow the job at `path` to its end: a progress bar, then its log and
/// outcome.
fn follow(
    json: bool,
    d: &Daemon,
    path: zbus::OwnedObjectPath,
    what: &'static str,
) -> Result<Ended> {
    let e = |e| BusError::of(what, e);
    let bar = bar(json, what);
    d.wait(async {
        let job = JobProxy::builder(&d.conn)
            .destination(d.dest)
            .path(path.clone())
            .build()
            .await
            .map_err(e)?;
        let mut finished = job.receive_finished().await.map_err(e)?;
        let mut progress = job.receive_progress_changed().await;
        // The job may have finished before we listened.
        if job.state().await.map_err(e)? == JobState::Running {
            loop {
                tokio::select! {
                    p = progress.next() => {
                        if let Some(p) = p && let Ok(v) = p.get().await {
                            bar.set_position((v * 1000.0) as u64);
                        }
                    }
                    _ = finished.next() => break,
                }
            }
        }
        Ok::<_, BusError>(())
    })?;
    bar.finish_and_clear();
    // Message and Log emit no change signals: read them fresh, not cached.
    let (state, message, log) = d.ask(async {
        let job = JobProxy::builder(&d.conn)
            .destination(d.dest)
            .path(path.clone())
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(e)?;
        Ok((
            job.state().await.map_err(e)?,
            job.message().await.map_err(e)?,
            job.log().await.map_err(e)?,
        ))
    })?;
    Ok(Ended {
        path,
        state,
        message,
        log,
    })
}
