//! Where the hook's and the shim's lines go. Run by an engine, their stderr
//! is often the container's own (the shim's on `create` is the container's
//! stdio under containerd and Docker), so a line there would land in the
//! workload's output and `docker logs`. By default (`log.to: auto`) they go
//! to stderr only when it is a terminal, else to the journal, else to
//! syslog's `/dev/log`, else to `log.file`, capped at `log.max_bytes` with
//! one rotation. `GPUARCH_LOG` (`stderr`, `debug`, `file,debug`, ...)
//! overrides the config. Nothing here can fail a container's start.
//!
//! A refusal ([`fatal`]) must reach the user through the engine's error: it
//! goes to the runtime log an engine names with `--log` (runc's format, which
//! containerd, Docker and podman read back into their error), else to
//! stderr, which runc and podman capture from a failing hook.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use gpuarch_core::config::{LogConfig, LogLevel, LogTarget};
use tracing_subscriber::layer::SubscriberExt;

/// Overrides `log.to` and `log.level`: a comma-separated target and level.
pub const LOG_ENV: &str = "GPUARCH_LOG";

const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";
const SYSLOG_SOCKET: &str = "/dev/log";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sink {
    Stderr,
    Journal,
    Syslog,
    File,
}

#[derive(Debug)]
struct State {
    program: &'static str,
    /// `log.to` under `GPUARCH_LOG`.
    to: LogTarget,
    /// `to` resolved, on the first line: most invocations (the shim's
    /// pass-through `start`, `delete`, ...) log nothing and pay nothing.
    sink: Option<Sink>,
    level: LogLevel,
    file: PathBuf,
    max_bytes: u64,
    /// The engine's runtime log (`--log`) and whether it is JSON.
    runtime_log: Option<(PathBuf, bool)>,
    journal_installed: bool,
    /// The container the lines are about, once known.
    who: Who,
}

/// A container's id and names, as every line carries them: journal
/// fields, and a `container=… pod=…:` head on text lines.
#[derive(Debug, Default, Clone)]
struct Who {
    /// Docker's journald convention: `CONTAINER_ID` is the 12-digit short
    /// id of a 64-digit one (what `docker ps` shows), else the whole id;
    /// `CONTAINER_ID_FULL` the whole id.
    short: Option<String>,
    full: Option<String>,
    name: Option<String>,
    pod: Option<String>,
    namespace: Option<String>,
    /// The head of a text line: empty when nothing is known.
    head: String,
}

fn state() -> MutexGuard<'static, State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            Mutex::new(State {
                program: "gpuarch-hook",
                to: LogTarget::Auto,
                sink: None,
                level: LogLevel::Info,
                file: PathBuf::from(gpuarch_core::config::DEFAULT_LOG_FILE),
                max_bytes: 1 << 20,
                runtime_log: None,
                journal_installed: false,
                who: Who::default(),
            })
        })
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// `GPUARCH_LOG`, split into a target and a level; unknown words are
/// ignored (a typo must not turn logging into a failure).
fn env_override(v: Option<OsString>) -> (Option<LogTarget>, Option<LogLevel>) {
    let (mut to, mut level) = (None, None);
    if let Some(v) = v {
        for w in v.to_string_lossy().split(',').map(str::trim) {
            if let Ok(t) = w.parse() {
                to = Some(t);
            } else if let Ok(l) = w.parse() {
                level = Some(l);
            }
        }
    }
    (to, level)
}

/// Name the program (the journal's SYSLOG_IDENTIFIER, the prefix of every
/// other line) and take the default config; [`configure`] once the config
/// is read.
pub fn init(program: &'static str) {
    state().program = program;
    configure(&LogConfig::default());
}

/// Apply the config's `log:` section, under `GPUARCH_LOG`.
pub fn configure(cfg: &LogConfig) {
    let (to, level) = env_override(std::env::var_os(LOG_ENV));
    let mut s = state();
    s.to = to.unwrap_or(cfg.to);
    s.sink = None;
    s.level = level.unwrap_or(cfg.level);
    s.file = cfg.file.clone();
    s.max_bytes = cfg.max_bytes;
}

