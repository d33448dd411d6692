//! The real engines most GPU nodes run, started once per test binary on
//! private sockets: containerd (its CRI plugin too) with gpuarch's
//! containerd drop-in, and dockerd on that containerd with gpuarch in
//! `daemon.json`. Whose: the host's (Debian 12: containerd 1.6, Docker
//! 20.10, runc 1.1), or with `GPUARCH_ENGINES=sid` those of the Debian root
//! `scripts/test` builds (containerd 2.1, Docker 28, runc 1.3), each run
//! inside that root ([`crate::stack`]), their CLIs from it. Nothing of the host's is used: their roots, sockets, the
//! gpuarch config (`GPUARCH_CONFIG`, set on containerd alone, as
//! `/etc/gpuarch/config.yaml` would be found), its snapshot (the config's
//! `daemon.snapshot`, no env) and its log are in one directory that goes
//! when the test binary exits.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::containers::make_rootfs;
use crate::{artifacts, cannot_run, fixture, which, workspace_root};

/// The image every container runs: a busybox-static rootfs, `docker import`ed.
pub const IMAGE: &str = "gpuarch.test/busybox:1";
/// The CRI sandbox image: the same rootfs, sleeping.
pub const PAUSE: &str = "gpuarch.test/pause:1";
/// [`IMAGE`] with DeepSpeed 0.19.8 and torch 2.9.1 installed (their real
/// dist-info, tests/fixtures/images/deepspeed): Docker only.
pub const DEEPSPEED_IMAGE: &str = "gpuarch.test/deepspeed:1";
/// [`IMAGE`] with every real Python layout (tests/fixtures/images/layouts),
/// uv's `/app/.venv` on its PATH: Docker only.
pub const LAYOUTS_IMAGE: &str = "gpuarch.test/layouts:1";
/// What the tools are called where the test needs them.
pub const TOOLS: [&str; 5] = [
    "containerd",
    "ctr",
    "dockerd",
    "containerd-shim-runc-v2",
    "runc",
];

/// Why the engines cannot run here, if they cannot.
pub fn missing() -> Option<String> {
    let busybox = || {
        (!Path::new("/bin/busybox").is_file())
            .then(|| "no /bin/busybox (apt install busybox-static)".to_owned())
    };
    match crate::roots::engine_root() {
        Err(why) => Some(why),
        Ok(None) => cannot_run("to run containerd and dockerd", &TOOLS).or_else(busybox),
        Ok(Some(root)) => cannot_run("to run an engine root", &["unshare", "chroot", "tar"])
            .or_else(|| {
                [
                    "usr/sbin/dockerd",
                    "usr/bin/docker",
                    "usr/bin/ctr",
                    "usr/bin/runc",
                ]
                .iter()
                .find(|p| !root.join(p).is_file())
                .map(|p| {
                    format!(
                        "the engine root {} has no /{p} (scripts/lib/setup.sh: ENGINE_ROOTS)",
                        root.display()
                    )
                })
            })
            .or_else(busybox),
    }
}

/// The running engines and their files.
#[derive(Debug)]
pub struct Engines {
    /// The Debian root the engines run in; `None`: the host's.
    pub root: Option<PathBuf>,
    pub dir: PathBuf,
    pub containerd_sock: PathBuf,
    pub docker_host: String,
    /// containerd's config.toml (imports conf.d/*.toml).
    pub containerd_config: PathBuf,
    /// The gpuarch config the shim reads.
    pub gpuarch_config: PathBuf,
    /// Where the shim and hook log.
    pub log: PathBuf,
    /// Stand-in `/dev/nvidiaN` nodes (char 195:N).
    pub dev: PathBuf,
    lock: Mutex<()>,
    /// dockerd's process id, once started.
    dockerd: Mutex<Option<u32>>,
}

