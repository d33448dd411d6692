//! The unit's memory and system-call sandbox, applied to one command, for
//! hosts where systemd cannot run the unit itself (containers, VMs without
//! systemd as PID 1).
//!
//! - `PR_SET_MDWE` (`PR_MDWE_REFUSE_EXEC_GAIN`, Linux 6.3): what systemd 256
//!   and later use for `MemoryDenyWriteExecute=yes`;
//! - classic BPF seccomp programs, as `scripts/lib/seccomp-bpf.py` writes
//!   them from systemd's own lists: `@system-service` with
//!   `SystemCallErrorNumber=EPERM`, and the seccomp form of
//!   `MemoryDenyWriteExecute=` that older systemd installs.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};

/// What to apply before running the command.
#[derive(Debug, Default)]
pub struct Sandbox {
    pub mdwe: bool,
    pub bpf: Vec<PathBuf>,
}

impl Sandbox {
    /// Apply, then replace this process with `argv`. Returns only on error.
    pub fn exec(&self, argv: &[OsString]) -> Result<()> {
        let Some((prog, args)) = argv.split_first() else {
            bail!("no command to run");
        };
        // Read every program before the first is applied: once a filter is
        // on, the reads themselves may be refused.
        let programs: Vec<(PathBuf, Vec<u8>)> = self
            .bpf
            .iter()
            .map(|p| {
                Ok((
                    p.clone(),
                    std::fs::read(p).with_context(|| p.display().to_string())?,
                ))
            })
            .collect::<Result<_>>()?;
        if self.mdwe {
            // SAFETY: prctl with integer arguments only.
            let r = unsafe {
                libc::prctl(
                    libc::PR_SET_MDWE,
                    libc::PR_MDWE_REFUSE_EXEC_GAIN as libc::c_ulong,
                    0 as libc::c_ulong,
                    0 as libc::c_ulong,
                    0 as libc::c_ulong,
                )
            };
            if r != 0 {
                bail!("prctl(PR_SET_MDWE): {}", std::io::Error::last_os_error());
            }
        }
        for (path, prog) in &programs {
            load_bpf(prog).with_context(|| path.display().to_string())?;
        }
        let e = std::process::Command::new(prog).args(args).exec();
        bail!("exec {}: {e}", prog.to_string_lossy())
    }
}

/// Install one classic BPF program (8-byte `sock_filter`s) as a seccomp
/// filter, with `no_new_privs` as the kernel requires of non-root and
/// systemd sets for every sandboxed unit.
fn load_bpf(prog: &[u8]) -> Result<()> {
    if prog.is_empty() || !prog.len().is_multiple_of(8) || prog.len() / 8 > u16::MAX as usize {
        bail!("not a BPF program ({} bytes)", prog.len());
    }
    let filters: Vec<libc::sock_filter> = prog
        .chunks_exact(8)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    let fprog = libc::sock_fprog {
        len: filters.len() as u16,
        filter: filters.as_ptr().cast_mut(),
    };
    // SAFETY: integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        bail!(
            "prctl(PR_SET_NO_NEW_PRIVS): {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: `fprog` points at `filters`, which outlives the call; the
    // kernel copies the program.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
        )
    };
    if r != 0 {
        bail!("prctl(PR_SET_SECCOMP): {}", std::io::Error::last_os_error());
    }
    Ok(())
}
