//! Reading stored files without holding them: a digest read in 1 MiB
//! pieces, and a read-only mapping for the inspector, whose pages stay in
//! the page cache (the kernel reclaims them) instead of gpuarchd's heap.
//! A kernel package output or an imported library may be gigabytes; what
//! gpuarchd keeps of one is its digest and the targets it carries.
//!
//! A mapped file that shrinks meanwhile faults its reader (SIGBUS); a
//! command that maps files others may change installs
//! [`exit_clearly_on_sigbus`] to name the file and exit, not die with "Bus
//! error".

use std::ffi::{CStr, CString, c_char, c_void};
use std::fs::File;
use std::io::{self, Read, Write};
use std::num::NonZeroUsize;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::{NonNull, null_mut};
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

use sha2::{Digest, Sha256};

use crate::spec::hex;

const PIECE: usize = 1 << 20;

/// The sha256 (hex) and length of what `r` yields.
pub fn sha256_of(r: impl Read) -> io::Result<(String, u64)> {
    copy_hashed(r, io::sink(), u64::MAX)
}

/// Copy at most `limit` bytes of `from` to `to`, hashing as it goes: the
/// sha256 (hex) and the bytes copied. More than `limit` is an error of
/// kind `FileTooLarge`, and `to` has then had `limit` bytes at most.
pub fn copy_hashed(
    mut from: impl Read,
    mut to: impl Write,
    limit: u64,
) -> io::Result<(String, u64)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; PIECE];
    let mut n = 0u64;
    loop {
        let got = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        n += got as u64;
        if n > limit {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("larger than {limit} bytes"),
            ));
        }
        h.update(&buf[..got]);
        to.write_all(&buf[..got])?;
    }
    Ok((hex(&h.finalize()), n))
}

/// A file's bytes, mapped read-only and private.
///
/// A file that shrinks while mapped faults its reader (SIGBUS), so map
/// only files nobody but root writes meanwhile: gpuarchd's own staged
/// copy of an import, a finished build's outputs, a stored entry.
#[derive(Debug)]
pub struct Mapped {
    map: Option<(NonNull<c_void>, usize)>,
}

impl Mapped {
    pub fn new(f: &File) -> io::Result<Self> {
        let len = usize::try_from(f.metadata()?.len()).map_err(io::Error::other)?;
        let Some(n) = NonZeroUsize::new(len) else {
            return Ok(Self { map: None });
        };
        use nix::sys::mman::{MapFlags, ProtFlags, mmap};
        // SAFETY: a fresh mapping at an address the kernel picks, of a
        // file opened for reading; nothing aliases it. Its validity while
        // mapped is the caller's promise above.
        let p = unsafe { mmap(None, n, ProtFlags::PROT_READ, MapFlags::MAP_PRIVATE, f, 0) }?;
        Ok(Self {
            map: Some((p, len)),
        })
    }

    /// Say the mapping is read here and there, not through: a fault then
    /// reads its page alone, not a readahead window around it. The
    /// inspector reads a `.nv_fatbin` by its entries' headers and skips
    /// their payloads; with readahead a cold file was read whole (see
    /// `inspect::summarize_mapped`). A hint: where the kernel refuses it,
    /// nothing changes.
    pub fn advise_random(&self) {
        self.advise(self.bytes(), nix::sys::mman::MmapAdvise::MADV_RANDOM);
    }

    /// Say `part` of the mapping is read through from its start: readahead
    /// for it, started now.
    pub fn advise_sequential(&self, part: &[u8]) {
        use nix::sys::mman::MmapAdvise;
        self.advise(part, MmapAdvise::MADV_SEQUENTIAL);
        self.advise(part, MmapAdvise::MADV_WILLNEED);
    }

