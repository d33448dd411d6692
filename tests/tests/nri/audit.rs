//! The image audit on NRI's path (issue "image audit", part 2, where
//! Kubernetes starts pods): an image with an xformers built by nvcc for
//! sm_75 only, in a layer of its own. Its first GPU pod asks gpuarchd;
//! gpuarchd audits the image from the snapshot's layers (no rootfs is
//! mounted at CreateContainer) in its worker; later pods on the 3090 get
//! the note, on the 2080 Ti none; a scheduler asks by the image's name;
//! with `audit.refuse` the 3090's pod is refused in kubelet's error.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuarch_tests::audit::{nvcc_library, xformers_in};
use gpuarch_tests::stack::oci_archive_layers;

use crate::stack::Stack;

pub(crate) const IMAGE: &str = "gpuarch.test/xformers-sm75:1";
pub(crate) const NOTE: &str = "xformers 0.0.29 \"/usr/local/lib/python3.12/dist-packages/xformers/_C.so\" carries only sm_75: GPU 1 (NVIDIA GeForce RTX 3090, 8.6) cannot run it";
/// gpuarchd's line once it keeps an audit.
pub(crate) const KEPT: &str = "binaries with GPU code in";

/// [`IMAGE`] as an OCI archive made in `work`: a rootfs, and over it a
/// layer with xformers whose `_C.so` nvcc (of `cuda_home`) built for sm_75
/// only.
pub(crate) fn xformers_sm75_archive(cuda_home: &Path, work: &Path) -> PathBuf {
    let l: Vec<PathBuf> = (0..2).map(|i| work.join(format!("layer{i}"))).collect();
    for d in &l {
        std::fs::create_dir_all(d).unwrap();
    }
    gpuarch_tests::containers::make_rootfs(&l[0]);
    let lib = nvcc_library(cuda_home, work, &["arch=compute_75,code=sm_75"]);
    xformers_in(&l[1], &lib);
    oci_archive_layers(
        &[&l[0], &l[1]],
        &["PATH=/usr/local/bin:/usr/bin:/bin"],
        IMAGE,
        "/bin/sh",
        &work.join("oci"),
    )
}

pub(crate) fn audit(s: &mut Stack, suite: &str) {
    let (_python, cuda_home) = match gpuarch_tests::torch_image() {
        Ok(t) => t,
        Err(why) => {
            gpuarch_tests::skip(&format!("the NRI audit cases need nvcc: {why}"));
            return;
        }
    };
    let tar = xformers_sm75_archive(&cuda_home, &s.containerd.dir.join("audit-image"));
    s.containerd.import(&tar);
    let gpu1 = [("NVIDIA_VISIBLE_DEVICES", "1")];
    let gpu0 = [("NVIDIA_VISIBLE_DEVICES", "0")];
    let kept_before = s.node.log().matches(KEPT).count();

    // The first pod asks, and starts.
    let name = s.read_pod(IMAGE, &gpu1, "true");
    let asked = "the image's CUDA binaries are not audited yet: asked gpuarchd";
    assert!(
        notes(s, &name).iter().any(|n| n.starts_with(asked)),
        "{}",
        s.lines_of(&name)
    );
    let t = Instant::now();
    while s.node.log().matches(KEPT).count() == kept_before {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no audit kept in 60 s:\n{}",
            s.node.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let line = s
        .node
        .log()
        .lines()
        .filter(|l| l.contains(KEPT))
        .nth(kept_before)
        .unwrap()
        .to_owned();
    eprintln!("{suite}: {line}");
    assert!(
        line.contains(": 1 binaries with GPU code in 1 files"),
        "{line}"
    );

    // Later pods are judged by it: the 3090's, not the 2080 Ti's. Where
    // each container's snapshot is a copy of the image (containerd's
    // native snapshotter, 1.7's here), each pod is an image of its own
    // and asks again (docs/CONTRACT.md).
    let shared = suite == "sid";
    let name = s.read_pod(IMAGE, &gpu1, "true");
    let got = notes(s, &name);
    if shared {
        let want = format!("{NOTE}; rebuild with TORCH_CUDA_ARCH_LIST=\"8.6\"");
        assert!(got.contains(&want), "{got:#?}");
        let name = s.read_pod(IMAGE, &gpu0, "true");
        let got = notes(s, &name);
        assert!(!got.iter().any(|n| n.contains("cannot run it")), "{got:#?}");
    } else {
        assert!(got.iter().any(|n| n.starts_with(asked)), "{got:#?}");
    }

    // A scheduler asks by the name kubelet gave the image.
    let o = s
        .node
        .ctl(None, &["audit", "--image", IMAGE, "--devices", "1"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains(NOTE), "{text}");

    // audit.refuse: the 3090's pod is refused, with the reason kubelet
    // shows; the 2080 Ti's starts.
    if shared {
        set_audit(s, "  refuse: true\n");
        let (_, r) = s.pod_of(IMAGE, "", &gpu1, &[], &[], "true");
        let e = r.unwrap_err();
        assert!(e.contains("audit.refuse: xformers 0.0.29"), "{e}");
        let (_, r) = s.pod_of(IMAGE, "", &gpu0, &[], &[], "true");
        r.unwrap();
        set_audit(s, "");
    }
}

/// The notes of pod `name`'s Plan.
fn notes(s: &Stack, name: &str) -> Vec<String> {
    let why: serde_json::Value = serde_json::from_str(&s.why(name)).unwrap();
    serde_json::from_value(why["plan"]["notes"].clone()).unwrap()
}

/// gpuarchd's audit settings `extra`, applied (its config reloaded).
fn set_audit(s: &Stack, extra: &str) {
    let reloads = s.node.log().matches(" reloaded").count();
    s.write_config(true, extra);
    s.wait_log(" reloaded", reloads + 1);
}
