//! Real containers for the end-to-end tests: a busybox-static rootfs, runc
//! and crun bundles started behind `gpuarch-runtime` or not, podman with the
//! shipped hooks.d file, and what the process inside saw.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

use crate::{artifacts, cannot_run, fixture, which, workspace_root};

const BUSYBOX: &str = "/bin/busybox";
/// What a container runs unless its scene says otherwise: its env, the env
/// file, the kernel packages (their names, manifests and files, and which
/// of their directories it could write), its loader cache, the mount points
/// at and under the kernel directory; `@@@` between.
pub const SCRIPT: &str = "env; echo @@@; cat /run/gpuarch/env 2>/dev/null; echo @@@; \
     ls /opt/gpuarch/kernels 2>/dev/null; cat /opt/gpuarch/kernels/*/manifest.json 2>/dev/null; \
     echo ===; find /opt/gpuarch/kernels -type f 2>/dev/null | sort; \
     set --; for d in /opt/gpuarch/kernels/*/ /opt/gpuarch/kernels/*/*/; do set -- \"$@\" \"${d}x\"; done; \
     touch \"$@\" 2>/dev/null; for f in \"$@\"; do [ -e \"$f\" ] && echo WRITABLE ${f%x}; done; echo @@@; \
     cat /etc/ld.so.cache 2>/dev/null; echo @@@; \
     cut -d' ' -f5,6 /proc/self/mountinfo | grep '^/opt/gpuarch/kernels'; true";

/// `None` when this machine can run the test; else the reason it cannot.
/// With `GPUARCH_ENGINES=SUITE` the tools are those of that engine root.
pub fn missing(tools: &[&str]) -> Option<String> {
    if let Some(why) = cannot_run("to run containers", &[]) {
        return Some(why);
    }
    if !Path::new(BUSYBOX).is_file() {
        return Some(format!("no {BUSYBOX} (apt install busybox-static)"));
    }
    match crate::roots::engine_root() {
        Err(why) => Some(why),
        Ok(None) => cannot_run("to run containers", tools),
        Ok(Some(root)) => tools
            .iter()
            .find(|t| {
                !["usr/bin", "usr/sbin"]
                    .iter()
                    .any(|d| root.join(d).join(t).is_file())
            })
            .map(|t| format!("the engine root {} has no {t}", root.display())),
    }
}

/// `program`, from the engine root `GPUARCH_ENGINES` names (run inside it,
/// with `shared` and the workspace at their own paths, in `cwd`) or the
/// host's.
pub fn engine_command(program: &Path, cwd: &Path, shared: &Path) -> Command {
    match crate::roots::engine_root().ok().flatten() {
        Some(root) => crate::roots::command_in_dir(
            &root,
            &[shared, &workspace_root()],
            cwd,
            program.as_os_str(),
        ),
        None => {
            let mut c = Command::new(program);
            c.current_dir(cwd);
            c
        }
    }
}

/// Skip the test, saying why, unless it may run containers with `tools`.
#[macro_export]
macro_rules! need_containers {
    ($($tool:expr),*) => {
        $crate::skip_unless!($crate::containers::missing(&[$($tool),*]))
    };
}

pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "gpuarch-{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// A busybox rootfs with the directories a container needs.
pub fn make_rootfs(dir: &Path) {
    for d in ["bin", "etc", "run", "proc", "sys", "dev", "tmp", "opt"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::copy(BUSYBOX, dir.join("bin/busybox")).unwrap();
    for applet in ["sh", "env", "cat", "echo", "ls", "touch", "true"] {
        symlink("busybox", dir.join("bin").join(applet)).unwrap();
    }
}

/// Stand-in GPU device nodes `dir/nvidiaN` (char 195:N, the NVIDIA major)
/// for each minor; returns `dir`.
pub fn nvidia_nodes(dir: &Path, minors: &[u64]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for &minor in minors {
        nix::sys::stat::mknod(
            &dir.join(format!("nvidia{minor}")),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, minor),
        )
        .unwrap();
    }
    dir.to_owned()
}

/// `env` (a container's) holds none of gpuarch's variables, bar the
/// container's own `GPUARCH_DISABLE`.
pub fn no_gpuarch_env(env: &BTreeMap<String, String>, what: &str) {
    let ours: Vec<_> = env
        .keys()
        .filter(|k| k.starts_with("GPUARCH_") && *k != "GPUARCH_DISABLE")
        .collect();
    assert!(ours.is_empty(), "{what}: gpuarch env leaked in: {ours:?}");
}

