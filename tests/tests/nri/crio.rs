//! gpuarchd as CRI-O's NRI plugin: each container's image read from
//! containers/storage, where CRI-O keeps it. Debian does not package
//! CRI-O; podman keeps its containers with the same library
//! (containers/storage), in the same layout, so real podman makes each
//! container in a store of the test's own, under its own id, as CRI-O's
//! CreateContainer does before it calls NRI: podman 4.3 from the host and
//! podman 5 from Debian sid's engine root. The runtime's side of NRI is
//! `fake_runtime`, naming itself `cri-o` as CRI-O does; gpuarchd is the
//! real plugin, in this process.

use std::path::{Path, PathBuf};
use std::process::Command;

use gpuarch_daemon::nri::{fake_runtime, proto::nri::CreateContainerResponse};
use gpuarch_tests::daemon::{Node, Policy};
use gpuarch_tests::nri::{self, var};
use gpuarch_tests::stack::python_image_archive;

use crate::audit::{KEPT, NOTE, xformers_sm75_archive};

/// podman: the host's, or the one of engine root `root` (`share` seen
/// inside it), on the store in `dir` with `driver`.
struct Podman {
    root: Option<PathBuf>,
    share: PathBuf,
    dir: PathBuf,
    driver: &'static str,
    /// containers/storage's `imagestore`: images kept apart from the root.
    imagestore: Option<PathBuf>,
}