/// Where lines go now: `to` resolved (once), the journal's subscriber
/// installed when it is the journal.
fn sink(s: &mut State) -> Sink {
    if let Some(sink) = s.sink {
        return sink;
    }
    let sink = match s.to {
        LogTarget::Stderr => Sink::Stderr,
        LogTarget::Journal => Sink::Journal,
        LogTarget::Syslog => Sink::Syslog,
        LogTarget::File => Sink::File,
        LogTarget::Auto if std::io::stderr().is_terminal() => Sink::Stderr,
        LogTarget::Auto if Path::new(JOURNAL_SOCKET).exists() => Sink::Journal,
        LogTarget::Auto if Path::new(SYSLOG_SOCKET).exists() => Sink::Syslog,
        LogTarget::Auto => Sink::File,
    };
    if sink == Sink::Journal && !s.journal_installed {
        let program = s.program;
        s.journal_installed = tracing_journald::layer().is_ok_and(|layer| {
            // Fields by their own names (CONTAINER_ID), as Docker's
            // journald driver names them, not under the default `F_`.
            let sub = tracing_subscriber::registry().with(
                layer
                    .with_syslog_identifier(program.to_owned())
                    .with_field_prefix(None),
            );
            tracing::subscriber::set_global_default(sub).is_ok()
        });
    }
    s.sink = Some(sink);
    sink
}

/// The container every later line is about: its id (from the OCI state,
/// the runtime's arguments, or the config) and the names its config gives.
/// What was known before stays when a later call knows less.
pub fn set_container(id: Option<&str>, names: &gpuarch_core::oci::Names) {
    let mut s = state();
    let w = &mut s.who;
    let id = id.or(names.id.as_deref());
    if let Some(id) = id {
        let mut end = id.len().min(gpuarch_core::record::MAX_ID_BYTES);
        while !id.is_char_boundary(end) {
            end -= 1;
        }
        let id = clean(&id[..end]).into_owned();
        let hex = id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit());
        w.short = Some(if hex { id[..12].to_owned() } else { id.clone() });
        w.full = Some(id);
    }
    let keep = |slot: &mut Option<String>, v: &Option<String>| {
        if let Some(v) = v {
            *slot = Some(clean(v).into_owned());
        }
    };
    keep(&mut w.name, &names.name);
    keep(&mut w.pod, &names.pod);
    keep(&mut w.namespace, &names.namespace);
    let mut head = String::new();
    if let Some(id) = &w.full {
        head.push_str(&format!("container={id} "));
    }
    if let Some(n) = &w.name {
        head.push_str(&format!("name={n} "));
    }
    match (&w.namespace, &w.pod) {
        (Some(ns), Some(p)) => head.push_str(&format!("pod={ns}/{p} ")),
        (None, Some(p)) => head.push_str(&format!("pod={p} ")),
        _ => {}
    }
    if !head.is_empty() {
        head.pop();
        head.push_str(": ");
    }
    w.head = head;
}

/// The runtime log an engine passed to the shim (`--log PATH`, with
/// `--log-format json` or text): where a refusal is written for the
/// engine to read back.
pub fn set_runtime_log(path: PathBuf, json: bool) {
    state().runtime_log = Some((path, json));
}

/// The Plan's notes: at `info`, or at `debug` when the container asked
/// for no GPU (most containers on most hosts: not worth a line each).
pub fn plan(plan: &gpuarch_core::plan::Plan) {
    let level = if plan.source.is_some() {
        LogLevel::Info
    } else {
        LogLevel::Debug
    };
    let notes: Vec<&str> = plan.notes.iter().map(String::as_str).collect();
    emit_all(level, &notes);
}

/// Detail: only with `level: debug` ("no GPU requested" and the like).
pub fn debug(msg: &str) {
    emit(LogLevel::Debug, msg);
}

/// A decision or a reason worth keeping (the Plan's notes).
pub fn info(msg: &str) {
    emit(LogLevel::Info, msg);
}

/// Something went wrong and the container starts unchanged.
pub fn warn(msg: &str) {
    emit(LogLevel::Warn, msg);
}

/// The start fails: the reason goes to the log and to the engine (its
/// runtime log, else stderr).
pub fn fatal(msg: &str) {
    emit(LogLevel::Error, msg);
    let mut s = state();
    let program = s.program;
    let msg = clean(msg);
    let msg = msg.as_ref();
    let to_engine = match &s.runtime_log {
        Some((path, json)) => append_runtime_log(path, *json, program, msg).is_ok(),
        None => false,
    };
    if !to_engine && sink(&mut s) != Sink::Stderr {
        eprintln!("{program}: {msg}");
    }
}