/// What the container saw.
#[derive(Debug)]
pub struct Seen {
    pub out: Output,
    pub env: BTreeMap<String, String>,
    /// `/run/gpuarch/env`.
    pub env_file: String,
    /// The mounted packages, their manifests, `===`, their files.
    pub kernels: String,
    pub ld_cache: String,
    /// Mount points at or under `/opt/gpuarch/kernels`, in mount order.
    pub kernel_mounts: Vec<String>,
    /// Those of them not mounted read-only.
    pub kernel_mounts_writable: Vec<String>,
}

impl Seen {
    pub fn parse(out: Output) -> Self {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut parts = stdout.split("@@@\n");
        let env = parts
            .next()
            .unwrap_or("")
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let env_file = parts.next().unwrap_or("").to_owned();
        let kernels = parts.next().unwrap_or("").to_owned();
        let ld_cache = parts.next().unwrap_or("").to_owned();
        let (mut kernel_mounts, mut kernel_mounts_writable) = (Vec::new(), Vec::new());
        for l in parts.next().unwrap_or("").lines() {
            let (point, options) = l.split_once(' ').unwrap_or((l, ""));
            if !options.split(',').any(|o| o == "ro") {
                kernel_mounts_writable.push(point.to_owned());
            }
            kernel_mounts.push(point.to_owned());
        }
        Self {
            out,
            env,
            env_file,
            kernels,
            ld_cache,
            kernel_mounts,
            kernel_mounts_writable,
        }
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.env.get(k).map(String::as_str)
    }

    pub fn ok(&self) -> &Self {
        assert!(
            self.out.status.success(),
            "container failed: {:?}\nstdout: {}\nstderr: {}",
            self.out.status,
            String::from_utf8_lossy(&self.out.stdout),
            self.stderr()
        );
        self
    }

    /// The manifests of the mounted kernel packages that name their
    /// package (all published ones do), by package.
    pub fn manifests(&self) -> BTreeMap<String, Value> {
        let json = self.kernels.split("===").next().unwrap_or("");
        let start = json.find('{').unwrap_or(json.len());
        serde_json::Deserializer::from_str(&json[start..])
            .into_iter::<Value>()
            .map(|v| v.unwrap())
            .filter_map(|v| Some((v["package"].as_str()?.to_owned(), v)))
            .collect()
    }

    /// The files under the kernel directory, a path a line, then a
    /// `WRITABLE dir` line for each directory the container could write.
    pub fn files(&self) -> &str {
        self.kernels.split("===").nth(1).unwrap_or("")
    }