    /// `madvise` over the pages that hold `part`, a slice of this mapping
    /// (anything else is passed over).
    fn advise(&self, part: &[u8], advice: nix::sys::mman::MmapAdvise) {
        let Some((p, len)) = self.map else {
            return;
        };
        let base = p.as_ptr() as usize;
        let (start, end) = (part.as_ptr() as usize, part.as_ptr() as usize + part.len());
        if part.is_empty() || start < base || end > base + len {
            return;
        }
        let page = page_size();
        // The mapping starts on a page; its pages cover what it maps.
        let from = base + (start - base) / page * page;
        let Some(at) = NonNull::new(from as *mut c_void) else {
            return;
        };
        // SAFETY: [from, end) lies within the mapping made in `new`, which
        // lives as long as `self`; advice changes no byte of it.
        let _ = unsafe { nix::sys::mman::madvise(at, end - from, advice) };
    }

    pub fn bytes(&self) -> &[u8] {
        match self.map {
            // SAFETY: `p` maps `len` readable bytes until `drop`.
            Some((p, len)) => unsafe { std::slice::from_raw_parts(p.as_ptr().cast::<u8>(), len) },
            None => &[],
        }
    }
}

/// The size of a page, read once (4 KiB where it cannot be read).
fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| n.is_power_of_two())
            .unwrap_or(4096)
    })
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if let Some((p, len)) = self.map.take() {
            // SAFETY: the mapping made in `new`, no longer borrowed.
            let _ = unsafe { nix::sys::mman::munmap(p, len) };
        }
    }
}

/// The program named by [`exit_clearly_on_sigbus`]'s message.
static PROGRAM: AtomicPtr<c_char> = AtomicPtr::new(null_mut());
/// The file read through a mapping now ([`Reading`]), or null.
static READING: AtomicPtr<c_char> = AtomicPtr::new(null_mut());
static SIGBUS_EXIT: AtomicI32 = AtomicI32::new(2);

/// Where a file shrinks while this process reads it through a [`Mapped`],
/// print "`program`: `file`: the file shrank while it was read (SIGBUS)"
/// on standard error and exit with `code`, instead of dying with "Bus
/// error" and a core. For commands that map files someone else may
/// rewrite meanwhile: gpuarchctl's `inspect` and `audit`, gpuarchd's audit
/// worker. The file is the one a live [`Reading`] names.
pub fn exit_clearly_on_sigbus(program: &'static CStr, code: u8) {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    PROGRAM.store(program.as_ptr().cast_mut(), Ordering::Release);
    SIGBUS_EXIT.store(i32::from(code), Ordering::Release);
    let action = SigAction::new(
        SigHandler::Handler(on_sigbus),
        SaFlags::SA_RESETHAND,
        SigSet::empty(),
    );
    // SAFETY: the handler reads atomics and calls write(2) and _exit(2)
    // alone, each async-signal-safe.
    let _ = unsafe { sigaction(Signal::SIGBUS, &action) };
}

extern "C" fn on_sigbus(_: libc::c_int) {
    fn put(s: *const c_char) {
        if !s.is_null() {
            // SAFETY: every string stored is NUL-terminated and outlives
            // its store: 'static, or a Reading's, cleared on its drop.
            let _ = unsafe { libc::write(2, s.cast(), libc::strlen(s)) };
        }
    }
    put(PROGRAM.load(Ordering::Acquire));
    put(c": ".as_ptr());
    let name = READING.load(Ordering::Acquire);
    if name.is_null() {
        put(c"a mapped file".as_ptr());
    } else {
        put(name);
    }
    put(c": the file shrank while it was read (SIGBUS): it was changed meanwhile; run again once it is whole\n".as_ptr());
    // SAFETY: _exit ends the process at once; nothing after runs.
    unsafe { libc::_exit(SIGBUS_EXIT.load(Ordering::Acquire)) }
}

/// Names `name` as the file this process reads through a mapping, for
/// [`exit_clearly_on_sigbus`]'s message, while it lives.
#[derive(Debug)]
pub struct Reading {
    name: CString,
}

