//! The engines of today's nodes, from the Debian roots that
//! `scripts/lib/setup.sh` (`ensure_engine_roots`) builds under
//! `.local/engines`: sid's containerd 2.1 and runc 1.3, trixie's containerd
//! 1.7, each run inside its root ([`crate::roots`]), with the test's
//! directory and gpuarch's binaries at the paths they have outside, so the
//! test, gpuarchd and the engine name every file alike. Nothing of the
//! host's engines is used.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::Digest;

use crate::artifacts;

pub use crate::roots::{command_in, root, version};

/// The snapshotters a containerd in an engine root must leave off: they
/// look for mounts of their own, which a chroot lacks.
pub const DISABLED: [&str; 5] = [
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.blockfile",
    "io.containerd.snapshotter.v1.erofs",
];

/// containerd from an engine root, on private sockets and its own state.
#[derive(Debug)]
pub struct Containerd {
    pub root: PathBuf,
    pub dir: PathBuf,
    pub sock: PathBuf,
    /// Its NRI socket (`socket_path`).
    pub nri_sock: PathBuf,
    pub config: PathBuf,
    /// CRI's snapshotter: `native` or `overlayfs`.
    pub snapshotter: &'static str,
    shared: Vec<PathBuf>,
    child: Option<Child>,
}

/// The image every pod's container runs, and the CRI sandbox image.
pub const IMAGE: &str = "gpuarch.test/busybox:1";
pub const PAUSE: &str = "gpuarch.test/pause:1";

impl Containerd {
    /// containerd of `root` with its files in `dir`: version 3 config for
    /// 2.x, 2 for 1.x; CRI with the native snapshotter and host-network
    /// pods; NRI on, at `dir/nri.sock`; gpuarch's handler added by
    /// `gpuarchctl engine containerd --write`, as an admin would; CDI on,
    /// its specs in `dir/cdi-specs`. `shared`:
    /// more directories it must see (gpuarchd's, for the snapshot).
    pub fn start(root: &Path, dir: &Path, shared: &[&Path]) -> Self {
        Self::start_with(root, dir, shared, "native")
    }