impl Podman {
    /// podman of `root` (or the host's) on a new store `share/name`.
    fn new(root: Option<&Path>, share: &Path, name: &str, driver: &'static str) -> Self {
        let dir = share.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            root: root.map(Path::to_owned),
            share: share.to_owned(),
            dir,
            driver,
            imagestore: None,
        }
    }

    /// The image of OCI archive `archive`, pulled: its id.
    fn pull(&self, archive: &Path) -> String {
        let out = self.run(&["pull", "-q", &format!("oci-archive:{}", archive.display())]);
        out.lines().last().unwrap().to_owned()
    }

    fn run(&self, args: &[&str]) -> String {
        let mut c = match &self.root {
            Some(root) => gpuarch_tests::roots::command_in_dir(
                root,
                &[&self.share],
                &self.dir,
                "podman".as_ref(),
            ),
            None => Command::new("podman"),
        };
        c.arg("--root")
            .arg(self.dir.join("storage"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .args(
                self.imagestore
                    .iter()
                    .flat_map(|p| [PathBuf::from("--imagestore"), p.clone()]),
            )
            .args([
                "--storage-driver",
                self.driver,
                "--runtime",
                "runc",
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
            ])
            .args(args);
        let o = c.output().unwrap();
        assert!(o.status.success(), "podman {args:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    }

    /// The layer containers/storage made for container `id`: in the
    /// store's list, or a transient store's in the runroot.
    fn layer_of(&self, id: &str) -> String {
        let d = self.driver;
        let lists = [
            format!("storage/{d}-containers/containers.json"),
            format!("run/{d}-containers/volatile-containers.json"),
        ];
        let entry = lists
            .iter()
            .filter_map(|l| std::fs::read(self.dir.join(l)).ok())
            .flat_map(|b| serde_json::from_slice::<Vec<serde_json::Value>>(&b).unwrap())
            .find(|e| e["id"] == id);
        entry.unwrap()["layer"].as_str().unwrap().to_owned()
    }

    /// A container of `image` made as CRI-O makes one: its id.
    fn create(&self, extra: &[&str], image: &str) -> String {
        let mut args = extra.to_vec();
        args.extend(["create", "--network", "none", image, "/bin/sh"]);
        self.run(&args)
    }
}

/// What gpuarchd answers for the containers of podman's store, which it
/// finds as CRI-O would: the root and runroot from a drop-in of
/// crio.conf, the additional image stores from storage.conf, gpuarch's
/// own config naming none of them.
fn answers(
    podman: &Podman,
    image_stores: &[PathBuf],
    ids: &[(&str, &str)],
) -> Vec<(CreateContainerResponse, String)> {
    let dir = &podman.dir;
    std::fs::create_dir_all(dir.join("records")).unwrap();
    let toml = |p: &Path| format!("{:?}", p.to_str().unwrap());
    std::fs::create_dir_all(dir.join("crio.conf.d")).unwrap();
    std::fs::write(
        dir.join("crio.conf"),
        "[crio]\nroot = \"/var/lib/not-here\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("crio.conf.d/10-storage.conf"),
        format!(
            "[crio]\nroot = {}\nrunroot = {}\n",
            toml(&dir.join("storage")),
            toml(&dir.join("run"))
        ),
    )
    .unwrap();
    let stores: Vec<String> = image_stores.iter().map(|p| toml(p)).collect();
    let imagestore = podman
        .imagestore
        .as_deref()
        .map_or(String::new(), |p| format!("imagestore = {}\n", toml(p)));
    std::fs::write(
        dir.join("storage.conf"),
        format!(
            "[storage]\ndriver = \"overlay\"\n{imagestore}[storage.options]\nadditionalimagestores = [{}]\n",
            stores.join(", ")
        ),
    )
    .unwrap();
    let shared = nri::shared(dir, |_| {});
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (p, _stop) = nri::start(&shared, "cri-o").await;
        let mut out = Vec::new();
        for (name, id) in ids {
            let (mut pod, mut ctr) = fake_runtime::container(&nri::PY_ENV, &[]);
            ctr.id = (*id).to_owned();
            (*name).clone_into(&mut pod.name);
            let r = p.create(&pod, &ctr).await.unwrap();
            out.push((r, record(&dir.join("records"), name)));
        }
        out
    })
}

/// The record gpuarchd kept of pod `name`'s container.
fn record(dir: &Path, name: &str) -> String {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .find(|r| r.contains(&format!("\"{name}\"")))
        .unwrap_or_else(|| panic!("no record of {name} in {}", dir.display()))
}

/// The cases on podman's store (that of engine root `root`, else the
/// host's); the directory that holds the stores.
fn cases(root: Option<PathBuf>, label: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let archive = python_image_archive(&dir.path().join("python-image"));
    let overlay = Podman::new(root.as_deref(), dir.path(), "overlay", "overlay");
    let image = overlay.pull(&archive);
    let first = overlay.create(&[], &image);
    // A transient store (CRI-O's `transient_store`, podman 5's flag)
    // lists its containers in the runroot.
    let second = if root.is_some() {
        overlay.create(&["--transient-store"], &image)
    } else {
        overlay.create(&[], &image)
    };
    let got = answers(
        &overlay,
        &[],
        &[
            ("first", &first),
            ("second", &second),
            ("gone", &"f".repeat(64)),
        ],
    );
    if root.is_some() {
        let volatile = overlay
            .dir
            .join("run/overlay-containers/volatile-containers.json");
        assert!(
            std::fs::read_to_string(&volatile)
                .unwrap()
                .contains(&second),
            "podman 5 --transient-store keeps its container in {}",
            volatile.display()
        );
    }
    for (round, (r, record)) in ["first", "second"].iter().zip(&got) {
        // The image was read, through podman's whiteout (flash-attn) and
        // its opaque directory (conda's old env), from the venv on PATH.
        assert_eq!(
            var(r, "GPUARCH_ATTN_IMPLEMENTATION").as_deref(),
            Some("sdpa"),
            "{label} {round}: {record}"
        );
        assert_eq!(var(r, "TORCH_CUDA_ARCH_LIST").as_deref(), Some("8.6"));
        for want in ["deepspeed", "0.18.2", "accelerate", "bitsandbytes", "2.7.1"] {
            assert!(record.contains(want), "{label} {round}: {want}: {record}");
        }
        assert!(
            !record.contains("vllm") && !record.contains("not read"),
            "{label} {round}: {record}"
        );
    }
    // A container the store does not hold: the Plan for an image not
    // known, and why, naming the store.
    let (r, record) = &got[2];
    assert_eq!(
        var(r, "GPUARCH_ATTN_IMPLEMENTATION").as_deref(),
        Some("flash_attention_2")
    );
    assert!(
        record.contains("not read: CRI-O's no container")
            && record.contains(&overlay.dir.join("storage").display().to_string()),
        "{label}: {record}"
    );

    // A container of another store on the first as its additional image
    // store (`overlay.imagestore`): the image's layers are that store's.
    let on_store = Podman::new(root.as_deref(), dir.path(), "on-store", "overlay");
    let store = overlay.dir.join("storage");
    let id = on_store.create(
        &[
            "--storage-opt",
            &format!("overlay.imagestore={}", store.display()),
        ],
        &image,
    );
    let got = answers(&on_store, &[store], &[("on-store", &id)]);
    assert_eq!(
        var(&got[0].0, "GPUARCH_ATTN_IMPLEMENTATION").as_deref(),
        Some("sdpa"),
        "{label} on an image store: {}",
        got[0].1
    );
    let got = answers(&on_store, &[], &[("unnamed-store", &id)]);
    assert!(
        got[0]
            .1
            .contains("in no additional image store (nri.storage_image_stores"),
        "{label}: {}",
        got[0].1
    );

    // Images kept apart from the root (storage.conf's `imagestore`,
    // podman 5's flag): the image's layers and their `l/` links are that
    // store's, the container's layer the root's.
    if root.is_some() {
        let mut apart = Podman::new(root.as_deref(), dir.path(), "imagestore", "overlay");
        apart.imagestore = Some(apart.dir.join("images"));
        let id = apart.create(&[], &apart.pull(&archive));
        let got = answers(&apart, &[], &[("imagestore", &id)]);
        assert_eq!(
            var(&got[0].0, "GPUARCH_ATTN_IMPLEMENTATION").as_deref(),
            Some("sdpa"),
            "{label} with an imagestore: {}",
            got[0].1
        );
    }

    // The vfs driver: the image is its top layer's copy, not the
    // container's own (a new directory per container): flash-attn put back
    // into the container's copy is not read. Under podman 5 in a transient
    // store, whose layer list is in the runroot.
    let vfs = Podman::new(root.as_deref(), dir.path(), "vfs", "vfs");
    let transient: &[&str] = if root.is_some() {
        &["--transient-store"]
    } else {
        &[]
    };
    let id = vfs.create(transient, &vfs.pull(&archive));
    let own = vfs.dir.join("storage/vfs/dir").join(vfs.layer_of(&id));
    let site = own.join("usr/lib/python3.12/site-packages");
    gpuarch_tests::stack::dist_info(&site, "flash-attn", "2.7.4.post1");
    let got = answers(&vfs, &[], &[("vfs", &id)]);
    assert_eq!(
        var(&got[0].0, "GPUARCH_ATTN_IMPLEMENTATION").as_deref(),
        Some("sdpa"),
        "{label} vfs: {}",
        got[0].1
    );
    dir
}

/// The real gpuarchd, on the system bus of a node of its own, registered
/// with a runtime on `sock` that names itself `cri-o`, as CRI-O does: its
/// config's `nri:` section ends with `nri`, and `extra` (given the node)
/// follows it.
async fn under_crio(
    sock: &Path,
    nri: &str,
    extra: impl FnOnce(&Node) -> String,
) -> (Node, fake_runtime::FakeRuntime, fake_runtime::Plugin) {
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let _ = std::fs::remove_file(sock);
    let yaml = format!(
        "nri:\n  enable: true\n  socket: {}\n{nri}{}",
        sock.display(),
        extra(&node)
    );
    let yaml = gpuarch_tests::private_hook_paths(&node.private_config(&yaml), &node.path(""));
    std::fs::write(node.path("config.yaml"), yaml).unwrap();
    let runtime = fake_runtime::FakeRuntime::bind_as(sock, "cri-o").unwrap();
    node.start(&[]);
    let plugin = runtime.accept().await.unwrap();
    (node, runtime, plugin)
}

/// What `gpuarchctl doctor` says of NRI when gpuarchd is registered with
/// CRI-O, its store `store`: named by `nri.storage_root`, or by CRI-O's
/// crio.conf (`from_crio`).
fn doctor_under_crio(dir: &Path, store: &Path, from_crio: bool) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let crio = dir.join("doctor-crio.conf");
        std::fs::write(
            &crio,
            format!("[crio]\nroot = {:?}\n", store.to_str().unwrap()),
        )
        .unwrap();
        let mut nri = format!(
            "  crio_config: {}\n  storage_conf: {}\n",
            crio.display(),
            dir.join("doctor-storage.conf").display()
        );
        if !from_crio {
            nri += &format!("  storage_root: {}\n", store.display());
        }
        let (node, _runtime, _plugin) =
            under_crio(&dir.join("doctor-nri.sock"), &nri, |_| String::new()).await;
        let o = tokio::task::block_in_place(|| node.ctl(None, &["doctor"]));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        // The check's line, and the fix on the next.
        let lines: Vec<&str> = out.lines().collect();
        let at = lines.iter().position(|l| l.contains(" NRI ")).unwrap();
        lines[at..lines.len().min(at + 2)].join("\n")
    })
}