    /// Variable `k` as the container has it: in its env (the shim, an
    /// engine) or else in `/run/gpuarch/env` (the in-container stage alone).
    pub fn var(&self, k: &str) -> Option<&str> {
        self.get(k).or_else(|| {
            self.env_file
                .lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
        })
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    /// The three hints (arch list, dtype, attention), as the container's env
    /// has them.
    pub fn hints(&self) -> (Option<&str>, Option<&str>, Option<&str>) {
        (
            self.get("TORCH_CUDA_ARCH_LIST"),
            self.get("GPUARCH_DTYPE"),
            self.get("GPUARCH_ATTN_IMPLEMENTATION"),
        )
    }

    pub fn untouched(&self) {
        no_gpuarch_env(&self.env, "container");
        assert!(self.env_file.is_empty(), "env file: {}", self.env_file);
        assert!(self.kernel_mounts.is_empty(), "{:?}", self.kernel_mounts);
    }
}

/// A test's scratch space: a rootfs, a gpuarch config, an inventory.
#[derive(Debug)]
pub struct Scene {
    dir: tempfile::TempDir,
    /// The gpuarch `config.yaml` of the hook and the shim.
    pub config_yaml: String,
    /// `GPUARCH_INVENTORY`; `None` leaves the hook to NVML.
    pub inventory: Option<PathBuf>,
    pub extra_env: Vec<(String, String)>,
    /// The shell script each container runs; its output is a [`Seen`].
    pub probe: &'static str,
    /// Where [`Scene::bundle_on`] makes bundles: the scene's directory
    /// unless a test says otherwise.
    pub bundles: Option<PathBuf>,
    /// Bundles mount a fresh tmpfs on `/run` (the default: the tests'
    /// containers share one rootfs). Docker and Kubernetes mount nothing
    /// there, which lets the shim write the env files itself.
    pub run_tmpfs: bool,
    /// podman's `--cdi-spec-dir` (podman 5; 4.3 reads only /etc/cdi and
    /// /var/run/cdi).
    pub cdi_dir: Option<PathBuf>,
}

impl Default for Scene {
    fn default() -> Self {
        Self::new()
    }
}

impl Scene {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        make_rootfs(&dir.path().join("rootfs"));
        Self {
            dir,
            config_yaml: String::new(),
            inventory: Some(fixture("2080ti-3090")),
            extra_env: Vec::new(),
            probe: SCRIPT,
            bundles: None,
            run_tmpfs: true,
            cdi_dir: None,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where the scene's hook and shim log (`log.file`).
    pub fn log_file(&self) -> PathBuf {
        self.path().join("gpuarch.log")
    }

    /// What the hook and the shim have logged so far, and forget it.
    pub fn take_log(&self) -> String {
        let text = std::fs::read_to_string(self.log_file()).unwrap_or_default();
        let _ = std::fs::remove_file(self.log_file());
        text
    }

    pub fn rootfs(&self) -> PathBuf {
        self.path().join("rootfs")
    }

    pub fn config_file(&self, runtime: Option<&Path>) -> PathBuf {
        let p = self.path().join("config.yaml");
        let mut yaml = self.config_yaml.clone();
        if !yaml.starts_with("log:") && !yaml.contains("\nlog:") {
            // The hook's and the shim's lines: never the host's /run/gpuarch.
            yaml.push_str(&format!(
                "\nlog:\n  to: file\n  file: {}\n",
                self.log_file().display()
            ));
        }
        if let Some(r) = runtime {
            let path = format!("runtime:\n  path: {}\n", r.display());
            if yaml.starts_with("runtime:\n") || yaml.contains("\nruntime:\n") {
                yaml = yaml.replacen("runtime:\n", &path, 1);
            } else {
                yaml.push('\n');
                yaml.push_str(&path);
            }
        }
        let yaml = crate::private_hook_paths(&yaml, self.path());
        std::fs::write(&p, yaml).unwrap();
        p
    }

    /// A bundle for runc/crun: the runtime's own `spec`, our process.
    pub fn bundle(&self, runtime: &str, env: &[&str]) -> PathBuf {
        self.bundle_with(runtime, env, None)
    }

    /// A bundle with `hooks` set in its config, as an engine that runs
    /// gpuarch-hook as a plain OCI hook would write it.
    pub fn bundle_with(&self, runtime: &str, env: &[&str], hooks: Option<Value>) -> PathBuf {
        self.bundle_on(&self.rootfs(), runtime, env, hooks)
    }

    /// A bundle on `rootfs` (made with [`make_rootfs`]).
    pub fn bundle_on(
        &self,
        rootfs: &Path,
        runtime: &str,
        env: &[&str],
        hooks: Option<Value>,
    ) -> PathBuf {
        let b = self
            .bundles
            .as_deref()
            .unwrap_or(self.path())
            .join(unique("bundle"));
        std::fs::create_dir_all(&b).unwrap();
        let o = engine_command(Path::new(runtime), &b, self.path())
            .arg("spec")
            .output()
            .unwrap();
        assert!(o.status.success(), "{runtime} spec: {o:?}");
        let mut c: Value =
            serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
        c["root"] = json!({"path": rootfs, "readonly": false});
        c["process"]["terminal"] = json!(false);
        c["process"]["args"] = json!(["sh", "-c", self.probe]);
        // As engines merge a container's env over its image's: a name
        // given here replaces the spec's entry of that name.
        let name = |e: &str| e.split_once('=').map_or(e, |(k, _)| k).to_owned();
        let given: Vec<String> = env.iter().map(|e| name(e)).collect();
        let base = c["process"]["env"].as_array().unwrap().clone();
        c["process"]["env"] = Value::Array(
            base.into_iter()
                .filter(|e| e.as_str().is_none_or(|e| !given.contains(&name(e))))
                .chain(env.iter().map(|e| json!(e)))
                .collect(),
        );
        if self.run_tmpfs {
            c["mounts"]
                .as_array_mut()
                .unwrap()
                .push(json!({"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]}));
        }
        if let Some(h) = hooks {
            c["hooks"] = h;
        }
        std::fs::write(b.join("config.json"), c.to_string()).unwrap();
        b
    }

    /// `gpuarch-runtime run` in front of `runtime` (runc or crun).
    pub fn shim(&self, runtime: &str, env: &[&str]) -> Seen {
        let bundle = self.bundle(runtime, env);
        self.run_bundle(runtime, &bundle, true)
    }

    /// The hook entry an engine would put in a config for `stage`.
    pub fn hook_entry(&self, stage: &str) -> Value {
        let mut env = vec![format!(
            "GPUARCH_CONFIG={}",
            self.config_file(None).display()
        )];
        if let Some(inv) = &self.inventory {
            env.push(format!("GPUARCH_INVENTORY={}", inv.display()));
        }
        json!([{"path": artifacts().gpuarch_hook, "args": ["gpuarch-hook", stage], "env": env}])
    }

    /// Run `bundle` with `runtime`, through the shim or not.
    pub fn run_bundle(&self, runtime: &str, bundle: &Path, shim: bool) -> Seen {
        let config = self.config_file(Some(&which(runtime).unwrap()));
        Seen::parse(
            self.bundle_cmd(runtime, bundle, shim, &config)
                .output()
                .unwrap(),
        )
    }

    /// The command that runs `bundle` with `runtime`, through the shim (with
    /// gpuarch's `config`, from [`Scene::config_file`]) or not.
    pub fn bundle_cmd(&self, runtime: &str, bundle: &Path, shim: bool, config: &Path) -> Command {
        let shim = if shim {
            artifacts().gpuarch_runtime.clone()
        } else {
            which(runtime).unwrap()
        };
        let id = unique(runtime);
        let mut cmd = if runtime == "crun" {
            // crun wants cgroup v2 alone: hide the hybrid v1 "unified" mount
            // in a private mount namespace (an engine root's is one; a no-op
            // where there is no such mount). A tmpfs of the namespace's own
            // goes in its place: crun leaves a directory per container
            // there, which on the host's /sys/fs/cgroup tmpfs (1024 inodes)
            // added up over runs until crun could start no container.
            let mut c = if crate::roots::engine_root().ok().flatten().is_some() {
                engine_command(Path::new("sh"), self.path(), self.path())
            } else {
                let mut c = Command::new("unshare");
                c.args(["--mount", "--propagation", "private", "sh"]);
                c
            };
            c.arg("-c")
                .arg(
                    "umount /sys/fs/cgroup/unified 2>/dev/null && \
                     mount -t tmpfs -o size=64k,mode=0755 gpuarch-unified /sys/fs/cgroup/unified; \
                     exec \"$@\"",
                )
                .arg("sh")
                .arg(shim);
            c
        } else {
            engine_command(&shim, self.path(), self.path())
        };
        cmd.args(["run", "--bundle"])
            .arg(bundle)
            .arg(&id)
            .env("GPUARCH_CONFIG", config)
            .env_remove("GPUARCH_INVENTORY");
        if let Some(inv) = &self.inventory {
            cmd.env("GPUARCH_INVENTORY", inv);
        }
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        cmd
    }

    /// podman with the shipped hooks.d file (path and env filled in).
    pub fn podman(&self, args: &[&str]) -> Seen {
        let hooks = self.podman_hooks();
        let o = self
            .podman_cmd(&hooks, &self.rootfs(), args)
            .output()
            .unwrap();
        Seen::parse(o)
    }

    /// A hooks directory holding the shipped hooks.d file, its path and env
    /// filled in for this scene.
    pub fn podman_hooks(&self) -> PathBuf {
        let hooks = self.path().join("hooks.d");
        std::fs::create_dir_all(&hooks).unwrap();
        let shipped = workspace_root().join("packaging/oci-hooks.d/gpuarch-hook.json");
        let mut h: Value = serde_json::from_slice(&std::fs::read(shipped).unwrap()).unwrap();
        assert_eq!(h["stages"], json!(["precreate"]));
        h["hook"]["path"] = json!(artifacts().gpuarch_hook);
        let mut env = vec![format!(
            "GPUARCH_CONFIG={}",
            self.config_file(None).display()
        )];
        if let Some(inv) = &self.inventory {
            env.push(format!("GPUARCH_INVENTORY={}", inv.display()));
        }
        env.extend(self.extra_env.iter().map(|(k, v)| format!("{k}={v}")));
        h["hook"]["env"] = json!(env);
        std::fs::write(hooks.join("gpuarch-hook.json"), h.to_string()).unwrap();
        hooks
    }

    /// `podman run` of the probe on `rootfs` with the hooks in `hooks`
    /// (runc, vfs storage and cgroupfs, with this scene's store).
    pub fn podman_cmd(&self, hooks: &Path, rootfs: &Path, args: &[&str]) -> Command {
        let mut c = self.podman_global();
        c.arg("--hooks-dir")
            .arg(hooks)
            .args([
                "run",
                "--rm",
                "--network",
                "none",
                // A fresh /run per container, as runc's bundles get: the
                // rootfs directory is shared by a test's containers.
                "--tmpfs",
                "/run",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
            ])
            .args(args)
            .arg("--rootfs")
            .arg(rootfs)
            .args(["/bin/sh", "-c", self.probe]);
        c
    }

    /// `podman` with this scene's store and engine flags, before the
    /// subcommand.
    pub fn podman_global(&self) -> Command {
        let store = self.path().join("podman");
        let mut c = engine_command(Path::new("podman"), self.path(), self.path());
        if let Some(dir) = &self.cdi_dir {
            c.arg("--cdi-spec-dir").arg(dir);
        }
        c.arg("--root")
            .arg(store.join("root"))
            .arg("--runroot")
            .arg(store.join("runroot"))
            .args([
                "--runtime",
                "runc",
                "--storage-driver",
                "vfs",
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
            ]);
        c
    }
}