    /// [`Containerd::start`], CRI's snapshotter `snapshotter`.
    pub fn start_with(
        root: &Path,
        dir: &Path,
        shared: &[&Path],
        snapshotter: &'static str,
    ) -> Self {
        std::fs::create_dir_all(dir.join("conf.d")).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let major = version(root, "containerd");
        let v3 = !major.starts_with('1');
        let d = dir.display();
        let disabled = format!("disabled_plugins = {DISABLED:?}");
        let cri = if v3 {
            format!(
                r#"[plugins."io.containerd.cri.v1.images"]
  snapshotter = "{snapshotter}"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE}"
[plugins."io.containerd.cri.v1.runtime"]
  # This machine refuses a negative oom_score_adj even to root.
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["{d}/cdi-specs"]
  [plugins."io.containerd.cri.v1.runtime".cni]
    conf_dir = "{d}/cni"
"#
            )
        } else {
            format!(
                r#"[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["{d}/cdi-specs"]
  [plugins."io.containerd.grpc.v1.cri".cni]
    conf_dir = "{d}/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{snapshotter}"
"#
            )
        };
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                r#"version = {version}
imports = ["{d}/conf.d/gpuarch*.toml"]
root = "{d}/root"
state = "{d}/state"
{disabled}
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "{d}/nri.sock"
{cri}"#,
                version = if v3 { 3 } else { 2 },
            ),
        )
        .unwrap();
        let o = Command::new(&artifacts().gpuarchctl)
            .args(["engine", "containerd", "--config"])
            .arg(&config)
            .arg("--runtime")
            .arg(&artifacts().gpuarch_runtime)
            .arg("--write")
            .arg(dir.join("conf.d/gpuarch.toml"))
            .output()
            .unwrap();
        assert!(o.status.success(), "gpuarchctl engine containerd: {o:?}");
        let mut c = Self {
            root: root.to_owned(),
            dir: dir.to_owned(),
            sock: dir.join("containerd.sock"),
            nri_sock: dir.join("nri.sock"),
            config,
            snapshotter,
            shared: shared.iter().map(|p| p.to_path_buf()).collect(),
            child: None,
        };
        c.spawn();
        c.import_images();
        c
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("containerd.log"))
            .unwrap();
        let mut shared: Vec<&Path> = vec![&self.dir];
        shared.extend(self.shared.iter().map(PathBuf::as_path));
        let child = command_in(
            &self.root,
            &shared,
            &["containerd", "--config", self.config.to_str().unwrap()],
        )
        .env("GPUARCH_CONFIG", self.dir.join("gpuarch.yaml"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
        self.child = Some(child);
        let t = Instant::now();
        while !self.ctr(&["version"]).status.success() {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "containerd did not come up in 60 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stop containerd (SIGTERM, as systemd would) and wait for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
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
    }

    /// Stop and start again on the same state.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// The root's `ctr` against this containerd (it needs only libc, so it
    /// runs outside the root).
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new(self.root.join("usr/bin/ctr"))
            .arg("--address")
            .arg(&self.sock)
            .args(args)
            .output()
            .unwrap()
    }

    fn import_images(&self) {
        let rootfs = self.dir.join("rootfs");
        crate::containers::make_rootfs(&rootfs);
        std::os::unix::fs::symlink("busybox", rootfs.join("bin/sleep")).unwrap();
        for (name, cmd) in [(IMAGE, "/bin/sh"), (PAUSE, "/bin/sleep 2147483647")] {
            let tar = oci_archive(&rootfs, name, cmd, &self.dir.join("image"));
            self.import(&tar);
        }
    }

    /// Import the image archive `tar` for CRI's pods.
    pub fn import(&self, tar: &Path) {
        let o = self.ctr(&[
            "-n",
            "k8s.io",
            "images",
            "import",
            "--local",
            "--snapshotter",
            self.snapshotter,
            "--platform",
            "linux/amd64",
            tar.to_str().unwrap(),
        ]);
        assert!(
            o.status.success(),
            "ctr images import {}: {o:?}",
            tar.display()
        );
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An OCI image archive (the image layout, tarred) of `rootfs` as one
/// layer, named `name`, running `cmd`; built in `work`.
pub fn oci_archive(rootfs: &Path, name: &str, cmd: &str, work: &Path) -> PathBuf {
    oci_archive_layers(&[rootfs], &["PATH=/bin"], name, cmd, work)
}

/// An OCI image archive of `layers` (the bottom one first; each tarred as
/// it is, so `.wh.NAME` files are whiteouts and `.wh..wh..opq` makes its
/// directory opaque), its process's env `env`.
pub fn oci_archive_layers(
    layers: &[&Path],
    env: &[&str],
    name: &str,
    cmd: &str,
    work: &Path,
) -> PathBuf {
    let _ = std::fs::remove_dir_all(work);
    let blobs = work.join("layout/blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| -> (String, usize) {
        let digest = format!("{:x}", sha2::Sha256::digest(bytes));
        std::fs::write(blobs.join(&digest), bytes).unwrap();
        (format!("sha256:{digest}"), bytes.len())
    };
    let mut diff_ids = Vec::new();
    let mut descriptors = Vec::new();
    for rootfs in layers {
        let o = Command::new("tar")
            .arg("-C")
            .arg(rootfs)
            .args(["--owner=0", "--group=0", "-cf", "-", "."])
            .output()
            .unwrap();
        assert!(o.status.success(), "tar: {o:?}");
        let (layer, layer_size) = put(&o.stdout);
        descriptors.push(serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": layer_size}));
        diff_ids.push(layer);
    }
    let cmd: Vec<&str> = cmd.split(' ').collect();
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": cmd, "Env": env},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let (config, config_size) = put(config.to_string().as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": config_size},
        "layers": descriptors,
    });
    let (manifest, manifest_size) = put(manifest.to_string().as_bytes());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest,
            "size": manifest_size,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap()},
        }],
    });
    let layout = work.join("layout");
    std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
    std::fs::File::create(layout.join("oci-layout"))
        .unwrap()
        .write_all(br#"{"imageLayoutVersion":"1.0.0"}"#)
        .unwrap();
    let tar = work.join("image.tar");
    let o = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .output()
        .unwrap();
    assert!(o.status.success(), "tar: {o:?}");
    tar
}

/// tests/fixtures/images/layouts (every place real images keep Python, real
/// METADATA) over the busybox rootfs, as one layer, uv's venv on its PATH.
pub const LAYOUTS_IMAGE: &str = "gpuarch.test/layouts:1";

