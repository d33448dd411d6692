//! Support for gpuarch's end-to-end tests: where the fixtures are, and the
//! artifacts Cargo does not hand to another package's tests (the fake NVML
//! cdylib and the workspace's binaries), built on first use into the same
//! target directory and (unless `GPUARCH_TEST_PROFILE` says otherwise)
//! profile as the running test.

pub mod audit;
pub mod containers;
pub mod daemon;
pub mod engines;
pub mod fatlib;
pub mod layouts;
pub mod nri;
pub mod registry;
pub mod roots;
pub mod slurm;
pub mod stack;
pub mod truncate;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The fixture topologies every NVML test runs on. `h100-real` is what
/// NVML said on a real H100 host (scripts/gpu-check, docs/gpu/).
pub const FIXTURES: [&str; 7] = [
    "2080ti-3090",
    "t4",
    "a100-h100",
    "8xh100",
    "4090-5090",
    "a100-mig",
    "h100-real",
];

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// `yaml` with `hook.image_cache` and `hook.record_dir` under `dir`
/// (made), so that a test never looks at the host's `/run/gpuarch/images`
/// or `/run/gpuarch/containers`; a `hook:` section of its own keeps its
/// other keys.
pub fn private_hook_paths(yaml: &str, dir: &Path) -> String {
    let cache = dir.join("images");
    let records = dir.join("containers");
    for d in [&cache, &records] {
        std::fs::create_dir_all(d).expect("the test's hook directories");
    }
    let line = format!(
        "  image_cache: {}\n  record_dir: {}\n",
        cache.display(),
        records.display()
    );
    if yaml.starts_with("hook:\n") || yaml.contains("\nhook:\n") {
        yaml.replacen("hook:\n", &format!("hook:\n{line}"), 1)
    } else {
        format!("{yaml}\nhook:\n{line}")
    }
}

/// Run `cmd` with `input` on its stdin, collecting stdout and stderr. The
/// input is fed from a thread: a program may write before it has read
/// everything, and one that stops reading (a refusal) makes the write
/// fail, which is its answer, not the test's.
pub fn output_with_stdin(cmd: &mut Command, input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let mut pipe = child.stdin.take().expect("stdin was piped");
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || pipe.write_all(&input));
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let _ = feeder.join().expect("the stdin feeder panicked");
    out
}

/// `tests/fixtures/images/NAME`: a rootfs tree of an image's Python
/// environments (real dist-info headers; see its README).
pub fn image_fixture(name: &str) -> PathBuf {
    workspace_root().join("tests/fixtures/images").join(name)
}

/// `tests/fixtures/NAME.json`.
pub fn fixture(name: &str) -> PathBuf {
    workspace_root()
        .join("tests/fixtures")
        .join(format!("{name}.json"))
}

/// The first `tool` on PATH, as a shell would find it.
pub fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

