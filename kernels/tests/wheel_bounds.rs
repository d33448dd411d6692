//! A hostile wheel's cost to the importer (gpuarchd), measured: the
//! memory its member list takes, and how soon a wheel larger than any
//! import is refused. The allocator of this test binary counts every
//! byte, so the peak is the import's own.

#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpuarch_kernels::library::{LibraryError, Limits, Source, import_wheel};

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = NOW.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is passed on to the system allocator unchanged; only
// the sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        grew(l.size());
        // SAFETY: the caller's layout, as given.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        NOW.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: as allocated above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > l.size() {
            grew(new - l.size());
        } else {
            NOW.fetch_sub(l.size() - new, Ordering::Relaxed);
        }
        // SAFETY: as allocated above, to the size asked.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

const MIB: usize = 1 << 20;

/// A zip that is all central directory: one empty stored member at the
/// start, then `entries` central headers (each naming it, under a name of
/// its own at least `long` bytes long), in zip64 form.
fn directory_only(path: &Path, entries: usize, long: usize) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let name = b"a";
    // The local header every entry points at.
    let mut local = Vec::new();
    local.extend(0x0403_4b50u32.to_le_bytes());
    local.extend([20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    local.extend([0u8; 12]);
    local.extend((name.len() as u16).to_le_bytes());
    local.extend(0u16.to_le_bytes());
    local.extend(name);
    out.write_all(&local).unwrap();
    let start = local.len() as u64;
    let mut size = 0u64;
    for i in 0..entries {
        let n = format!("{i:0long$x}");
        let mut h = Vec::with_capacity(46 + n.len());
        h.extend(0x0201_4b50u32.to_le_bytes());
        h.extend([20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        h.extend([0u8; 12]);
        h.extend((n.len() as u16).to_le_bytes());
        h.extend([0u8; 16]);
        h.extend(n.as_bytes());
        size += h.len() as u64;
        out.write_all(&h).unwrap();
    }
    let z64 = start + size;
    let mut end = Vec::new();
    end.extend(0x0606_4b50u32.to_le_bytes());
    end.extend(44u64.to_le_bytes());
    end.extend([45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    end.extend((entries as u64).to_le_bytes());
    end.extend((entries as u64).to_le_bytes());
    end.extend(size.to_le_bytes());
    end.extend(start.to_le_bytes());
    end.extend(0x0706_4b50u32.to_le_bytes());
    end.extend(0u32.to_le_bytes());
    end.extend(z64.to_le_bytes());
    end.extend(1u32.to_le_bytes());
    end.extend(0x0605_4b50u32.to_le_bytes());
    end.extend([0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
    end.extend([0xff; 8]);
    end.extend(0u16.to_le_bytes());
    out.write_all(&end).unwrap();
    out.flush().unwrap();
}

fn import(root: &Path, wheel: &Path, limits: &Limits) -> (Result<(), LibraryError>, usize) {
    let f = std::fs::File::open(wheel).unwrap();
    PEAK.store(NOW.load(Ordering::Relaxed), Ordering::Relaxed);
    let before = NOW.load(Ordering::Relaxed);
    let r = import_wheel(
        root,
        &f,
        &Source::file("flashinfer_cubin-0.6.13-py3-none-any.whl"),
        limits,
    )
    .map(|_| ());
    (r, PEAK.load(Ordering::Relaxed) - before)
}

/// Every file below `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[test]
fn a_hostile_wheel_costs_the_importer_a_bounded_memory_and_no_hashing() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("libraries");
    std::fs::create_dir(&root).unwrap();
    let limits = Limits::for_store(8 << 30);
    let bound = 64 * MIB;

    // A central directory of 24 MiB, its members within the count (the
    // probe's was 144 MiB, and took gpuarchd 4.3 times that): refused
    // from its end records, unread.
    let big = t.path().join("big.whl");
    directory_only(&big, limits.max_files, 200);
    let (r, peak) = import(&root, &big, &limits);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("central directory is over its bound"), "{e}");
    eprintln!(
        "a 24 MiB central directory: peak {:.1} MiB",
        peak as f64 / MIB as f64
    );
    assert!(peak < bound, "peak {peak} bytes");

    // A count of members over the bound, in a directory small enough to
    // be read: refused from the end records too.
    let many = t.path().join("many.whl");
    directory_only(
        &many,
        (gpuarch_kernels::library::MAX_DIRECTORY as usize - 4096) / 51,
        1,
    );
    let (r, peak) = import(&root, &many, &limits);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("members is over its bound"), "{e}");
    assert!(peak < MIB, "peak {peak} bytes");

    // As many members as the bound lets through, each with a name of its
    // own: every header listed, the most the reader keeps.
    let most = t.path().join("most.whl");
    directory_only(&most, limits.max_files + 16, 1);
    let (r, listed_peak) = import(&root, &most, &limits);
    assert!(r.is_err());
    eprintln!(
        "{} members listed: peak {:.1} MiB",
        limits.max_files + 16,
        listed_peak as f64 / MIB as f64
    );

    // A RECORD as large as it may be (12 MiB: FlashInfer 0.6.13's is
    // 4.1 MB), every line a path: read and parsed whole.
    let record = t.path().join("record.whl");
    {
        let mut z = zip::ZipWriter::new(std::fs::File::create(&record).unwrap());
        let o = zip::write::SimpleFileOptions::default();
        let info = "flashinfer_cubin-0.6.13.dist-info";
        z.start_file(format!("{info}/METADATA"), o).unwrap();
        z.write_all(b"Metadata-Version: 2.1\nName: flashinfer-cubin\nVersion: 0.6.13\n\n")
            .unwrap();
        z.start_file(format!("{info}/RECORD"), o).unwrap();
        let mut written = 0;
        for i in 0.. {
            let line = format!(
                "flashinfer_cubin/cubins/{i:032x}.cubin,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,{i}\n"
            );
            if written + line.len() > 12 * MIB {
                break;
            }
            written += line.len();
            z.write_all(line.as_bytes()).unwrap();
        }
        z.finish().unwrap();
    }
    let (r, record_peak) = import(&root, &record, &limits);
    assert!(r.is_err());
    eprintln!(
        "a 12 MiB RECORD: peak {:.1} MiB",
        record_peak as f64 / MIB as f64
    );
    // The list and RECORD are held together at most.
    assert!(
        listed_peak + record_peak < bound,
        "peaks {listed_peak} + {record_peak} bytes"
    );

    // An exabyte-sized sparse file (a terabyte where the filesystem caps
    // a file's size) is refused before a byte of it is hashed.
    let sparse = t.path().join("sparse.whl");
    let f = std::fs::File::create(&sparse).unwrap();
    if f.set_len(1 << 60).is_err() {
        f.set_len(1 << 40).unwrap();
    }
    let t0 = Instant::now();
    let (r, _) = import(&root, &sparse, &limits);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("bytes is over its bound"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    let left: Vec<_> = walk(&root);
    assert!(left.is_empty(), "nothing left in the store: {left:?}");
}
