//! The audit of an image given as its layers (gpuarchd's NRI starts): the
//! merged view overlayfs would show, nothing hidden read, nothing outside
//! the layers reached, and the worker's check that they are the image the
//! start read.

use std::path::PathBuf;

use super::*;

/// A whiteout at `rel` of layer `l`, as a snapshotter unpacks one.
fn whiteout(l: &Path, rel: &str) {
    let p = l.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    nix::sys::stat::mknod(
        &p,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
        0,
    )
    .unwrap();
}

/// Three layers, the top one first: the base has Python, xformers 0.0.29
/// (sm_75 only) and an old CUDA library; the next upgrades xformers to
/// 0.0.30 (sm_80 and sm_86) and removes the old library; the top adds a
/// link out of the image and a FIFO that a RECORD names.
fn image(dir: &Path, outside: &Path) -> Vec<PathBuf> {
    let l: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("{i}/fs"))).collect();
    put(&l[2], "usr/bin/python3.12", b"");
    dist(
        &l[2],
        SITE,
        "xformers",
        "0.0.29",
        &[("xformers/_C.so", cubin(75))],
    );
    put(&l[2], "usr/local/cuda/lib64/libold.so", &cubin(70));
    whiteout(&l[1], &format!("{SITE}/xformers-0.0.29.dist-info"));
    whiteout(&l[1], "usr/local/cuda/lib64/libold.so");
    let fat = write_fatbin(&[(2, 80, &cubin(80)), (2, 86, &cubin(86))]);
    dist(
        &l[1],
        SITE,
        "xformers",
        "0.0.30",
        &[("xformers/_C.so", fat), ("xformers/pipe.so", Vec::new())],
    );
    fs::remove_file(l[1].join(SITE).join("xformers/pipe.so")).unwrap();
    nix::unistd::mkfifo(
        &l[1].join(SITE).join("xformers/pipe.so"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let secret = outside.join("secret.so");
    fs::write(&secret, cubin(90)).unwrap();
    fs::create_dir_all(l[0].join("usr/local/cuda/lib64")).unwrap();
    std::os::unix::fs::symlink(&secret, l[0].join("usr/local/cuda/lib64/libhost.so")).unwrap();
    let up = "../".repeat(12) + secret.strip_prefix("/").unwrap().to_str().unwrap();
    put(&l[0], "usr/local/cuda/lib64/libup.so.txt", b"");
    std::os::unix::fs::symlink(&up, l[0].join("usr/local/cuda/lib64/libup.so")).unwrap();
    l
}

#[test]
fn an_image_given_as_its_layers_is_audited_as_overlayfs_shows_it() {
    gpuarch_testkit::skip_unless!(gpuarch_testkit::unless_root("for whiteouts (mknod)"));
    let d = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let dirs = image(d.path(), outside.path());
    let layers = Layers::open(&dirs).unwrap();
    let a = audit(Files::Layers(&layers), &view(), &Limits::default());
    // The upper layer's xformers, not the hidden one; the removed library
    // not at all; the links out of the image, and the FIFO, never read.
    assert_eq!(
        listed(&a),
        [(
            "xformers 0.0.30",
            "/usr/local/lib/python3.12/dist-packages/xformers/_C.so",
            vec!["sm_80".to_owned(), "sm_86".to_owned()]
        )]
    );
    assert!(a.unread.is_empty(), "{:?}", a.unread);
    assert!(
        a.read.contains(&"/usr/local/cuda/lib64".to_owned()),
        "{:?}",
        a.read
    );
    assert_eq!(a.files, 1);
}

/// What the worker answers for `key` and the image in `dirs`.
fn worker(dirs: &[PathBuf], key: &str) -> Result<ImageAudit, WorkerError> {
    let input = WorkerInput {
        request: gpuarch_container::audit::Request {
            rootfs: PathBuf::new(),
            layers: dirs.to_vec(),
            env: Vec::new(),
            user: None,
            images: vec!["registry.example/xformers:0.0.30".into()],
        },
        key: key.to_owned(),
        max_seconds: 60,
    };
    let mut out = Vec::new();
    serve(serde_json::to_vec(&input).unwrap().as_slice(), &mut out)?;
    Ok(serde_json::from_slice(&out).unwrap())
}

#[test]
fn the_worker_audits_layers_only_when_they_are_the_image_the_start_read() {
    gpuarch_testkit::skip_unless!(gpuarch_testkit::unless_root("for whiteouts (mknod)"));
    let d = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let dirs = image(d.path(), outside.path());
    let key = Files::Layers(&Layers::open(&dirs).unwrap())
        .identify(&view())
        .unwrap();
    let a = worker(&dirs, &key).unwrap();
    assert_eq!(a.binaries.len(), 1, "{a:?}");
    assert_eq!(a.images, ["registry.example/xformers:0.0.30"]);
    // Another image's key: the layers are not audited under it.
    let e = worker(&dirs, &"0".repeat(64)).unwrap_err().to_string();
    assert!(e.contains("is not the image the start read"), "{e}");
    assert!(e.contains("the 3 layers of"), "{e}");
    // Layers gone (the snapshot removed): said, nothing audited.
    let gone = [d.path().join("none")];
    let e = worker(&gone, &key).unwrap_err().to_string();
    assert!(e.starts_with("the image's layers:"), "{e}");
}
