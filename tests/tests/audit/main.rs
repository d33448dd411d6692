#![allow(clippy::unwrap_used)]
//! `gpuarchctl audit` on real binaries: a library nvcc (from NVIDIA's
//! wheels) builds for sm_75 alone inside an xformers-shaped package, judged
//! on the RTX 2080 Ti + RTX 3090 fixture (issue "image audit", seed 000);
//! and the real torch, cuBLAS, cuFFT and NCCL wheels of the torch image
//! and bitsandbytes' wheel, every verdict's targets held to NVIDIA's
//! cuobjdump.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use gpuarch_tests::daemon::{Node, Policy};
use gpuarch_tests::{artifacts, fixture};
use serde_json::Value;

use gpuarch_tests::audit::{SITE, nvcc_library, xformers_in};

mod truncated;
mod wheels;

/// The SASS and PTX targets cuobjdump lists in `file` (`sm_75`,
/// `compute_80`).
pub(crate) fn cuobjdump_targets(file: &Path) -> BTreeSet<String> {
    cuobjdump_listed(file, &[]).0
}

/// [`cuobjdump_targets`] with more of cuobjdump's options (`-all`: every
/// section of an ELF host binary, where some keep their PTX), and the
/// fatal error cuobjdump stopped at, if it did.
pub(crate) fn cuobjdump_listed(
    file: &Path,
    options: &[&str],
) -> (BTreeSet<String>, Option<String>) {
    let cuda = gpuarch_tests::cuda_dir().expect("the NVIDIA wheels");
    let o = Command::new(cuda.join("cu13/bin/cuobjdump"))
        .args(options)
        .args(["--list-elf", "--list-ptx"])
        .arg(file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let fatal = String::from_utf8_lossy(&o.stderr)
        .lines()
        .find(|l| l.contains("fatal"))
        .map(str::to_owned);
    let mut out = BTreeSet::new();
    for line in text.lines() {
        // "ELF file    1: _C.1.sm_75.cubin", "PTX file    2: _C.2.sm_80.ptx"
        let Some(name) = line.split(": ").nth(1) else {
            continue;
        };
        let Some(arch) = name.split('.').find(|p| p.starts_with("sm_")) else {
            continue;
        };
        if line.starts_with("ELF file") {
            out.insert(arch.to_owned());
        } else if line.starts_with("PTX file") {
            out.insert(arch.replace("sm_", "compute_"));
        }
    }
    (out, fatal)
}

/// gpuarchctl with no config and the 2080 Ti + 3090 fixture's snapshot.
pub(crate) fn ctl_on_the_fixture() -> Command {
    let mut c = Command::new(&artifacts().gpuarchctl);
    c.env_clear()
        .env("GPUARCH_CONFIG", "/dev/null")
        .env("GPUARCH_INVENTORY", fixture("2080ti-3090"));
    c
}

pub(crate) fn audit(args: &[&str]) -> (Output, Value) {
    let text = ctl_on_the_fixture().args(args).output().unwrap();
    let o = ctl_on_the_fixture()
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    let doc = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert_eq!(o.status.code(), text.status.code());
    (text, doc)
}

/// The SASS and PTX targets the audit lists for binary `b`.
pub(crate) fn code_of(b: &Value) -> BTreeSet<String> {
    b["code"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect()
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Seed 000: xformers built for sm_75 only. The 2080 Ti (GPU 0) runs it;
/// the 3090 (GPU 1) cannot, and the audit says so, naming the file, the
/// distribution and the list to rebuild with, with exit status 1.
#[test]
fn an_sm75_only_xformers_runs_on_the_2080ti_and_the_audit_says_the_3090_cannot() {
    let (_python, cuda_home) = match gpuarch_tests::torch_image() {
        Ok(t) => t,
        Err(why) => {
            gpuarch_tests::skip(&why);
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let lib = nvcc_library(&cuda_home, tmp.path(), &["arch=compute_75,code=sm_75"]);
    assert_eq!(
        cuobjdump_targets(&lib),
        BTreeSet::from(["sm_75".to_owned()])
    );
    let root = tmp.path().join("rootfs");
    xformers_in(&root, &lib);
    let site = root.join(SITE);
    let root_s = root.to_str().unwrap();
    let path = "/usr/local/lib/python3.12/dist-packages/xformers/_C.so";

    let (o, doc) = audit(&["audit", root_s, "--devices", "0"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(
        stdout(&o).contains(&format!("xformers 0.0.29 {path}")),
        "{}",
        stdout(&o)
    );
    assert_eq!(doc["binaries"][0]["gpus"][0]["runs"], "sass");

    let (o, doc) = audit(&["audit", root_s]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains("GPU 1 NVIDIA GeForce RTX 3090 (8.6): will not run: it carries only sm_75")
            && text.contains("rebuild with TORCH_CUDA_ARCH_LIST=\"7.5;8.6\""),
        "{text}"
    );
    assert!(
        text.contains("GPU 0 NVIDIA GeForce RTX 2080 Ti (7.5): runs from SASS sm_75"),
        "{text}"
    );
    let b = &doc["binaries"][0];
    assert_eq!(b["path"], path);
    assert_eq!(b["owner"], "xformers 0.0.29");
    assert_eq!(b["code"], serde_json::json!(["sm_75"]));
    assert_eq!(b["gpus"][1]["runs"], "no");
    assert_eq!(doc["rebuild_arch_list"], "7.5;8.6");

    // Rebuilt for both, as the audit said: both GPUs run it from SASS.
    let both = tempfile::tempdir().unwrap();
    let lib = nvcc_library(
        &cuda_home,
        both.path(),
        &["arch=compute_75,code=sm_75", "arch=compute_86,code=sm_86"],
    );
    std::fs::copy(&lib, site.join("xformers/_C.so")).unwrap();
    let (o, doc) = audit(&["audit", root_s]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let code: BTreeSet<String> = doc["binaries"][0]["code"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(code, cuobjdump_targets(&lib));
}

/// The hook on `root` for GPU `gpu` of the node's 2080 Ti + 3090, with the
/// node's config: (exit ok, log, the Plan's env).
pub(crate) fn start(node: &Node, root: &Path, gpu: &str) -> (bool, String) {
    let cfg = serde_json::json!({
        "ociVersion": "1.2.0",
        "process": {"args": ["python3"], "user": {"uid": 0, "gid": 0},
                    "env": [format!("NVIDIA_VISIBLE_DEVICES={gpu}"), "PATH=/usr/local/bin:/usr/bin:/bin"]},
        "root": {"path": root},
        "annotations": {"io.kubernetes.cri.image-name": "registry.test/xformers:sm75"},
    });
    let o = gpuarch_tests::output_with_stdin(
        Command::new(&artifacts().gpuarch_hook)
            .arg("precreate")
            .env("GPUARCH_CONFIG", node.path("config.yaml"))
            .env("GPUARCH_INVENTORY", fixture("2080ti-3090"))
            .env("GPUARCH_LOG", "stderr"),
        cfg.to_string().as_bytes(),
    );
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// At container start (issue "image audit", part 2): the first start of
/// an image asks gpuarchd and goes on; gpuarchd audits it in its worker
/// and keeps the audit; later starts on the 3090 get the note naming the
/// file, its distribution, the GPU and the list to rebuild with, and the
/// 2080 Ti's none; with `audit.refuse` the 3090's start is refused with
/// that reason, and with `audit.wait_ms` a new image's first start waits
/// for its audit and is refused too.
#[test]
fn gpuarchd_audits_an_image_once_and_each_later_start_is_judged() {
    let (_python, cuda_home) = match gpuarch_tests::torch_image() {
        Ok(t) => t,
        Err(why) => {
            gpuarch_tests::skip(&why);
            return;
        }
    };
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let audits = node.path("audits");
    let base = node.private_config("");
    let hook_dir = node.path("hook");
    let yaml = |extra: &str| {
        gpuarch_tests::private_hook_paths(
            &format!("audit:\n  dir: {}\n{extra}{base}", audits.display()),
            &hook_dir,
        )
    };
    std::fs::write(node.path("config.yaml"), yaml("")).unwrap();
    node.start(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let lib = nvcc_library(&cuda_home, tmp.path(), &["arch=compute_75,code=sm_75"]);
    let root = tmp.path().join("rootfs");
    xformers_in(&root, &lib);

    let (ok, log) = start(&node, &root, "1");
    assert!(ok, "{log}");
    assert!(log.contains("not audited yet: asked gpuarchd"), "{log}");
    // gpuarchd takes the request and keeps the audit.
    let t0 = std::time::Instant::now();
    let kept = loop {
        let found: Vec<_> = std::fs::read_dir(&audits)
            .unwrap()
            .flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.ends_with(".json") && n != "index.json"
            })
            .collect();
        if let Some(e) = found.first() {
            break e.path();
        }
        assert!(
            t0.elapsed().as_secs() < 30,
            "no audit kept in 30 s:\n{}",
            node.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let a: Value = serde_json::from_slice(&std::fs::read(&kept).unwrap()).unwrap();
    assert_eq!(a["binaries"][0]["owner"], "xformers 0.0.29", "{a}");
    assert!(node.log().contains("image audit"), "{}", node.log());

    let note = "xformers 0.0.29 \"/usr/local/lib/python3.12/dist-packages/xformers/_C.so\" carries only sm_75: GPU 1 (NVIDIA GeForce RTX 3090, 8.6) cannot run it; rebuild with TORCH_CUDA_ARCH_LIST=\"8.6\"";
    let (ok, log) = start(&node, &root, "1");
    assert!(ok && log.contains(note), "{log}");
    let (ok, log) = start(&node, &root, "0");
    assert!(ok && !log.contains("cannot run it"), "{log}");
    let (ok, log) = start(&node, &root, "0,1");
    assert!(ok && log.contains("GPU 1 (NVIDIA GeForce RTX 3090, 8.6) cannot run it; rebuild with TORCH_CUDA_ARCH_LIST=\"7.5;8.6\""), "{log}");

    // A scheduler asks by the image's name, before placing a job: the
    // 3090 cannot run it, the 2080 Ti can (AuditImage, through gpuarchctl).
    let image = "registry.test/xformers:sm75";
    let o = node.ctl(None, &["audit", "--image", image, "--devices", "1"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.contains("GPU 1 (NVIDIA GeForce RTX 3090, 8.6): cannot run 1") && text.contains(note),
        "{text}"
    );
    let o = node.ctl(
        None,
        &["--json", "audit", "--image", image, "--devices", "0"],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["runs"], true);
    assert_eq!(doc["names"], serde_json::json!([image]));
    let o = node.ctl(None, &["audit", "--image", "registry.test/never-started:1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no audit of registry.test/never-started:1 on this node"),
        "{err}"
    );

    std::fs::write(node.path("config.yaml"), yaml("  refuse: true\n")).unwrap();
    let (ok, log) = start(&node, &root, "1");
    assert!(
        !ok && log.contains("audit.refuse: xformers 0.0.29"),
        "{log}"
    );
    let (ok, log) = start(&node, &root, "0");
    assert!(ok, "{log}");

    // Another image, first seen with a wait budget: its first start waits
    // for gpuarchd's audit, and is refused by it.
    let other = tmp.path().join("rootfs-2");
    xformers_in(&other, &lib);
    std::fs::write(
        node.path("config.yaml"),
        yaml("  refuse: true\n  wait_ms: 20000\n"),
    )
    .unwrap();
    let (ok, log) = start(&node, &other, "1");
    assert!(
        !ok && log.contains("audit.refuse: xformers 0.0.29"),
        "{log}"
    );
}

/// What lands in gpuarchd's request directory is not trusted: a name that
/// is not an image key, a link, a FIFO, a request naming the host's own
/// root or a directory that is not the image the start read. None of them
/// is audited or kept; gpuarchd says why and goes on.
#[test]
fn hostile_requests_are_dropped_and_nothing_is_kept() {
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let audits = node.path("audits");
    std::fs::write(
        node.path("config.yaml"),
        node.private_config(&format!("audit:\n  dir: {}\n", audits.display())),
    )
    .unwrap();
    node.start(&[]);
    let requests = audits.join("requests");
    let t0 = std::time::Instant::now();
    while !requests.is_dir() {
        assert!(t0.elapsed().as_secs() < 10, "no {}", requests.display());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let key = |c: char| std::iter::repeat_n(c, 64).collect::<String>();
    let body = |rootfs: &str| {
        serde_json::json!({"rootfs": rootfs, "env": [["PATH", "/usr/bin:/bin"]], "user": null})
            .to_string()
    };
    std::fs::write(requests.join("not-a-key"), body("/")).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", requests.join(key('a'))).unwrap();
    nix::unistd::mkfifo(
        &requests.join(key('b')),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    std::fs::write(requests.join(key('c')), body("/")).unwrap();
    let empty = tempfile::tempdir().unwrap();
    std::fs::write(
        requests.join(key('d')),
        body(empty.path().to_str().unwrap()),
    )
    .unwrap();
    std::fs::write(requests.join(key('e')), "{not json").unwrap();
    // As an NRI start asks: the host's `/` as the image's one layer, more
    // layers than an image has, a relative layer.
    let layers = |dirs: Vec<String>| {
        serde_json::json!({"layers": dirs, "env": [["PATH", "/usr/bin:/bin"]], "user": null})
            .to_string()
    };
    std::fs::write(requests.join(key('1')), layers(vec!["/".into()])).unwrap();
    std::fs::write(requests.join(key('2')), layers(vec!["/tmp".into(); 200])).unwrap();
    std::fs::write(requests.join(key('3')), layers(vec!["etc".into()])).unwrap();
    let t0 = std::time::Instant::now();
    while std::fs::read_dir(&requests).unwrap().count() > 0 {
        assert!(
            t0.elapsed().as_secs() < 60,
            "requests not taken:\n{}",
            node.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let kept: Vec<_> = std::fs::read_dir(&audits)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != "requests")
        .collect();
    assert!(kept.is_empty(), "{kept:?}\n{}", node.log());
    let log = node.log();
    assert!(
        log.contains("dropping request \"not-a-key\": not an image key"),
        "{log}"
    );
    assert!(
        log.contains(&format!("dropping request {}", key('a'))),
        "{log}"
    );
    assert!(
        log.contains(&format!("dropping request {}", key('b'))),
        "{log}"
    );
    assert!(
        log.contains(&format!("image audit {}", key('c')))
            && log.contains("is not the image the start read"),
        "{log}"
    );
    assert!(log.contains(&format!("image audit {}", key('d'))), "{log}");
    assert!(
        log.contains(&format!("dropping request {}", key('e'))),
        "{log}"
    );
    for (k, said) in [
        ('1', "is not the image the start read"),
        ('2', "the image's layers: 200 layers (1 to 128 are read)"),
        ('3', "the image's layers: etc: a relative path"),
    ] {
        let line = log
            .lines()
            .find(|l| l.contains(&format!("image audit {}", key(k))))
            .unwrap_or_else(|| panic!("no line on request {k}:\n{log}"));
        assert!(line.contains(said), "{line}");
    }
    assert_eq!(node.ctl(None, &["status"]).status.code(), Some(0), "{log}");
    // AuditImage takes names, never paths: a name over 1024 bytes is
    // refused, a path-like name or an unknown key is not found, and
    // nothing outside audit.dir is read.
    let huge = "x".repeat(2000);
    for (image, said) in [
        (huge.as_str(), "an image of 2000 bytes (at most 1024)"),
        (
            "../../../etc/shadow",
            "no audit of ../../../etc/shadow on this node",
        ),
        (&key('f'), "on this node"),
    ] {
        let o = node.ctl(None, &["audit", "--image", image]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(said), "{err}");
    }
}