struct Running {
    dir: PathBuf,
    children: Vec<Child>,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

extern "C" fn stop_at_exit() {
    let Some(mut r) = RUNNING.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return;
    };
    // dockerd first (it stops its containers through containerd).
    for c in r.children.iter_mut().rev() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(15) {
            if let Ok(Some(_)) = c.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    // The tmpfs standing for /run, and whatever containerd left on it.
    let _ = nix::mount::umount2(&r.dir.join("run"), nix::mount::MntFlags::MNT_DETACH);
    if std::env::var_os("GPUARCH_KEEP_ENGINES").is_some() {
        eprintln!("engines: kept {} (GPUARCH_KEEP_ENGINES)", r.dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&r.dir);
    }
}

/// The engines, started on first use; `None` where they cannot run
/// ([`missing`] says why).
/// When they fail to start, the first failure is kept and every test
/// fails with it at once, after what was started is stopped and removed.
pub fn engines() -> Option<&'static Engines> {
    static E: OnceLock<Result<Option<Engines>, String>> = OnceLock::new();
    let started = E.get_or_init(|| {
        if missing().is_some() {
            return Ok(None);
        }
        std::panic::catch_unwind(Engines::start)
            .map(Some)
            .map_err(|p| {
                stop_at_exit();
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default()
            })
    });
    match started {
        Ok(e) => e.as_ref(),
        Err(why) => panic!("the engines did not start (not retried): {why}"),
    }
}

fn docker_cli(root: Option<&Path>) -> PathBuf {
    // Debian's client, the same release as its dockerd. A root's (and its
    // ctr and compose) needs only libc, so it runs outside the root.
    if let Some(root) = root {
        return root.join("usr/bin/docker");
    }
    let debian = Path::new("/usr/bin/docker");
    if debian.is_file() {
        debian.to_owned()
    } else {
        which("docker").unwrap_or_else(|| debian.to_owned())
    }
}

