//! Logging for gpuarchd: to the journal when systemd connected stderr to it
//! (`JOURNAL_STREAM` names stderr), else plain lines on stderr. The level is
//! `info`, `-v` for debug, `-vv` for trace; without `-v`, `RUST_LOG`
//! (`warn`, `gpuarch_daemon=debug`, ...) decides.

use std::os::fd::AsFd;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Is stderr the journal stream systemd gave us?
fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let Ok(st) = nix::sys::stat::fstat(std::io::stderr().as_fd()) else {
        return false;
    };
    dev.parse::<u64>().ok() == Some(st.st_dev) && ino.parse::<u64>().ok() == Some(st.st_ino)
}

/// Set up the global subscriber. Returns a warning to log once it is up
/// (an unreadable `RUST_LOG`).
pub fn init(verbose: u8) -> Option<String> {
    let mut warning = None;
    let filter: Targets = match (verbose, std::env::var("RUST_LOG")) {
        (0, Ok(spec)) if !spec.trim().is_empty() => spec.parse().unwrap_or_else(|e| {
            warning = Some(format!("RUST_LOG={spec:?} ignored: {e}"));
            Targets::new().with_default(tracing::Level::INFO)
        }),
        (0, _) => Targets::new().with_default(tracing::Level::INFO),
        (1, _) => Targets::new().with_default(tracing::Level::DEBUG),
        _ => Targets::new().with_default(tracing::Level::TRACE),
    };
    let registry = tracing_subscriber::registry().with(filter);
    if stderr_is_journal()
        && let Ok(journald) = tracing_journald::layer()
    {
        let _ = registry
            .with(journald.with_syslog_identifier("gpuarchd".to_owned()))
            .try_init();
    } else {
        let _ = registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(false)
                    .with_target(false),
            )
            .try_init();
    }
    warning
}
