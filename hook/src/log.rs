//! Where the hook's reasons go: the journal when this host has one, else
//! stderr. Nothing here can fail a container's start.

use std::path::Path;
use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;

static PROGRAM: OnceLock<(&'static str, bool)> = OnceLock::new();

const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// Pick the destination once per process. `program` names the lines on
/// stderr and is the journal's SYSLOG_IDENTIFIER.
pub fn init(program: &'static str) {
    let mut journal = false;
    if Path::new(JOURNAL_SOCKET).exists()
        && let Ok(layer) = tracing_journald::layer()
    {
        let sub =
            tracing_subscriber::registry().with(layer.with_syslog_identifier(program.to_owned()));
        journal = tracing::subscriber::set_global_default(sub).is_ok();
    }
    let _ = PROGRAM.set((program, journal));
}

fn program() -> (&'static str, bool) {
    PROGRAM.get().copied().unwrap_or(("gpuarch-hook", false))
}

/// A decision or a reason worth keeping (the Plan's notes).
pub fn info(msg: &str) {
    match program() {
        (_, true) => tracing::info!("{msg}"),
        (p, false) => eprintln!("{p}: {msg}"),
    }
}

/// Something went wrong and the container starts unchanged.
pub fn warn(msg: &str) {
    match program() {
        (_, true) => tracing::warn!("{msg}"),
        (p, false) => eprintln!("{p}: {msg}"),
    }
}

/// The start fails: the reason goes to stderr, where the engine shows it,
/// and to the journal when there is one.
pub fn fatal(msg: &str) {
    let (p, journal) = program();
    if journal {
        tracing::error!("{msg}");
    }
    eprintln!("{p}: {msg}");
}
