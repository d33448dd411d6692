//! Logging for gpuarchd: to the journal when systemd connected stderr to it
//! (`JOURNAL_STREAM` names stderr), else plain lines on stderr. The level is
//! `info`, `-v` for debug, `-vv` for trace; without `-v`, `RUST_LOG`
//! (`warn`, `gpuarch_daemon=debug`, ...) decides.
//!
//! On stderr each event is one line: what a message carries (a file name
//! from a container's JIT cache, a bus caller's argument) has its control
//! characters escaped and is bounded ([`gpuarch_core::text::clean`]). The
//! journal keeps each event a record of its own fields, so nothing there
//! can forge another.

use std::io::Write;
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
                    .with_writer(|| OneLine::to(std::io::stderr()))
                    .with_ansi(false)
                    .with_target(false),
            )
            .try_init();
    }
    warning
}

/// A writer that takes one event and writes it, on drop, as one clean line.
struct OneLine<W: Write> {
    buf: Vec<u8>,
    out: W,
}

impl<W: Write> OneLine<W> {
    fn to(out: W) -> Self {
        Self {
            buf: Vec::new(),
            out,
        }
    }
}

impl<W: Write> Write for OneLine<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<W: Write> Drop for OneLine<W> {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.buf);
        let text = text.strip_suffix('\n').unwrap_or(&text);
        if text.is_empty() {
            return;
        }
        let line = format!("{}\n", gpuarch_core::text::clean(text));
        let _ = self.out.write_all(line.as_bytes());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_one_line_whatever_its_message_carries() {
        let mut out = Vec::new();
        {
            let mut w = OneLine::to(&mut out);
            w.write_all(b"2026-11-24T00:00:00Z  WARN JIT cache /c/x\n2026-11-24T00:00:01Z  INFO ")
                .unwrap();
            w.write_all(b"forged\x1b[2J\n").unwrap();
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "2026-11-24T00:00:00Z  WARN JIT cache /c/x\\n2026-11-24T00:00:01Z  INFO forged\\u{1b}[2J\n"
        );
    }
}
