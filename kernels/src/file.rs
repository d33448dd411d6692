//! Reading stored files without holding them: a digest read in 1 MiB
//! pieces, and a read-only mapping for the inspector, whose pages stay in
//! the page cache (the kernel reclaims them) instead of gpuarchd's heap.
//! A kernel package output or an imported library may be gigabytes; what
//! gpuarchd keeps of one is its digest and the targets it carries.

use std::ffi::c_void;
use std::fs::File;
use std::io::{self, Read, Write};
use std::num::NonZeroUsize;
use std::ptr::NonNull;

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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