/// The image audit under CRI-O: gpuarchd (the real one, its worker)
/// audits the image from its layers in containers/storage. The first GPU
/// container asks; later ones on the 3090 get the note, on the 2080 Ti
/// none. Host podman's store of `driver`, in `dir`: under vfs too, where
/// the image is its top layer's copy, one for all its containers.
fn audit_under_crio(dir: &Path, driver: &'static str) {
    let cuda_home = match gpuarch_tests::torch_image() {
        Ok((_, cuda_home)) => cuda_home,
        Err(why) => {
            gpuarch_tests::skip(&format!("the audit under CRI-O needs nvcc: {why}"));
            return;
        }
    };
    let podman = Podman::new(None, dir, &format!("audit-{driver}"), driver);
    let image = podman.pull(&xformers_sm75_archive(
        &cuda_home,
        &dir.join(format!("audit-image-{driver}")),
    ));
    let ids: Vec<String> = (0..3).map(|_| podman.create(&[], &image)).collect();
    let nri = format!(
        "  storage_root: {}\n  storage_runroot: {}\n",
        podman.dir.join("storage").display(),
        podman.dir.join("run").display(),
    );
    let audits = |node: &Node| format!("audit:\n  dir: {}\n", node.path("audits").display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let sock = dir.join(format!("audit-{driver}.sock"));
        let (node, _runtime, plugin) = under_crio(&sock, &nri, audits).await;
        // Container `i` of the image, on GPU `gpu`: the notes of its Plan.
        let notes = |i: usize, gpu: &'static str| {
            let env = ["PATH=/usr/local/bin:/usr/bin:/bin", gpu];
            let (mut pod, mut ctr) = fake_runtime::container(&env, &[]);
            ctr.id.clone_from(&ids[i]);
            pod.name = format!("audit-{i}");
            let plugin = &plugin;
            let node = &node;
            async move {
                plugin.create(&pod, &ctr).await.unwrap();
                tokio::task::block_in_place(|| why_notes(node, &pod.name))
            }
        };
        let got = notes(0, "NVIDIA_VISIBLE_DEVICES=1").await;
        assert!(
            got.iter()
                .any(|n| n
                    .starts_with("the image's CUDA binaries are not audited yet: asked gpuarchd")),
            "{got:#?}"
        );
        let t = std::time::Instant::now();
        while !node.log().contains(KEPT) {
            assert!(
                t.elapsed().as_secs() < 60,
                "no audit kept in 60 s:\n{}",
                node.log()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let log = node.log();
        let line = log.lines().find(|l| l.contains(KEPT)).unwrap();
        eprintln!("audit under CRI-O, {driver}: {line}");
        assert!(
            line.contains(": 1 binaries with GPU code in 1 files"),
            "{line}"
        );
        let got = notes(1, "NVIDIA_VISIBLE_DEVICES=1").await;
        assert!(got.iter().any(|n| n.starts_with(NOTE)), "{got:#?}");
        let got = notes(2, "NVIDIA_VISIBLE_DEVICES=0").await;
        assert!(!got.iter().any(|n| n.contains("cannot run it")), "{got:#?}");
    });
}

