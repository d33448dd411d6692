//! Finding CUDA pieces on the host: NVRTC, the CUDA headers, and build tools.
//!
//! Searched in order: the config's `kernels.cuda_dirs` (a CUDA install or
//! the `nvidia/` directory of NVIDIA's Python wheels), the system library
//! path (NVRTC only), `/usr/local/cuda`, and the wheels in Python's
//! site-packages and dist-packages.

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::sys;
use gpuarch_core::arch::{CodeKind, Target};

use crate::error::BuildError;

/// The NVRTC sonames gpuarch loads, newest first: CUDA 13 (driver 580 and
/// later hosts) and CUDA 12. cudarc, built for 13.0, looks both up by these
/// names; see [`Nvrtc::load`].
const NVRTC_SONAMES: [&str; 2] = ["libnvrtc.so.13", "libnvrtc.so.12"];

/// The NVIDIA wheels a checkout unpacks for its tests, demo and benches
/// (`scripts/lib/setup.sh`): `$GPUARCH_CUDA_DIR`, else
/// `<workspace>/.local/cuda/nvidia`; None when NVRTC is not there.
pub fn local_wheels(workspace: &Path) -> Option<PathBuf> {
    let dir = std::env::var_os("GPUARCH_CUDA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join(".local/cuda/nvidia"));
    NVRTC_SONAMES
        .iter()
        .any(|so| dir.join("cuda_nvrtc/lib").join(so).is_file())
        .then_some(dir)
}

/// Directories to search, most specific first.
fn roots(cuda_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = cuda_dirs.to_vec();
    v.push(PathBuf::from("/usr/local/cuda"));
    for base in ["/usr/lib", "/usr/local/lib"] {
        let Ok(entries) = std::fs::read_dir(base) else {
            continue;
        };
        let mut pys: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pys.sort();
        for p in pys {
            for pk in ["dist-packages", "site-packages"] {
                v.push(p.join(pk).join("nvidia"));
            }
        }
    }
    v
}

/// Where a file of a wheel's component can be under one root: a toolkit
/// (`lib64/`), CUDA 12's wheels (one directory per component) and CUDA
/// 13's (everything under `cu13/`).
fn layouts(root: &Path, component: &str, sub: &str, file: &str) -> [PathBuf; 7] {
    [
        root.join(sub).join(file),
        root.join(format!("{sub}64")).join(file),
        root.join(component).join(sub).join(file),
        root.join("nvidia").join(component).join(sub).join(file),
        root.join("cu13").join(sub).join(file),
        root.join("nvidia/cu13").join(sub).join(file),
        root.join(file),
    ]
}

/// The first existing file among the layouts of every root.
pub fn find(cuda_dirs: &[PathBuf], component: &str, sub: &str, file: &str) -> Option<PathBuf> {
    roots(cuda_dirs)
        .iter()
        .flat_map(|r| layouts(r, component, sub, file))
        .find(|p| p.is_file())
}

/// The directory of a build tool (`ptxas`, `nvcc`, `cuobjdump`), from the
/// CUDA directories, for a command build's PATH.
pub fn tool_dirs(cuda_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for r in roots(cuda_dirs) {
        for d in [
            r.join("bin"),
            r.join("cuda_nvcc/bin"),
            r.join("nvidia/cuda_nvcc/bin"),
            r.join("cu13/bin"),
            r.join("nvidia/cu13/bin"),
        ] {
            if d.is_dir() && !out.contains(&d) {
                out.push(d);
            }
        }
    }
    out
}

/// A loaded NVRTC and the headers it compiles against.
#[derive(Debug)]
pub struct Nvrtc {
    /// The library, as found (`libnvrtc.so.13` or `.12` when from the
    /// system path).
    pub library: PathBuf,
    /// `12.9`.
    pub version: String,
    /// Holds `cuda_fp16.h` and `cuda_bf16.h`.
    pub include: PathBuf,
    /// sha256 over the headers in `include`: part of every build's key.
    pub headers_digest: String,
}

/// Output of one compilation.
#[derive(Debug)]
pub struct Compiled {
    pub code: Vec<u8>,
    pub log: String,
}

static LOADED: OnceLock<Result<(libloading::Library, PathBuf), BuildError>> = OnceLock::new();

impl Nvrtc {
    /// Find and load NVRTC and the headers. NVRTC is loaded once per
    /// process: the first successful load wins, later calls reuse it.
    ///
    /// cudarc resolves its NVRTC symbols by library name; loading the file
    /// found here first, under its soname (`libnvrtc.so.13` or `.12`), makes
    /// that name resolve to it. cudarc tries the bare `libnvrtc.so` before
    /// the sonames, though, and a CUDA toolkit on the library path answers
    /// that with its own NVRTC; so the library cudarc settled on is checked
    /// to be the one chosen here (same `nvrtcVersion` entry point) before any
    /// call, and a different one is an error rather than a build by a
    /// compiler the key does not name.
    pub fn load(cuda_dirs: &[PathBuf]) -> Result<Self, BuildError> {
        let (lib, library) = LOADED
            .get_or_init(|| Self::open(cuda_dirs))
            .as_ref()
            .map_err(Clone::clone)?;
        // SAFETY: the library is loaded (above), so cudarc finds the symbol.
        if !unsafe { sys::is_culib_present() } {
            return Err(BuildError::Tool(format!(
                "NVRTC at {} was loaded but cudarc cannot find it under {}",
                library.display(),
                NVRTC_SONAMES.join(" or ")
            )));
        }
        // SAFETY: looking a symbol up runs no code; both libraries are NVRTC.
        let same = unsafe {
            let ours = lib.get::<unsafe extern "C" fn()>(b"nvrtcVersion\0");
            let theirs = sys::culib().get::<unsafe extern "C" fn()>(b"nvrtcVersion\0");
            matches!((ours, theirs), (Ok(a), Ok(b)) if *a as usize == *b as usize)
        };
        if !same {
            return Err(BuildError::Tool(format!(
                "NVRTC: gpuarch chose {} but cudarc loaded the libnvrtc.so on the library path, a different NVRTC; list that toolkit's directory first in kernels.cuda_dirs",
                library.display()
            )));
        }
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: two valid out-pointers.
        let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(BuildError::Tool(format!("nvrtcVersion failed: {r:?}")));
        }
        let include = find(cuda_dirs, "cuda_runtime", "include", "cuda_fp16.h")
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .ok_or_else(|| {
                BuildError::Tool("CUDA headers (cuda_fp16.h) not found: install the nvidia-cuda-runtime wheel or a CUDA toolkit, or list its directory in kernels.cuda_dirs".to_owned())
            })?;
        let headers_digest = digest_dir(&include)
            .map_err(|e| BuildError::Tool(format!("{}: {e}", include.display())))?;
        Ok(Self {
            library: library.clone(),
            version: format!("{major}.{minor}"),
            include,
            headers_digest,
        })
    }

    fn open(cuda_dirs: &[PathBuf]) -> Result<(libloading::Library, PathBuf), BuildError> {
        let mut tried = Vec::new();
        let in_roots = |roots: &[PathBuf]| -> Vec<PathBuf> {
            roots
                .iter()
                .flat_map(|r| {
                    NVRTC_SONAMES
                        .iter()
                        .flat_map(move |so| layouts(r, "cuda_nvrtc", "lib", so))
                })
                .collect()
        };
        let mut candidates = in_roots(cuda_dirs);
        // The system library path.
        candidates.extend(NVRTC_SONAMES.iter().map(PathBuf::from));
        candidates.extend(in_roots(&roots(&[])));
        for c in candidates {
            if c.is_absolute() && !c.is_file() {
                continue;
            }
            // NVRTC runs inside gpuarchd, as root: another user's copy is
            // passed over (the system library path is ld.so's to trust).
            // It is loaded by its path, not through a checked descriptor
            // as everything else root runs: NVRTC finds its builtins
            // library by its RUNPATH `$ORIGIN`, which for
            // `/proc/self/fd/N` is /proc/self/fd. The check covers every
            // directory above it, so only root could swap it meanwhile.
            if c.is_absolute()
                && let Err(e) = gpuarch_fs::trust::check(&c)
            {
                tried.push(e.to_string());
                continue;
            }
            // SAFETY: loading NVRTC runs its initialisers, which have no
            // preconditions; the library stays loaded for the process.
            match unsafe { libloading::Library::new(&c) } {
                Ok(lib) => return Ok((lib, c)),
                Err(e) => tried.push(format!("{}: {e}", c.display())),
            }
        }
        Err(BuildError::Tool(format!(
            "NVRTC ({}) not found: install a CUDA 12 or 13 toolkit or the nvidia-cuda-nvrtc wheel, or list its directory in kernels.cuda_dirs{}",
            NVRTC_SONAMES.join(" or "),
            if tried.is_empty() {
                String::new()
            } else {
                format!(" (tried {})", tried.join("; "))
            }
        )))
    }

    /// Compile `main` (with `headers` available to `#include "..."`) for
    /// `target`: a cubin for `sm_XX`, PTX for `compute_XX`.
    pub fn compile(
        &self,
        main: (&str, &[u8]),
        headers: &[(String, Vec<u8>)],
        target: Target,
        options: &[String],
    ) -> Result<Compiled, BuildError> {
        let cstr = |b: &[u8], what: &str| {
            CString::new(b.to_vec())
                .map_err(|_| BuildError::Rejected(format!("{what} contains a NUL byte")))
        };
        let src = cstr(main.1, main.0)?;
        let name = cstr(main.0.as_bytes(), "source name")?;
        let hdrs: Vec<CString> = headers
            .iter()
            .map(|(n, b)| cstr(b, n))
            .collect::<Result<_, _>>()?;
        let hnames: Vec<CString> = headers
            .iter()
            .map(|(n, _)| cstr(n.as_bytes(), "header name"))
            .collect::<Result<_, _>>()?;
        let hptr: Vec<*const c_char> = hdrs.iter().map(|c| c.as_ptr()).collect();
        let nptr: Vec<*const c_char> = hnames.iter().map(|c| c.as_ptr()).collect();
        let mut opts = vec![
            format!("--gpu-architecture={target}"),
            format!("--include-path={}", self.include.display()),
        ];
        opts.extend(options.iter().cloned());
        let copts: Vec<CString> = opts
            .iter()
            .map(|o| cstr(o.as_bytes(), "option"))
            .collect::<Result<_, _>>()?;
        let optr: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();

        let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: every pointer is to a live NUL-terminated string, the
        // arrays have the lengths given, and `prog` is an out-pointer.
        let r = unsafe {
            sys::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                hptr.len() as c_int,
                hptr.as_ptr(),
                nptr.as_ptr(),
            )
        };
        check(r, "nvrtcCreateProgram")?;
        let prog = Program(prog);
        // SAFETY: `prog` is a live program; options as above.
        let r = unsafe { sys::nvrtcCompileProgram(prog.0, optr.len() as c_int, optr.as_ptr()) };
        let log = prog.log();
        if r == sys::nvrtcResult::NVRTC_ERROR_COMPILATION {
            return Err(BuildError::Rejected(log.trim_end().to_owned()));
        }
        check(r, "nvrtcCompileProgram")?;
        let code = match target.kind {
            CodeKind::Sass => prog.output(sys::nvrtcGetCUBINSize, sys::nvrtcGetCUBIN, "CUBIN")?,
            CodeKind::Ptx => {
                let mut p = prog.output(sys::nvrtcGetPTXSize, sys::nvrtcGetPTX, "PTX")?;
                while p.last() == Some(&0) {
                    p.pop();
                }
                p
            }
        };
        Ok(Compiled { code, log })
    }
}

