//! gpuarchctl's command line: its commands, their arguments, its exit
//! statuses.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::engine::containerd;

/// Exit status when a question is answered "no" (`arch check`).
pub const EXIT_NO: u8 = 1;
/// Exit status for errors: bad input, no inventory source.
pub const EXIT_ERROR: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "gpuarchctl",
    version,
    about = "Ask gpuarch about this node's GPUs: what they are, what they can run, what a container gets",
    after_help = "Source: gpuarchd on the system bus (DBUS_SYSTEM_BUS_ADDRESS to name another bus). \
With --offline: --nvml-lib reads NVML from that library; otherwise --inventory or \
GPUARCH_INVENTORY names a snapshot; otherwise /run/gpuarch/inventory.json if present; otherwise NVML \
(GPUARCH_NVML_LIB or libnvidia-ml.so.1). --nvml-lib and --inventory imply --offline. \
plan --config, plan --env and inspect plan here, with gpuarchd's inventory when it runs and no \
source is named (else as --offline).\n\
Config: GPUARCH_CONFIG or /etc/gpuarch/config.yaml (absent: defaults).\n\
Exit status: 0 ok (or yes), 1 no (arch check, match with no GPU), 2 error."
)]
pub struct Cli {
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Do not ask gpuarchd: read the snapshot or NVML directly.
    #[arg(long, global = true)]
    pub offline: bool,
    /// Read the inventory from NVML in this library (implies --offline).
    #[arg(long, global = true, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Read the inventory from this snapshot file (implies --offline).
    #[arg(long, global = true, value_name = "PATH")]
    pub inventory: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Is gpuarchd running, and how fresh is its inventory?
    Status,
    /// List the GPUs (and MIG devices) of this node.
    Devices,
    /// UUIDs of the GPUs meeting a requirement such as 'arch>=8.0,feature=bf16'
    /// (terms: arch>=X.Y, arch>X.Y, arch<=X.Y, arch<X.Y, arch=X.Y, arch!=X.Y,
    /// feature=NAME). Exit status 1 when no GPU does.
    Match { requirement: String },
    /// Ask gpuarchd to re-read its config and the GPUs now (root or group gpuarch).
    Reload,
    /// Show what a container would get: its GPUs, env and the reasons.
    Plan(PlanArgs),
    /// Questions about compute capabilities and build targets.
    #[command(subcommand)]
    Arch(ArchCmd),
    /// Which GPU architectures a cubin, fatbin, PTX file or library carries,
    /// and whether each GPU of this host runs it (from SASS, by PTX JIT, or
    /// not at all, and why). Exit status 1 when a GPU runs none of it.
    Inspect(InspectArgs),
    /// The CUDA binaries an image (a rootfs, a venv, any directory) carries:
    /// its Python distributions' libraries, cubins and fatbins, the library
    /// path, Hugging Face's and FlashInfer's kernel caches; the SASS and
    /// PTX in each, and whether each GPU runs it. Exit status 1 when a GPU
    /// can run none of some binary, code built only for other GPUs (a
    /// backend its package chooses by capability) aside.
    Audit(AuditArgs),
    /// Build kernel packages ahead of time and pin the builds (root or group
    /// gpuarch); shows progress, exit status 1 when a build is not served.
    Prewarm(PrewarmArgs),
    /// The kernel cache: with no subcommand, list each build, its arch and
    /// variant, pinned, in use.
    Kernels(KernelsArgs),
    /// Evict least recently used builds above the cache limit (root or group gpuarch).
    Gc,
    /// The per-architecture JIT caches (config jit_cache).
    #[command(subcommand)]
    Jit(JitCmd),
    /// Slurm: gres.conf typed by architecture, and the TaskProlog.
    #[command(subcommand)]
    Slurm(SlurmCmd),
    /// This node's Kubernetes labels (gpuarch.io/sm_86.count=1,
    /// gpuarch.io/bf16.all=true, ...), the Node Feature Discovery file that
    /// gpuarchd keeps with export.nfd.
    Labels,
    /// Check every cached file's sha256; corrupt builds are quarantined and
    /// rebuilt (root or group gpuarch). Exit status 1 when any was corrupt.
    Verify,
    /// Check this host: gpuarchd up, NVML loadable, snapshot fresh, kernel
    /// cache writable, and each installed container engine (podman, Docker,
    /// containerd, CRI-O) wired to gpuarch; each problem with the line that
    /// fixes it. Exit status 1 when something is wrong.
    Doctor(DoctorArgs),
    /// Wire gpuarch into a container engine's own config.
    #[command(subcommand)]
    Engine(EngineCmd),
    /// What a container got at its start: its GPUs, env, mounts and the
    /// reasons, by id (or its start), or under Kubernetes by name, pod or
    /// NAMESPACE/POD. Exit status 1 when there is no record of it.
    Why(WhyArgs),
}

