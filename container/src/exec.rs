//! Exec through a descriptor: what root runs (the OCI runtime, the host's
//! ldconfig) is the file that was opened and checked, never a path looked
//! up again.

use std::ffi::CString;
use std::os::fd::RawFd;

/// `v` as the NULL-terminated array of pointers `execve` takes; valid
/// while `v` lives.
pub(crate) fn ptrs(v: &[CString]) -> Vec<*const libc::c_char> {
    v.iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// `execveat(fd, "", argv, envp, AT_EMPTY_PATH)`; returns only on failure,
/// with the error. Only a system call, so it may run between `fork` and
/// `exec`.
///
/// # Safety
/// `fd` is open; `argv` and `envp` are NULL-terminated arrays of
/// NUL-terminated strings ([`ptrs`]) that outlive the call.
pub(crate) unsafe fn execveat_fd(
    fd: RawFd,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
) -> std::io::Error {
    // SAFETY: as the caller promises.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd,
            c"".as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
    }
    std::io::Error::last_os_error()
}