pub fn layouts_image(c: &Containerd) {
    let work = c.dir.join("layouts-image");
    let layer = work.join("layer");
    crate::containers::make_rootfs(&layer);
    let o = Command::new("cp")
        .arg("-a")
        .arg(crate::image_fixture("layouts").join("."))
        .arg(&layer)
        .output()
        .unwrap();
    assert!(o.status.success(), "cp: {o:?}");
    let tar = oci_archive_layers(
        &[&layer],
        &crate::layouts::ENV,
        LAYOUTS_IMAGE,
        "/bin/sh",
        &work.join("oci"),
    );
    c.import(&tar);
}

/// An image of three layers whose Python lives where real images keep it:
/// a base Python in `/usr` (torch, xformers, flash-attn), then uv's
/// `/app/.venv` on `PATH` (DeepSpeed) with flash-attn removed by a
/// whiteout and a conda env, then conda's directory replaced (opaque) by
/// one holding another env (accelerate); a user's `~/.local`
/// (bitsandbytes).
pub const PY_IMAGE: &str = "gpuarch.test/python-layers:1";

pub fn python_image(c: &Containerd) {
    c.import(&python_image_archive(&c.dir.join("python-image")));
}

/// Distribution `name` at release `v` installed in site directory `site`,
/// as pip leaves it: `<name>-<v>.dist-info/METADATA` (the name's `-` as
/// `_`).
pub fn dist_info(site: &Path, name: &str, v: &str) {
    let d = site.join(format!("{}-{v}.dist-info", name.replace('-', "_")));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("METADATA"),
        format!("Metadata-Version: 2.4\nName: {name}\nVersion: {v}\n\n"),
    )
    .unwrap();
}

/// [`PY_IMAGE`] as an OCI image archive, built in `work`.
pub fn python_image_archive(work: &Path) -> PathBuf {
    let l: Vec<PathBuf> = (0..3).map(|i| work.join(format!("layer{i}"))).collect();
    let write = |l: &Path, rel: &str, text: &str| {
        let p = l.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    let dist = |l: &Path, site: &str, name: &str, v: &str| dist_info(&l.join(site), name, v);
    crate::containers::make_rootfs(&l[0]);
    let site = "usr/lib/python3.12/site-packages";
    write(&l[0], "usr/bin/python3.12", "ELF");
    std::os::unix::fs::symlink("python3.12", l[0].join("usr/bin/python3")).unwrap();
    write(&l[0], "usr/lib/python3.12/os.py", "");
    dist(&l[0], site, "torch", "2.7.1");
    dist(&l[0], site, "xformers", "0.0.30");
    dist(&l[0], site, "flash-attn", "2.7.4.post1");
    write(
        &l[1],
        &format!("{site}/.wh.flash_attn-2.7.4.post1.dist-info"),
        "",
    );
    write(
        &l[1],
        "app/.venv/pyvenv.cfg",
        "home = /usr/bin\ninclude-system-site-packages = true\n",
    );
    std::fs::create_dir_all(l[1].join("app/.venv/bin")).unwrap();
    std::os::unix::fs::symlink("/usr/bin/python3", l[1].join("app/.venv/bin/python3")).unwrap();
    dist(
        &l[1],
        "app/.venv/lib/python3.12/site-packages",
        "deepspeed",
        "0.18.2",
    );
    dist(
        &l[1],
        "opt/conda/envs/old/lib/python3.11/site-packages",
        "vllm",
        "0.9.0",
    );
    // A user whose ~/.local holds bitsandbytes: NRI does not say which
    // user a pod runs as, so every user's site is read.
    write(
        &l[1],
        "etc/passwd",
        "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
    );
    dist(
        &l[1],
        "home/app/.local/lib/python3.12/site-packages",
        "bitsandbytes",
        "0.45.0",
    );
    write(&l[2], "opt/conda/.wh..wh..opq", "");
    dist(
        &l[2],
        "opt/conda/envs/serve/lib/python3.11/site-packages",
        "accelerate",
        "1.2.0",
    );
    let layers: Vec<&Path> = l.iter().map(PathBuf::as_path).collect();
    oci_archive_layers(
        &layers,
        &["PATH=/app/.venv/bin:/bin", "VIRTUAL_ENV=/app/.venv"],
        PY_IMAGE,
        "/bin/sh",
        &work.join("oci"),
    )
}