/// A memory field of /proc/PID/status (`VmRSS`, `VmHWM`), in KiB.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A tmpfs mounted (with `options`, `size=8k,mode=0755`) on `dir`,
/// unmounted when the value drops (lazily: a test that failed may still
/// have files open there).
#[derive(Debug)]
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, options: &str) -> Self {
        std::fs::create_dir_all(dir).expect("tmpfs mount point");
        nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(options),
        )
        .unwrap_or_else(|e| panic!("mount tmpfs on {}: {e}", dir.display()));
        Self(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Why a test that needs root and `tools` cannot run here (`root_for` says
/// what root is needed for), or `None` when it can.
pub fn cannot_run(root_for: &str, tools: &[&str]) -> Option<String> {
    gpuarch_testkit::unless_root(root_for).or_else(|| {
        tools
            .iter()
            .find(|t| which(t).is_none())
            .map(|t| format!("{t} is not installed"))
    })
}

// The skip policy is gpuarch-testkit's, shared with every crate's unit
// tests: `skip`, `skip_unless!`, `require_all`.
pub use gpuarch_testkit::{require_all, skip, skip_unless};

/// Paths of built artifacts.
#[derive(Debug)]
pub struct Artifacts {
    pub fake_nvml: PathBuf,
    pub gpuarchctl: PathBuf,
    pub gpuarchd: PathBuf,
    pub gpuarch_hook: PathBuf,
    pub gpuarch_runtime: PathBuf,
    /// The Slurm TaskProlog program (`/usr/lib/gpuarch/slurm-task-prolog`).
    pub slurm_task_prolog: PathBuf,
    pub gpu_check: PathBuf,
}

/// The cargo profile the binaries under test are built with: that of the
/// running test, unless `GPUARCH_TEST_PROFILE` names another. CI runs the
/// load test's debug harness on the release binaries the package step has
/// just built, rather than building the harness and its dependencies a
/// second time in release.
pub fn artifacts_profile() -> String {
    if let Ok(p) = std::env::var("GPUARCH_TEST_PROFILE")
        && !p.is_empty()
    {
        return if p == "debug" { "dev".to_owned() } else { p };
    }
    // target/<profile>/deps/<test binary>
    let exe = std::env::current_exe().expect("current_exe");
    match exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
    {
        Some("debug") | None => "dev".to_owned(),
        Some(p) => p.to_owned(),
    }
}

/// `cmd` without what Cargo sets for a running test alone (the package's
/// name, version and manifest dir, the test's tmpdir and binaries):
/// build scripts that declare them (ring's) would see them change and
/// rebuild ring and all above it on every switch between a test's cargo
/// and the one that ran it, in debug and in release. What the user set
/// (`CARGO_HOME`, `CARGO_TARGET_DIR`, `CARGO_PROFILE_*` and the like)
/// stays.
fn without_test_env(cmd: &mut Command) -> &mut Command {
    const SET_FOR_TESTS: [&str; 9] = [
        "OUT_DIR",
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_MANIFEST_LINKS",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
    ];
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if SET_FOR_TESTS.contains(&key)
            || key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_EXE_")
        {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// Build (once per test process) and locate the fake NVML and the binaries,
/// in [`artifacts_profile`].
pub fn artifacts() -> &'static Artifacts {
    static A: OnceLock<Artifacts> = OnceLock::new();
    A.get_or_init(|| {
        // target/<profile>/deps/<test binary>
        let exe = std::env::current_exe().expect("current_exe");
        let target_dir = exe
            .ancestors()
            .nth(3)
            .expect("test binary under target/<profile>/deps")
            .to_path_buf();
        let profile = artifacts_profile();
        let profile_dir = target_dir.join(if profile == "dev" { "debug" } else { &profile });
        let shipped = [
            "-p",
            "gpuarch-daemon",
            "-p",
            "gpuarch-ctl",
            "-p",
            "gpuarch-hook",
            "--bins",
        ];
        let build = |profile: &str, packages: &[&str]| {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let status = without_test_env(&mut Command::new(cargo))
                .current_dir(workspace_root())
                .args(["build", "--quiet", "--locked", "--profile", profile])
                .arg("--target-dir")
                .arg(&target_dir)
                .args(packages)
                .status()
                .expect("run cargo build for test artifacts");
            assert!(
                status.success(),
                "building test artifacts {packages:?} failed"
            );
        };
        // The whole workspace in debug, with its tests, as the scripts build
        // it (build_debug_workspace, scripts/lib/setup.sh): --tests makes
        // cargo resolve features with the dev-dependencies, as `cargo test
        // --workspace` does, so its dependencies are the ones that run just
        // built. Without it, memchr and serde_core (and so 349 units) were
        // built a second time with other features.
        build("dev", &["--workspace", "--lib", "--bins", "--tests"]);
        let debug_dir = target_dir.join("debug");
        // Where the hook, the shim and the TaskProlog are: a release run
        // takes the static ones scripts/package ships, and times what a
        // host runs.
        let static_dir = if profile == "release" {
            // The shipped binaries exactly as scripts/package builds them:
            // the very files the .deb holds, and no second build of them
            // in CI. The fake NVML and gpu-check stay the debug ones: no
            // host runs them, and a release build of them alone would build
            // their dependencies once more with fewer features.
            let status =
                without_test_env(&mut Command::new(workspace_root().join("scripts/package")))
                    .arg("--build-only")
                    .status()
                    .expect("run scripts/package --build-only");
            assert!(status.success(), "scripts/package --build-only failed");
            profile_dir.join("static")
        } else {
            if profile != "dev" {
                build(&profile, &shipped);
            }
            profile_dir.clone()
        };
        Artifacts {
            fake_nvml: debug_dir.join("libfake_nvml.so"),
            gpuarchctl: profile_dir.join("gpuarchctl"),
            gpuarchd: profile_dir.join("gpuarchd"),
            gpuarch_hook: static_dir.join("gpuarch-hook"),
            gpuarch_runtime: static_dir.join("gpuarch-runtime"),
            slurm_task_prolog: static_dir.join("gpuarch-slurm-task-prolog"),
            gpu_check: debug_dir.join("gpuarch-gpu-check"),
        }
    })
}

/// The NVIDIA wheels `scripts/test` unpacks (NVRTC, headers, ptxas,
/// cuobjdump); None when absent, through [`skip`] (a failure where every
/// test must run).
pub fn cuda_dir() -> Option<PathBuf> {
    let found = gpuarch_kernels::toolchain::local_wheels(&workspace_root());
    if found.is_none() {
        skip("no NVRTC wheel under .local/cuda (scripts/test installs it)");
    }
    found
}

/// Packages whose builds take NVRTC a while (about 1.6 s each on a 2-core
/// VM: two kernels, each a loop of 4000 steps unrolled; NVRTC does not
/// unroll a much longer one), as a real kernel library's do; written under
/// `dir`.
#[allow(clippy::unwrap_used)] // test helper: a failed write is a failed test
pub fn heavy_packages(dir: &Path, count: usize) {
    const KERNEL: &str = "extern \"C\" __global__ void NAME(float *x, unsigned int n)\n{\n\
         unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
         if (i >= n) return;\n float v = x[i];\n\
         #pragma unroll\n for (int k = 0; k < 4000; ++k)\n\
         v = __sinf(v) * 1.0001f + __cosf(v * (float)k);\n x[i] = v;\n}\n";
    for k in 0..count {
        let p = dir.join(format!("heavy{k}"));
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(
            p.join("kernel.yaml"),
            format!(
                "name: heavy{k}\nversion: \"1.0.0\"\nsources: [heavy.cu]\nexports: [heavy, heavy_b]\n\
                 build:\n  backend: nvrtc\n  options: [--std=c++17]\n\
                 variants:\n  - name: fp32\n    dtype: float32\n"
            ),
        )
        .unwrap();
        let source = KERNEL.replace("NAME", "heavy") + &KERNEL.replace("NAME", "heavy_b");
        std::fs::write(p.join("heavy.cu"), source).unwrap();
    }
}

/// The "image" of part 7's rehearsal (scripts/lib/setup.sh,
/// `ensure_torch_image`): a Python with a CUDA build of torch, and the CUDA
/// toolkit from NVIDIA's wheels that torch builds extensions with.
pub fn torch_image() -> Result<(PathBuf, PathBuf), String> {
    let python = std::env::var_os("GPUARCH_TORCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".local/torch-image/bin/python"));
    if !python.exists() {
        return Err(format!(
            "no torch image at {} (scripts/test installs it: ensure_torch_image in \
             scripts/lib/setup.sh)",
            python.display()
        ));
    }
    let cuda_home = match std::env::var_os("GPUARCH_TORCH_CUDA_HOME") {
        Some(d) => PathBuf::from(d),
        None => {
            let o = Command::new(&python)
                .args([
                    "-c",
                    "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                ])
                .output()
                .map_err(|e| format!("{}: {e}", python.display()))?;
            PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("nvidia/cu13")
        }
    };
    if !cuda_home.join("bin/nvcc").exists() {
        return Err(format!("no nvcc in {}", cuda_home.display()));
    }
    Ok((python, cuda_home))
}
