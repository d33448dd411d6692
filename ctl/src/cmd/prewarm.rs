//! `gpuarchctl prewarm`: gpuarchd builds kernel packages ahead of time and
//! pins them; a progress bar follows its job. Exit status 1 when a build is
//! not served.

use std::fmt::Write as _;

use anyhow::Result;
use futures_util::StreamExt;
use gpuarch_wire::dbus::{JobProxy, JobState, KernelCacheProxy};
use serde_json::json;

use crate::cli::PrewarmArgs;
use crate::render;
use crate::source::{BusError, Daemon};

fn bar(json: bool) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(1000);
    if json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} pre-warming [{bar:40}] {percent:>3}% {elapsed}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

pub fn run(json: bool, d: Daemon, args: &PrewarmArgs, out: &mut String) -> Result<u8> {
    let e = |e| BusError::of("prewarm", e);
    let archs: Vec<&str> = args
        .arch
        .as_deref()
        .map(|l| {
            l.split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let pkgs: Vec<&str> = args.packages.iter().map(String::as_str).collect();
    // Starting the job is answered at once; the job then takes as long as
    // its builds take, and reports progress.
    let path = d.ask(async {
        let kc = KernelCacheProxy::new(&d.conn).await.map_err(e)?;
        kc.prewarm(&pkgs, &archs).await.map_err(e)
    })?;
    let bar = bar(json);
    d.wait(async {
        let job = JobProxy::builder(&d.conn)
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
    if json {
        render::json(
            out,
            &json!({"job": path.as_str(), "state": state, "message": message, "log": log}),
        )?;
    } else {
        for l in &log {
            let _ = writeln!(out, "{l}");
        }
        let _ = writeln!(out, "{state}: {message}");
    }
    Ok(u8::from(state != JobState::Done))
}