#[derive(Debug, Subcommand)]
pub enum SlurmCmd {
    /// gres.conf lines for this node: "Name=gpu Type=sm_XY File=/dev/nvidiaN"
    /// per GPU in minor order (Slurm numbers GPUs by their place there),
    /// after a comment with the node's slurm.conf Gres= and Features=. Jobs
    /// then ask --gres=gpu:sm_86:1. A node with MIG is refused.
    Gres {
        /// Replace this file (atomically) instead of printing.
        #[arg(long, value_name = "PATH")]
        write: Option<PathBuf>,
        /// The node's name in the slurm.conf comment [default: the short
        /// host name].
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
    },
    /// The TaskProlog (slurm.conf TaskProlog=/usr/lib/gpuarch/slurm-task-prolog):
    /// "export NAME=value" lines of the Plan for the step's GPUs
    /// (SLURM_STEP_GPUS, else SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES),
    /// asked of gpuarchd, else planned from its snapshot. Never fails a job:
    /// on any error it prints nothing and logs why.
    TaskProlog,
}

#[derive(Debug, Subcommand)]
pub enum JitCmd {
    /// List the caches: whose (uid, image or namespace), for which targets,
    /// their size, whether a container has one mounted now.
    Ls,
    /// Remove the least recently started caches above jit_cache.max_bytes
    /// now (never one mounted, or handed out in the last 10 minutes); root
    /// or group gpuarch.
    Gc,
}

#[derive(Debug, Subcommand)]
pub enum EngineCmd {
    /// The containerd drop-in that adds the CRI runtime handler (Kubernetes
    /// RuntimeClass handler) beside runc, from containerd's config as it is:
    /// printed, or written with --write. containerd 1.x replaces a plugin's
    /// whole section with an import's, so for it the drop-in carries the
    /// CRI section of config.toml; run this again after changing that
    /// section (doctor says when).
    Containerd(ContainerdArgs),
    /// Docker's daemon.json with runtime NAME running gpuarch-runtime (and,
    /// with --default, as the default runtime): printed, or with --write
    /// merged into the file in place (a backup first, atomic, its owner and
    /// mode kept, read back), then the restart that applies it. Nothing is
    /// written when the file already says so.
    Docker(DockerArgs),
}

