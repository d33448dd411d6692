//! `peak-rss FILE PROGRAM ARGS...`: run PROGRAM with this process's stdio,
//! then write its peak resident memory in KiB to FILE and exit with its
//! status. For tests that bound a program's memory: measured from this small
//! process, the figure is the program's own, not that of a large test
//! process it would otherwise be spawned from.

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let [file, program, rest @ ..] = args.as_slice() else {
        eprintln!("usage: peak-rss FILE PROGRAM ARGS...");
        return ExitCode::from(2);
    };
    let status = match Command::new(program).args(rest).status() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("peak-rss: {}: {e}", program.to_string_lossy());
            return ExitCode::from(127);
        }
    };
    let peak = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|u| u.max_rss())
        .unwrap_or(-1);
    if let Err(e) = std::fs::write(file, peak.to_string()) {
        eprintln!("peak-rss: {}: {e}", file.to_string_lossy());
        return ExitCode::from(125);
    }
    match status.code() {
        Some(c) => ExitCode::from(c as u8),
        None => ExitCode::from(128),
    }
}