fn check(r: sys::nvrtcResult, what: &str) -> Result<(), BuildError> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a static string for any result.
    let msg = unsafe { CStr::from_ptr(sys::nvrtcGetErrorString(r)) };
    Err(BuildError::Tool(format!(
        "{what}: {}",
        msg.to_string_lossy()
    )))
}

/// A program destroyed when dropped.
struct Program(sys::nvrtcProgram);

type SizeFn = unsafe fn(sys::nvrtcProgram, *mut usize) -> sys::nvrtcResult;
type GetFn = unsafe fn(sys::nvrtcProgram, *mut c_char) -> sys::nvrtcResult;

impl Program {
    fn log(&self) -> String {
        match self.output(sys::nvrtcGetProgramLogSize, sys::nvrtcGetProgramLog, "log") {
            Ok(mut b) => {
                while b.last() == Some(&0) {
                    b.pop();
                }
                String::from_utf8_lossy(&b).into_owned()
            }
            Err(e) => e.to_string(),
        }
    }

    fn output(&self, size: SizeFn, get: GetFn, what: &str) -> Result<Vec<u8>, BuildError> {
        let mut n = 0usize;
        // SAFETY: live program, valid out-pointer.
        check(unsafe { size(self.0, &mut n) }, what)?;
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the `n` bytes NVRTC said it will write.
        check(unsafe { get(self.0, buf.as_mut_ptr().cast()) }, what)?;
        Ok(buf)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program is live and dropped once.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

/// sha256 over (name, content) of the regular files directly in `dir`.
fn digest_dir(dir: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let mut h = Sha256::new();
    for f in files {
        h.update(
            f.file_name()
                .map(|n| n.as_encoded_bytes())
                .unwrap_or_default(),
        );
        h.update([0]);
        h.update(Sha256::digest(std::fs::read(&f)?));
    }
    Ok(crate::spec::hex(&h.finalize()))
}