fn emit(level: LogLevel, msg: &str) {
    emit_all(level, &[msg]);
}

pub use gpuarch_core::text::{MAX_RECORD_BYTES, clean};

/// Each of `msgs` a line. To a file they go in one `write` (a line each
/// cost an open and a write of its own: on a disk filesystem most of what
/// the notes of a container start cost).
fn emit_all(level: LogLevel, msgs: &[&str]) {
    let mut s = state();
    if level > s.level || msgs.is_empty() {
        return;
    }
    let cleaned: Vec<std::borrow::Cow<'_, str>> = msgs.iter().map(|m| clean(m)).collect();
    let program = s.program;
    let sink = sink(&mut s);
    if sink == Sink::Journal && s.journal_installed {
        // The container in fields to filter on, and in the text too: what
        // `journalctl -t gpuarch-hook` shows names it.
        let w = &s.who;
        for msg in &cleaned {
            journal(level, w, &clean(&format!("{}{msg}", w.head)));
        }
        return;
    }
    // Text lines carry the container in their head.
    let headed: Vec<String>;
    let msgs: Vec<&str> = if s.who.head.is_empty() {
        cleaned.iter().map(|m| m.as_ref()).collect()
    } else {
        // Cleaned again whole: a record stays one line of at most 4 KiB,
        // head included (escaped text passes unchanged).
        headed = cleaned
            .iter()
            .map(|m| clean(&format!("{}{m}", s.who.head)).into_owned())
            .collect();
        headed.iter().map(String::as_str).collect()
    };
    let msgs = msgs.as_slice();
    match sink {
        Sink::Stderr => msgs.iter().for_each(|msg| eprintln!("{program}: {msg}")),
        Sink::Journal | Sink::Syslog => {
            let failed: Vec<&str> = msgs
                .iter()
                .copied()
                .filter(|msg| syslog(level, program, msg).is_err())
                .collect();
            if !failed.is_empty() {
                let _ = to_file(&s.file, s.max_bytes, level, program, &failed);
            }
        }
        Sink::File => {
            let _ = to_file(&s.file, s.max_bytes, level, program, msgs);
        }
    }
}

/// One journal entry: the message, and the container in fields an admin
/// filters on (`journalctl CONTAINER_ID=3f2a9c1e5b7d`); a field not known
/// is not sent.
fn journal(level: LogLevel, w: &Who, msg: &str) {
    macro_rules! at {
        ($level:expr) => {
            tracing::event!(
                $level,
                container_id = w.short.as_deref(),
                container_id_full = w.full.as_deref(),
                container_name = w.name.as_deref(),
                pod_name = w.pod.as_deref(),
                pod_namespace = w.namespace.as_deref(),
                "{msg}"
            )
        };
    }
    match level {
        LogLevel::Error => at!(tracing::Level::ERROR),
        LogLevel::Warn => at!(tracing::Level::WARN),
        LogLevel::Info => at!(tracing::Level::INFO),
        LogLevel::Debug => at!(tracing::Level::DEBUG),
    }
}

fn syslog(level: LogLevel, program: &str, msg: &str) -> std::io::Result<()> {
    // Facility daemon (3); severities err, warning, info, debug.
    let severity = match level {
        LogLevel::Error => 3,
        LogLevel::Warn => 4,
        LogLevel::Info => 6,
        LogLevel::Debug => 7,
    };
    let line = format!(
        "<{}>{program}[{}]: {msg}",
        3 * 8 + severity,
        std::process::id()
    );
    let sock = UnixDatagram::unbound()?;
    sock.send_to(line.as_bytes(), SYSLOG_SOCKET).map(|_| ())
}

fn level_word(level: LogLevel) -> &'static str {
    match level {
        LogLevel::Error => "error",
        LogLevel::Warn => "warn",
        LogLevel::Info => "info",
        LogLevel::Debug => "debug",
    }
}

/// `path` opened to append, only where it is a regular file: a FIFO put
/// there (in a sticky directory anyone can write to) would block a start
/// until its timeout, and a device would be written to. Opened without
/// blocking (a FIFO with no reader fails at once), then checked.
fn open_append(path: &Path) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    if !f.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other(format!(
            "{}: not a regular file",
            path.display()
        )));
    }
    Ok(f)
}