/// The notes of the Plan gpuarchd recorded for pod `name`.
fn why_notes(node: &Node, name: &str) -> Vec<String> {
    let dir = node.path("containers");
    let o = node.ctl(
        None,
        &["why", "--json", "--dir", dir.to_str().unwrap(), name],
    );
    assert!(o.status.success(), "gpuarchctl why {name}: {o:?}");
    let why: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    serde_json::from_value(why["plan"]["notes"].clone()).unwrap()
}

#[test]
fn nri_under_crio_reads_containers_storage_podman_4_3() {
    if let Some(why) = gpuarch_tests::cannot_run("to make containers/storage", &["podman"]) {
        gpuarch_tests::skip(&why);
        return;
    }
    let store = cases(None, "podman 4.3");
    // An operator is told when gpuarchd looks for CRI-O's images where
    // there is no store.
    for from_crio in [true, false] {
        let line = doctor_under_crio(
            store.path(),
            &store.path().join("overlay/storage"),
            from_crio,
        );
        assert!(
            line.starts_with("ok") && line.contains("registered with cri-o"),
            "{line}"
        );
    }
    let line = doctor_under_crio(store.path(), &store.path().join("elsewhere"), false);
    assert!(
        line.starts_with("WARN")
            && line.contains("elsewhere (from nri.storage_root) holds no containers/storage")
            && line.contains(
                "fix: set nri.crio_config and nri.storage_conf to the files CRI-O runs with"
            ),
        "{line}"
    );
    let line = doctor_under_crio(store.path(), &store.path().join("elsewhere"), true);
    assert!(
        line.contains("elsewhere (from ")
            && line.contains("doctor-crio.conf) holds no containers/storage"),
        "{line}"
    );
    for driver in ["overlay", "vfs"] {
        audit_under_crio(store.path(), driver);
    }
}

#[test]
fn nri_under_crio_reads_containers_storage_podman_5() {
    let root = match gpuarch_tests::roots::root("sid") {
        Ok(r) if r.join("usr/bin/podman").is_file() => r,
        Ok(r) => {
            gpuarch_tests::skip(&format!(
                "the sid engine root {} has no podman",
                r.display()
            ));
            return;
        }
        Err(why) => {
            gpuarch_tests::skip(&why);
            return;
        }
    };
    if let Some(why) = gpuarch_tests::cannot_run("to make containers/storage", &[]) {
        gpuarch_tests::skip(&why);
        return;
    }
    cases(Some(root), "podman 5");
}
