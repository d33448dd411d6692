//! A file cut short under a reader that maps it: the reader faults
//! (SIGBUS) on the pages that are gone. For the tests of what gpuarchctl
//! says then.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A scratch directory in memory where the machine has one (`/dev/shm`):
/// the files written there for a reader to fault on are hundreds of MiB.
pub fn scratch_in_memory() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).expect("a scratch directory in /dev/shm")
    } else {
        tempfile::tempdir().expect("a scratch directory")
    }
}

/// Run `cmd()` (its output piped) and truncate `file` as soon as /proc
/// shows the process has it mapped, `fill` writing the file whole before
/// each run. A run that finished reading first is tried again, up to five
/// runs, until one's standard error says SIGBUS. Every run's output, the
/// last the one that said it unless none did.
pub fn truncated_under(
    mut cmd: impl FnMut() -> Command,
    file: &Path,
    fill: impl Fn(),
) -> Vec<Output> {
    let name = file.to_str().expect("a UTF-8 path");
    let mut outs = Vec::new();
    for _ in 0..5 {
        fill();
        let child = cmd()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the reader");
        let maps = format!("/proc/{}/maps", child.id());
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            // Gone (it finished) counts as mapped: truncate and go on.
            let mapped = std::fs::read_to_string(&maps).map_or(true, |m| m.contains(name));
            if mapped {
                break;
            }
            std::thread::yield_now();
        }
        cut(file);
        let o = child.wait_with_output().expect("wait for the reader");
        let said = String::from_utf8_lossy(&o.stderr).contains("SIGBUS");
        outs.push(o);
        if said {
            break;
        }
    }
    outs
}

/// `file` cut to nothing, in place (its inode kept: a mapping of it
/// faults).
pub fn cut(file: &Path) {
    std::fs::File::options()
        .write(true)
        .open(file)
        .and_then(|f| f.set_len(0))
        .expect("truncate the file");
}

/// Every run in `outs` exited with `code`, none by a signal, and the last
/// said "`prefix`: the file shrank while it was read (SIGBUS)".
pub fn assert_named_on_sigbus(outs: &[Output], prefix: &str, code: i32) {
    for o in outs {
        assert_eq!(
            o.status.code(),
            Some(code),
            "not a clear error: {:?} {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let said = String::from_utf8_lossy(&outs.last().expect("a run").stderr).into_owned();
    assert!(
        said.contains("SIGBUS"),
        "no run of {} was still reading when the file was cut: {said}",
        outs.len()
    );
    assert_eq!(
        said.trim_end(),
        format!(
            "{prefix}: the file shrank while it was read (SIGBUS): it was changed meanwhile; \
             run again once it is whole"
        )
    );
}