#[derive(Debug, clap::Args)]
pub struct WhyArgs {
    /// The container: its id or the start of it (3 characters or more, as
    /// `docker ps` and `podman ps` show it), or, under Kubernetes, its
    /// name, its pod's name, or NAMESPACE/POD.
    pub container: String,
    /// Where the records are [default: the config's hook.record_dir,
    /// /run/gpuarch/containers].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct DockerArgs {
    /// dockerd's config.
    #[arg(long, value_name = "PATH", default_value = "/etc/docker/daemon.json")]
    pub config: PathBuf,
    /// The shim dockerd runs for the runtime.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/gpuarch-runtime")]
    pub runtime: PathBuf,
    /// The runtime's name (docker run --runtime NAME).
    #[arg(long, value_name = "NAME", default_value = "gpuarch")]
    pub name: String,
    /// Make it dockerd's default-runtime: every container is planned,
    /// without --runtime.
    #[arg(long)]
    pub default: bool,
    /// Merge into the config file instead of printing the result.
    #[arg(long)]
    pub write: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ContainerdArgs {
    /// Absolute imports are read below this directory (an image, a chroot).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// containerd's config.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/etc/containerd/config.toml"
    )]
    pub config: PathBuf,
    /// The shim the handler runs.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/gpuarch-runtime")]
    pub runtime: PathBuf,
    /// The runtime handler's name.
    #[arg(long, value_name = "NAME", default_value = containerd::HANDLER)]
    pub handler: String,
    /// Write the drop-in here (atomically) instead of printing it.
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = containerd::DROPIN)]
    pub write: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Files to read.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Judge for these GPUs (indexes as NVML numbers them) instead of all.
    #[arg(long, value_name = "LIST", conflicts_with = "cap")]
    pub devices: Option<String>,
    /// Judge for a compute capability (8.6) instead of this host's GPUs.
    #[arg(long, value_name = "CAP")]
    pub cap: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// The image's root directory (or a venv, or any directory).
    #[arg(required_unless_present = "image")]
    pub path: Option<PathBuf>,
    /// Ask gpuarchd instead, from the audit it keeps of an image started
    /// on this node (audit.dir): a name the engine gave it (CRI's image
    /// reference or name) or its key.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["path", "cap", "env", "user", "max_seconds"])]
    pub image: Option<String>,
    /// Judge for these GPUs (indexes as NVML numbers them) instead of all.
    #[arg(long, value_name = "LIST", conflicts_with = "cap")]
    pub devices: Option<String>,
    /// Judge for compute capabilities (7.5,8.6) instead of this host's GPUs.
    #[arg(long, value_name = "LIST")]
    pub cap: Option<String>,
    /// The image's process env, as its config gives it (PATH,
    /// VIRTUAL_ENV, LD_LIBRARY_PATH, HOME, HF_HOME ...): which Python
    /// environments and caches are its own. Repeatable.
    #[arg(long, value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// The uid the image's process runs as (its user site and home).
    #[arg(long, value_name = "UID")]
    pub user: Option<u32>,
    /// Stop after this long and say so [default: 300].
    #[arg(long, value_name = "SECONDS")]
    pub max_seconds: Option<u64>,
}

#[derive(Debug, clap::Args)]
pub struct PrewarmArgs {
    /// Packages to build (default: all). DIST==VERSION
    /// (flashinfer-cubin==0.6.13) is a consumer's library, pulled from the
    /// registry and imported, never built.
    pub packages: Vec<String>,
    /// Architectures (7.5,8.6 or sm_75,sm_86).
    #[arg(long, value_name = "LIST", conflicts_with = "host")]
    pub arch: Option<String>,
    /// The architectures of this host's GPUs (the default).
    #[arg(long)]
    pub host: bool,
    /// Only pull from the registry (kernels.remote); build nothing here.
    #[arg(long)]
    pub from_registry: bool,
}

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct KernelsArgs {
    #[command(subcommand)]
    pub cmd: Option<KernelsCmd>,
}

#[derive(Debug, Subcommand)]
pub enum KernelsCmd {
    /// List the kernel cache (the default).
    Ls,
    /// Push stored builds to the registry in kernels.remote (root or group
    /// gpuarch): PKG... (default: all) for --arch (default: every stored
    /// arch). Exit status 1 when a push fails.
    Push(SelectArgs),
    /// Fetch builds from the registry into the cache without building or
    /// pinning them (root or group gpuarch). Exit status 1 when one is not
    /// pulled.
    Pull(SelectArgs),
    /// Import prebuilt libraries or fatbins as package NAME (root or group
    /// gpuarch): each container gets the file that runs on its GPUs, by the
    /// SASS and PTX read from each file. Replaces an earlier import of NAME.
    Import(ImportArgs),
    /// Import a consumer's own prebuilt kernels from its wheel (root or
    /// group gpuarch): FlashInfer's flashinfer-cubin-VERSION wheel. Each
    /// container whose image holds flashinfer-python of that version then
    /// gets the files for its GPUs at FLASHINFER_CUBIN_DIR. Replaces an
    /// earlier import of that version. With kernels.remote.push on, the
    /// wheel is pushed too, for other nodes to `gpuarchctl prewarm
    /// flashinfer-cubin==VERSION`.
    ImportWheel {
        /// The wheel (pip download flashinfer-cubin==VERSION), or the
        /// site-packages directory it is installed in.
        wheel: std::path::PathBuf,
    },
    /// Remove import NAME (root or group gpuarch): containers started from
    /// now on no longer get it; running ones keep what they mount. Its
    /// files are unpinned, left to the cache's LRU.
    Unimport {
        /// The import's name.
        name: String,
    },
}