fn wait_for(what: &str, log: &Path, mut ready: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ready() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{what} did not come up in 60 s:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `dir`'s tree as the tar archive `tar`, for `docker import`.
fn tar_of(dir: &Path, tar: &Path) {
    check(
        Command::new("tar")
            .arg("-C")
            .arg(dir)
            .arg("-cf")
            .arg(tar)
            .arg(".")
            .output()
            .unwrap(),
        "tar",
    );
}

fn check(o: Output, what: &str) -> Output {
    assert!(
        o.status.success(),
        "{what}: {:?}\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

impl Engines {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(crate::containers::unique("engines"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        *RUNNING.lock().unwrap() = Some(Running {
            dir: dir.clone(),
            children: Vec::new(),
        });
        // SAFETY: registers a plain function with no arguments.
        unsafe { libc::atexit(stop_at_exit) };

        // Stand-in GPUs: the 2080 Ti + 3090 fixture as gpuarchd's snapshot,
        // and their device nodes.
        let dev = crate::containers::nvidia_nodes(&dir.join("dev"), &[0, 1]);
        // A tmpfs for what a host keeps in /run: containerd's state (every
        // container's bundle, where the shim rewrites config.json), and
        // gpuarch's snapshot and log. On this machine's ext4 each file
        // the shim writes there made containerd's next fsync slower.
        let run = dir.join("run");
        std::fs::create_dir_all(&run).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &run,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some("mode=0755"),
        )
        .unwrap();
        std::fs::create_dir_all(run.join("gpuarch")).unwrap();
        std::fs::copy(fixture("2080ti-3090"), run.join("gpuarch/inventory.json")).unwrap();
        let e = Self {
            root: crate::roots::engine_root().unwrap(),
            containerd_sock: dir.join("containerd.sock"),
            docker_host: format!("unix://{}", dir.join("docker.sock").display()),
            containerd_config: dir.join("containerd/config.toml"),
            gpuarch_config: dir.join("gpuarch.yaml"),
            log: dir.join("run/gpuarch/gpuarch.log"),
            dev,
            dir,
            lock: Mutex::new(()),
            dockerd: Mutex::new(None),
        };
        e.set_gpuarch_config("");
        e.start_containerd();
        e.start_dockerd();
        e.import_images();
        eprintln!("engines: {}", e.versions());
        e
    }

    /// Which engines these are: the root's package versions, or the host's.
    pub fn versions(&self) -> String {
        match &self.root {
            Some(root) => {
                ["containerd", "docker.io", "runc"]
                    .map(|p| format!("{p} {}", crate::roots::version(root, p)))
                    .join(", ")
                    + &format!(" (the root {})", root.display())
            }
            None => {
                let v = |argv: &[&str]| {
                    Command::new(argv[0])
                        .args(&argv[1..])
                        .output()
                        .map(|o| {
                            String::from_utf8_lossy(&o.stdout)
                                .lines()
                                .next()
                                .unwrap_or("")
                                .to_owned()
                        })
                        .unwrap_or_default()
                };
                format!(
                    "the host's: {}; {}; {}",
                    v(&["containerd", "--version"]),
                    v(&["dockerd", "--version"]),
                    v(&["runc", "--version"])
                )
            }
        }
    }

    /// `program` of these engines: the host's, or run inside the root
    /// with this directory and the workspace (gpuarch's binaries, the
    /// fixtures) at their own paths.
    pub fn program(&self, program: &str) -> Command {
        match &self.root {
            Some(root) => {
                crate::roots::command_in(root, &[&self.dir, &workspace_root()], &[program])
            }
            None => Command::new(program),
        }
    }

    /// A host tool of these engines that runs outside any root (`ctr`,
    /// `docker-compose`): the root's copy, or the host's.
    pub fn tool(&self, name: &str) -> Option<PathBuf> {
        match &self.root {
            Some(root) => Some(root.join("usr/bin").join(name)).filter(|p| p.is_file()),
            None => which(name),
        }
    }

    /// A scratch directory of the test's that the engines see at its path.
    pub fn scratch(&self) -> tempfile::TempDir {
        tempfile::tempdir_in(&self.dir).unwrap()
    }

    /// gpuarchd's snapshot (the 2080 Ti + 3090), as `daemon.snapshot`.
    pub fn snapshot(&self) -> PathBuf {
        self.path("run/gpuarch/inventory.json")
    }

    /// Hold while a test changes the gpuarch config or counts on it.
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Write the gpuarch config: `extra` YAML after the engines' own keys
    /// (the snapshot, the log, kernel paths of their own).
    pub fn set_gpuarch_config(&self, extra: &str) {
        self.set_gpuarch_config_with("info", &self.snapshot(), extra);
    }

    /// [`Engines::set_gpuarch_config`] with the log level and snapshot given.
    pub fn set_gpuarch_config_with(&self, level: &str, snapshot: &Path, extra: &str) {
        let d = self.dir.display();
        let yaml = format!(
            "daemon:\n  snapshot: {}\nlog:\n  to: file\n  level: {level}\n  file: {}\n\
             kernels:\n  mount_root: {d}/kernels\n  cache_dir: {d}/cache\n  spool_dir: {d}/spool\n  view_dir: {d}/views\n{extra}",
            snapshot.display(),
            self.log.display()
        );
        let yaml = crate::private_hook_paths(&yaml, &self.dir);
        std::fs::write(&self.gpuarch_config, yaml).unwrap();
    }

    /// What the shim and hook have logged since the last call.
    pub fn take_log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let _ = std::fs::remove_file(&self.log);
        text
    }

    /// The arguments that run a program where dockerd's mounts are seen
    /// (a container's rootfs): `nsenter` into its mount namespace where it
    /// runs inside a root, nothing on the host's.
    pub fn in_dockers_mounts(&self) -> Vec<std::ffi::OsString> {
        match (&self.root, *self.dockerd.lock().unwrap()) {
            (Some(_), Some(pid)) => vec![
                "nsenter".into(),
                format!("--mount=/proc/{pid}/ns/mnt").into(),
                "--".into(),
            ],
            _ => Vec::new(),
        }
    }

    fn spawn(&self, name: &str, cmd: &mut Command) -> u32 {
        let log = std::fs::File::create(self.path(&format!("{name}.log"))).unwrap();
        let child = cmd
            .env_remove("GPUARCH_INVENTORY")
            .env_remove("GPUARCH_LOG")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let pid = child.id();
        RUNNING
            .lock()
            .unwrap()
            .as_mut()
            .unwrap()
            .children
            .push(child);
        pid
    }

    fn start_containerd(&self) {
        let d = self.dir.display();
        let conf = self.containerd_config.parent().unwrap();
        std::fs::create_dir_all(conf.join("conf.d")).unwrap();
        let disabled = if self.root.is_some() {
            format!("disabled_plugins = {:?}\n", crate::stack::DISABLED)
        } else {
            String::new()
        };
        std::fs::write(
            &self.containerd_config,
            format!(
                r#"version = 2
{disabled}imports = ["{d}/containerd/conf.d/*.toml"]
root = "{d}/containerd/root"
state = "{d}/run/containerd"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  # This machine refuses a negative oom_score_adj even to root (the write
  # fails with EIO), and CRI gives sandboxes -998: runc's init then dies.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
"#
            ),
        )
        .unwrap();
        check(
            Command::new(&artifacts().gpuarchctl)
                .args(["engine", "containerd", "--config"])
                .arg(&self.containerd_config)
                .arg("--runtime")
                .arg(&artifacts().gpuarch_runtime)
                .arg("--write")
                .arg(conf.join("conf.d/gpuarch.toml"))
                .output()
                .unwrap(),
            "gpuarchctl engine containerd",
        );
        self.spawn(
            "containerd",
            self.program("containerd")
                .arg("--config")
                .arg(&self.containerd_config)
                .env("GPUARCH_CONFIG", &self.gpuarch_config),
        );
        let log = self.path("containerd.log");
        wait_for("containerd", &log, || {
            self.ctr(&["version"]).status.success()
        });
    }

    fn start_dockerd(&self) {
        let mut daemon: serde_json::Value = serde_json::from_slice(
            &std::fs::read(workspace_root().join("packaging/docker/daemon.json")).unwrap(),
        )
        .unwrap();
        // gpuarch's runtime is merged in by `gpuarchctl engine docker`, as
        // an admin does; the shipped example's entry is taken out first.
        daemon["runtimes"]
            .as_object_mut()
            .unwrap()
            .remove("gpuarch");
        let chain = self.chain_scripts();
        daemon["runtimes"]["nvidia-standin"] = serde_json::json!({"path": chain});
        if self.root.is_some() {
            // Docker 28 has CDI (20.10 has none): the node's specs here.
            daemon["cdi-spec-dirs"] = serde_json::json!([self.path("cdi")]);
            self.write_cdi_spec();
        }
        let file = self.path("daemon.json");
        std::fs::write(&file, daemon.to_string()).unwrap();
        let o = Command::new(&artifacts().gpuarchctl)
            .args(["engine", "docker", "--default", "--write", "--config"])
            .arg(&file)
            .arg("--runtime")
            .arg(&artifacts().gpuarch_runtime)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success() && said.contains("systemctl restart docker"),
            "gpuarchctl engine docker: {said}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        // A stand-in for NVIDIA's hook on dockerd's PATH: with it dockerd
        // registers its `gpu` device driver, which `--gpus` and compose's
        // GPU reservations need; it records each call and does nothing.
        let bin = self.path("nvidia-bin");
        std::fs::create_dir_all(&bin).unwrap();
        let hook = bin.join("nvidia-container-runtime-hook");
        std::fs::write(
            &hook,
            format!(
                "#!/bin/sh\ncat >/dev/null\nprintf '%s\\n' \"$*\" >> {}\n",
                self.path("nvidia-hook.calls").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let pid = self.spawn(
            "dockerd",
            self.program("dockerd")
                .env("PATH", path)
                .arg("--containerd")
                .arg(&self.containerd_sock)
                .arg("--data-root")
                .arg(self.path("docker"))
                .arg("--exec-root")
                .arg(self.path("docker-exec"))
                .arg("--pidfile")
                .arg(self.path("docker.pid"))
                .arg("--host")
                .arg(&self.docker_host)
                .arg("--config-file")
                .arg(&file)
                .args([
                    "--storage-driver",
                    "vfs",
                    "--bridge",
                    "none",
                    "--iptables=false",
                    "--ip-masq=false",
                    "--userland-proxy=false",
                ]),
        );
        *self.dockerd.lock().unwrap() = Some(pid);
        let log = self.path("dockerd.log");
        wait_for("dockerd", &log, || {
            self.docker(&["version"]).status.success()
        });
    }

    /// NVIDIA's runtime in the chain, by stand-ins (its packages are not
    /// installable here): `nvidia-standin`, Docker's runtime, records its
    /// arguments and execs gpuarch-runtime; `nvidia-inner`, which tests set
    /// as gpuarch's `runtime.path`, records its arguments and the bundle's
    /// config.json on create, then execs runc. Returns the first.
    fn chain_scripts(&self) -> PathBuf {
        let rec = self.path("chain");
        std::fs::create_dir_all(&rec).unwrap();
        let outer = self.path("nvidia-standin");
        let inner = self.path("nvidia-inner");
        let script = |path: &Path, name: &str, next: &Path| {
            std::fs::write(
                path,
                format!(
                    "#!/bin/sh\n\
                     printf '%s\\n' \"$*\" >> {rec}/{name}.args\n\
                     prev=\nfor a in \"$@\"; do\n\
                       if [ \"$prev\" = --bundle ]; then cp \"$a/config.json\" {rec}/{name}.config.json; fi\n\
                       prev=$a\ndone\n\
                     exec {next} \"$@\"\n",
                    rec = rec.display(),
                    next = next.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        script(&outer, "outer", &artifacts().gpuarch_runtime);
        script(&inner, "inner", &which("runc").unwrap());
        outer
    }

    fn import_images(&self) {
        let rootfs = self.path("rootfs");
        make_rootfs(&rootfs);
        for applet in ["sleep", "grep", "sort"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
        }
        let tar = self.path("rootfs.tar");
        tar_of(&rootfs, &tar);
        for (image, cmd) in [
            (IMAGE, r#"CMD ["/bin/sh"]"#),
            (PAUSE, r#"CMD ["/bin/sleep", "2147483647"]"#),
        ] {
            check(
                self.docker(&["import", "--change", cmd, tar.to_str().unwrap(), image]),
                "docker import",
            );
        }
        // The same busybox with an image's Python environments in it:
        // DeepSpeed in conda's base; every real layout, with uv's venv on
        // PATH as uv's images set it.
        let python_images: [(&str, &str, &[&str]); 2] = [
            ("deepspeed", DEEPSPEED_IMAGE, &[]),
            ("layouts", LAYOUTS_IMAGE, &crate::layouts::ENV),
        ];
        for (fixture, image, env) in python_images {
            let root = self.path(&format!("rootfs-{fixture}"));
            let tar = self.path(&format!("rootfs-{fixture}.tar"));
            check(
                Command::new("cp")
                    .arg("-a")
                    .arg(&rootfs)
                    .arg(&root)
                    .output()
                    .unwrap(),
                "cp",
            );
            check(
                Command::new("cp")
                    .arg("-a")
                    .arg(crate::image_fixture(fixture).join("."))
                    .arg(&root)
                    .output()
                    .unwrap(),
                "cp",
            );
            tar_of(&root, &tar);
            let changes: Vec<String> = env.iter().map(|e| format!("ENV {e}")).collect();
            let mut args = vec!["import", "--change", r#"CMD ["/bin/sh"]"#];
            for c in &changes {
                args.extend(["--change", c]);
            }
            args.extend([tar.to_str().unwrap(), image]);
            check(self.docker(&args), "docker import");
        }
        let saved = self.path("images.tar");
        check(
            self.docker(&["save", "-o", saved.to_str().unwrap(), IMAGE, PAUSE]),
            "docker save",
        );
        // containerd 2.x's ctr unpacks only for a platform it is given.
        let platform: &[&str] = if self.root.is_some() {
            &["--local", "--platform", "linux/amd64"]
        } else {
            &[]
        };
        for ns in ["default", "k8s.io"] {
            let saved = saved.to_str().unwrap();
            let args = [
                &["-n", ns, "images", "import", "--snapshotter", "native"][..],
                platform,
                &[saved],
            ]
            .concat();
            check(self.ctr(&args), "ctr images import");
        }
    }

    /// NVIDIA's CDI spec for both GPUs, as `nvidia-ctk cdi generate` writes
    /// it, on the stand-in device nodes: `nvidia.com/gpu=0`, `=1`, `=all`.
    fn write_cdi_spec(&self) {
        let node = |n: u32| serde_json::json!({"path": format!("/dev/nvidia{n}"), "hostPath": self.dev.join(format!("nvidia{n}"))});
        let spec = serde_json::json!({
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "devices": [
                {"name": "0", "containerEdits": {"deviceNodes": [node(0)]}},
                {"name": "1", "containerEdits": {"deviceNodes": [node(1)]}},
                {"name": "all", "containerEdits": {"deviceNodes": [node(0), node(1)]}},
            ],
            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
        });
        let dir = self.path("cdi");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("nvidia.json"), spec.to_string()).unwrap();
    }

    /// The Docker CLI against this dockerd.
    pub fn docker_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(docker_cli(self.root.as_deref()));
        c.arg("--host").arg(&self.docker_host).args(args);
        c.env("DOCKER_CONFIG", self.path("docker-cli"));
        c
    }

    pub fn docker(&self, args: &[&str]) -> Output {
        self.docker_cmd(args).output().unwrap()
    }

    /// ctr against this containerd.
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new(self.tool("ctr").unwrap())
            .arg("--address")
            .arg(&self.containerd_sock)
            .args(args)
            .output()
            .unwrap()
    }
}