/// A line per message, all in one `write`, to `path`; past `max_bytes` the file is first
/// renamed to `<path>.1`. Hooks of many containers append at once: the
/// rename happens under an exclusive lock and only while `path` is still
/// the file that was found too big.
fn to_file(
    path: &Path,
    max_bytes: u64,
    level: LogLevel,
    program: &str,
    msgs: &[&str],
) -> std::io::Result<()> {
    let mut f = open_append(path)?;
    if f.metadata()?.len() >= max_bytes {
        let held = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| std::io::Error::from(e))?;
        let meta = held.metadata()?;
        let current = std::fs::symlink_metadata(path)?;
        if current.ino() == meta.ino() && current.dev() == meta.dev() && meta.len() >= max_bytes {
            let mut old = path.as_os_str().to_owned();
            old.push(".1");
            std::fs::rename(path, old)?;
        }
        drop(held);
        f = open_append(path)?;
    }
    let head = format!(
        "{} {program}[{}] {}: ",
        humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
        std::process::id(),
        level_word(level)
    );
    let mut lines = String::new();
    for msg in msgs {
        lines.push_str(&head);
        lines.push_str(msg);
        lines.push('\n');
    }
    f.write_all(lines.as_bytes())
}

/// A line in runc's own log format, which containerd's shim and podman
/// read back (the last `error`) into the error they report.
fn append_runtime_log(path: &Path, json: bool, program: &str, msg: &str) -> std::io::Result<()> {
    let time = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let text = format!("{program}: {msg}");
    let line = if json {
        serde_json::json!({"level": "error", "msg": text, "time": time}).to_string() + "\n"
    } else {
        format!(
            "time=\"{time}\" level=error msg={}\n",
            serde_json::json!(text)
        )
    };
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)?;
    f.write_all(line.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_or_a_device_at_the_log_file_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("hook.log");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let t = std::time::Instant::now();
        // No reader: the open fails rather than waits for one.
        assert!(to_file(&fifo, 1 << 20, LogLevel::Warn, "gpuarch-hook", &["x"]).is_err());
        // A reader there: opened, and refused as not a regular file.
        let _reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let e = to_file(&fifo, 1 << 20, LogLevel::Warn, "gpuarch-hook", &["x"]).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = to_file(
            Path::new("/dev/null"),
            1 << 20,
            LogLevel::Warn,
            "gpuarch-hook",
            &["x"],
        )
        .unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        // A regular file is written as before.
        let file = dir.path().join("ok.log");
        to_file(&file, 1 << 20, LogLevel::Warn, "gpuarch-hook", &["x"]).unwrap();
        assert!(
            std::fs::read_to_string(&file)
                .unwrap()
                .ends_with("warn: x\n")
        );
    }

    #[test]
    fn a_record_is_one_bounded_line_whatever_it_carries() {
        assert_eq!(clean("plain note"), "plain note");
        let forged = "image x\n2026-11-24T00:00:00Z gpuarch-hook[1] info: all is well";
        let c = clean(forged);
        assert!(!c.contains('\n'), "{c}");
        assert!(c.starts_with("image x\\n2026"), "{c}");
        assert_eq!(
            clean("a\u{1b}[2Jb\rc\u{85}d\u{7f}"),
            "a\\u{1b}[2Jb\\rc\\u{85}d\\u{7f}"
        );
        let huge = "v".repeat(12 << 20);
        let c = clean(&huge);
        assert!(c.len() < MAX_RECORD_BYTES + 64, "{}", c.len());
        assert!(
            c.ends_with(&format!(
                "[{} more bytes cut]",
                (12 << 20) - MAX_RECORD_BYTES
            )),
            "{}",
            &c[c.len() - 40..]
        );
        // Multi-byte characters are never split.
        let wide = "é".repeat(MAX_RECORD_BYTES);
        assert!(clean(&wide).is_char_boundary(0));
        // A record to the file: one line, bounded, for a 12 MiB value with
        // newlines in it.
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("log");
        let msg = format!(
            "TORCH_CUDA_ARCH_LIST={}",
            "8.6\nfake line\n".repeat(1 << 20)
        );
        let cleaned = clean(&msg);
        to_file(
            &f,
            1 << 30,
            LogLevel::Info,
            "gpuarch-hook",
            &[cleaned.as_ref()],
        )
        .unwrap();
        let text = std::fs::read_to_string(&f).unwrap();
        assert_eq!(text.lines().count(), 1, "{}", &text[..200]);
        assert!(text.len() < MAX_RECORD_BYTES + 128);
    }

    #[test]
    fn a_line_naming_a_container_is_still_one_bounded_line() {
        // The only test here that goes through the process-wide state.
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("g.log");
        if std::env::var_os(LOG_ENV).is_some() {
            return; // GPUARCH_LOG would override the file target
        }
        configure(&LogConfig {
            to: LogTarget::File,
            file: f.clone(),
            ..LogConfig::default()
        });
        let long = "p\n".repeat(300);
        let names = gpuarch_core::oci::Names {
            name: Some(long.clone()),
            pod: Some(long.clone()),
            namespace: Some(long),
            ..Default::default()
        };
        set_container(Some(&"c".repeat(10_000)), &names);
        info(&"m".repeat(8000));
        let text = std::fs::read_to_string(&f).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let line = text.lines().next().unwrap();
        assert!(line.len() <= MAX_RECORD_BYTES + 128, "{}", line.len());
        assert!(
            line.contains(&format!("container={} ", "c".repeat(256))),
            "{line}"
        );
        assert!(line.contains("name=p\\np\\n"), "{line}");
        assert!(line.ends_with("more bytes cut]"), "{line}");
    }

    #[test]
    fn the_env_names_a_target_a_level_or_both() {
        let o = |s: &str| env_override(Some(s.into()));
        assert_eq!(o("stderr"), (Some(LogTarget::Stderr), None));
        assert_eq!(o("debug"), (None, Some(LogLevel::Debug)));
        assert_eq!(
            o("file, warn"),
            (Some(LogTarget::File), Some(LogLevel::Warn))
        );
        assert_eq!(o("loud"), (None, None));
        assert_eq!(env_override(None), (None, None));
    }

    #[test]
    fn the_file_is_capped_with_one_rotation() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("g.log");
        for i in 0..200 {
            to_file(
                &f,
                4096,
                LogLevel::Info,
                "t",
                &[&format!("line {i} {}", "x".repeat(40))],
            )
            .unwrap();
        }
        let cur = std::fs::metadata(&f).unwrap().len();
        let old = std::fs::metadata(d.path().join("g.log.1")).unwrap().len();
        assert!(
            cur < 4096 + 200 && (4096..4096 + 200).contains(&old),
            "{cur} {old}"
        );
        let last = std::fs::read_to_string(&f).unwrap();
        assert!(
            last.trim_end()
                .ends_with(&format!("line 199 {}", "x".repeat(40)))
        );
        assert!(last.contains(" t["), "{last}");
        // A batch: one line each, each with its own head.
        to_file(&f, 1 << 20, LogLevel::Warn, "t", &["a", "b", "c"]).unwrap();
        let text = std::fs::read_to_string(&f).unwrap();
        let tail: Vec<&str> = text.lines().rev().take(3).collect();
        for (line, m) in tail.iter().zip(["c", "b", "a"]) {
            assert!(
                line.contains(" t[") && line.ends_with(&format!("] warn: {m}")),
                "{line}"
            );
        }
    }

    #[test]
    fn a_symlink_at_the_log_path_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        std::os::unix::fs::symlink(&target, d.path().join("g.log")).unwrap();
        assert!(to_file(&d.path().join("g.log"), 4096, LogLevel::Info, "t", &["m"]).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "");
    }

    #[test]
    fn runtime_log_lines_are_runcs_format() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("log.json");
        append_runtime_log(&f, true, "gpuarch-runtime", "no \"GPU\"").unwrap();
        let v: serde_json::Value =
            serde_json::from_str(std::fs::read_to_string(&f).unwrap().trim()).unwrap();
        assert_eq!(v["level"], "error");
        assert_eq!(v["msg"], "gpuarch-runtime: no \"GPU\"");
        assert!(v["time"].as_str().unwrap().ends_with('Z'));
        let t = d.path().join("log.txt");
        append_runtime_log(&t, false, "p", "m").unwrap();
        assert!(
            std::fs::read_to_string(&t)
                .unwrap()
                .contains("level=error msg=\"p: m\"")
        );
    }
}