impl Reading {
    pub fn of(name: &Path) -> Self {
        let name = CString::new(name.as_os_str().as_bytes())
            .unwrap_or_else(|_| c"a file whose name holds a NUL".to_owned());
        READING.store(name.as_ptr().cast_mut(), Ordering::Release);
        Self { name }
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        // Only its own name: a later Reading may have taken the place.
        let _ = READING.compare_exchange(
            self.name.as_ptr().cast_mut(),
            null_mut(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A file truncated under a mapping: the reader exits with the file's
    /// name and the code asked for, not "Bus error". Run in a child (this
    /// test binary again), as the handler ends the process.
    #[test]
    fn a_file_that_shrinks_while_mapped_is_named_not_a_bus_error() {
        const CHILD: &str = "GPUARCH_TEST_SIGBUS_FILE";
        if let Some(p) = std::env::var_os(CHILD) {
            let p = std::path::PathBuf::from(p);
            std::fs::write(&p, vec![1u8; 4 * 4096]).unwrap();
            let f = File::options().read(true).write(true).open(&p).unwrap();
            let m = Mapped::new(&f).unwrap();
            exit_clearly_on_sigbus(c"gpuarch-test", 3);
            let _reading = Reading::of(&p);
            f.set_len(0).unwrap();
            // SAFETY: within the mapping; the fault is what is tested.
            let b = unsafe { std::ptr::read_volatile(&m.bytes()[3 * 4096]) };
            panic!("read {b} from a truncated file without SIGBUS");
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("libtruncated.so");
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "file::tests::a_file_that_shrinks_while_mapped_is_named_not_a_bus_error",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, &p)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "gpuarch-test: {}: the file shrank while it was read (SIGBUS)",
                p.display()
            )),
            "{stderr}"
        );
    }

    /// The message names the newest live Reading; an older one dropped
    /// after it was replaced leaves the newer name in place.
    #[test]
    fn a_reading_names_the_file_until_dropped() {
        let now = || {
            let r = READING.load(Ordering::Acquire);
            // SAFETY: a live Reading's NUL-terminated name.
            (!r.is_null()).then(|| unsafe { CStr::from_ptr(r) }.to_owned())
        };
        let a = Reading::of(Path::new("/a"));
        assert_eq!(now().as_deref(), Some(c"/a"));
        let b = Reading::of(Path::new("/b"));
        drop(a);
        assert_eq!(now().as_deref(), Some(c"/b"));
        drop(b);
        assert_eq!(now(), None);
    }

    #[test]
    fn a_copy_stops_at_its_limit_and_digests_what_it_copied() {
        let data = vec![7u8; 3 * PIECE + 5];
        let mut out = Vec::new();
        let (sha, n) = copy_hashed(&data[..], &mut out, data.len() as u64).unwrap();
        assert_eq!(
            (sha, n),
            (crate::spec::sha256_hex(&data), data.len() as u64)
        );
        assert_eq!(out, data);
        let e = copy_hashed(&data[..], io::sink(), data.len() as u64 - 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
    }

    #[test]
    fn a_mapping_reads_the_file_and_an_empty_one_maps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"cubin").unwrap();
        assert_eq!(
            Mapped::new(&File::open(&p).unwrap()).unwrap().bytes(),
            b"cubin"
        );
        std::fs::write(&p, b"").unwrap();
        assert_eq!(Mapped::new(&File::open(&p).unwrap()).unwrap().bytes(), b"");
    }

    /// Advice changes how pages come in, never what is read; a slice that
    /// is not of the mapping, or an empty mapping, is passed over.
    #[test]
    fn advice_leaves_the_bytes_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let m = Mapped::new(&File::open(&p).unwrap()).unwrap();
        m.advise_random();
        // Unaligned, inside the mapping: advised from its page on.
        m.advise_sequential(&m.bytes()[5000..9000]);
        m.advise_sequential(&data[10..20]);
        m.advise_sequential(&[]);
        assert_eq!(m.bytes(), &data[..]);
        std::fs::write(&p, b"").unwrap();
        let empty = Mapped::new(&File::open(&p).unwrap()).unwrap();
        empty.advise_random();
        empty.advise_sequential(b"x");
        assert_eq!(empty.bytes(), b"");
    }
}