#[derive(Debug, clap::Args)]
pub struct SelectArgs {
    /// Packages (default: all). For a pull, DIST==VERSION
    /// (flashinfer-cubin==0.6.13) is a consumer's library, imported as it
    /// is pulled.
    pub packages: Vec<String>,
    /// Architectures (7.5,8.6 or sm_75,sm_86; default: every stored one for
    /// a push, the host's for a pull).
    #[arg(long, value_name = "LIST")]
    pub arch: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// The package name containers see: /opt/gpuarch/kernels/NAME.
    pub name: String,
    /// The files: shared libraries with .nv_fatbin, fatbins, cubins, PTX.
    #[arg(required = true)]
    pub files: Vec<std::path::PathBuf>,
    /// One file serves all of a container's GPUs, and its directory goes
    /// into the container's loader cache (ldconfig).
    #[arg(long)]
    pub ldconfig: bool,
}

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// GPUs as NVIDIA_VISIBLE_DEVICES names them: indexes, UUIDs, GPU:MIG, all.
    #[arg(long, value_name = "LIST", required_unless_present = "config")]
    pub devices: Option<String>,
    /// Plan for this OCI config.json ('-' reads stdin).
    #[arg(long, value_name = "CONFIG.json", conflicts_with = "devices")]
    pub config: Option<PathBuf>,
    /// With --devices: a variable the container sets (KEY=VALUE), repeatable.
    #[arg(
        long = "env",
        short = 'e',
        value_name = "KEY=VALUE",
        requires = "devices"
    )]
    pub env: Vec<String>,
    /// A consumer the image holds (DIST==VERSION: torch==2.9.1,
    /// xformers==0.0.33, deepspeed==0.19.8), repeatable; given once or more,
    /// the image is taken to hold no other ('none' for none at all).
    /// Without it the image's consumers are not known.
    #[arg(long = "software", value_name = "DIST==VERSION")]
    pub software: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum ArchCmd {
    /// Does code built for TARGETS (a list: 8.0, sm_80, compute_80, 8.0+PTX, Ampere...) run on --on?
    Check {
        targets: String,
        /// The device's compute capability (8.6 or sm_86).
        #[arg(long, value_name = "CAP")]
        on: String,
        /// CUDA version the driver supports, for PTX (e.g. 13.0).
        #[arg(long, value_name = "X.Y")]
        driver_cuda: Option<String>,
        /// CUDA version of the toolkit that produced the PTX (e.g. 12.8).
        #[arg(long, value_name = "X.Y")]
        ptx_cuda: Option<String>,
    },
    /// Read an architecture list and print it in canonical form.
    Parse { list: String },
    /// Which gated features a compute capability has.
    Features { cap: String },
    /// Which architectures a CUDA toolkit builds (sm_XY), and with --on,
    /// what it builds that runs on a GPU; without a version, every release
    /// where that changes.
    Toolkit {
        /// The toolkit's CUDA version (12.8, or 12.8.1 as CUDA_VERSION says it).
        cuda: Option<String>,
        /// A GPU's compute capability: the target this toolkit builds for it.
        #[arg(long, value_name = "CAP", requires = "cuda")]
        on: Option<String>,
    },
    /// The arch names each torch release takes in TORCH_CUDA_ARCH_LIST
    /// (its cpp_extension's supported_arches); with a version, that one's.
    Torch {
        /// A torch release (2.9.1, or 2.9.1+cu128 as its dist-info says).
        version: Option<String>,
    },
}

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Read the host's files below this directory (an image, a chroot).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
}
