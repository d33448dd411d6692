//! An image read from its layers as overlayfs merges them: whiteouts,
//! opaque directories, links that never leave the layers, bounded cost.

use super::*;

/// A whiteout at `rel` of layer `l`, as a snapshotter unpacks one.
fn whiteout(l: &Path, rel: &str) {
    let p = l.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    nix::sys::stat::mknod(
        &p,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
        0,
    )
    .unwrap();
}

/// Directory `rel` of layer `l` made opaque, as a snapshotter marks one.
fn opaque(l: &Path, rel: &str) {
    let p = l.join(rel);
    std::fs::create_dir_all(&p).unwrap();
    let path = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: both names are NUL-terminated, the value is one live byte.
    let r = unsafe {
        nix::libc::setxattr(
            path.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            b"y".as_ptr().cast(),
            1,
            0,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}

fn layers_of(dir: &Path, n: usize) -> (Vec<std::path::PathBuf>, Layers) {
    let dirs: Vec<_> = (0..n).map(|i| dir.join(format!("layer{i}"))).collect();
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    let layers = Layers::open(&dirs).unwrap();
    (dirs, layers)
}

#[test]
fn layers_merge_as_overlayfs_merges_them() {
    gpuarch_testkit::skip_unless!(gpuarch_testkit::unless_root(
        "for whiteouts (mknod) and opaque directories (trusted.* xattrs)"
    ));
    let dir = tempfile::tempdir().unwrap();
    // layer0 is the top.
    let (l, layers) = layers_of(dir.path(), 3);
    let site = "usr/lib/python3.12/site-packages";
    python(&l[2], "usr", 12);
    dist(&l[2], site, "torch", "2.7.1");
    dist(&l[2], site, "xformers", "0.0.30");
    dist(
        &l[2],
        "opt/venv/lib/python3.12/site-packages",
        "flash-attn",
        "2.7.4",
    );
    // A later layer removes xformers, and replaces /opt/venv whole.
    whiteout(&l[1], &format!("{site}/xformers-0.0.30.dist-info"));
    opaque(&l[1], "opt/venv");
    write(&l[1], "opt/venv/README", "");
    // The top layer: uv's venv, whose interpreter links to the base's in
    // the bottom layer; DeepSpeed in it; its METADATA says the release.
    write(&l[0], "app/.venv/pyvenv.cfg", "home = /usr/bin\n");
    link(&l[0], "app/.venv/bin/python3", "/usr/bin/python3");
    write(&l[0], "app/.venv/lib/python3.12/site-packages/.keep", "");
    dist(
        &l[0],
        "app/.venv/lib/python3.12/site-packages",
        "deepspeed",
        "0.18.2",
    );
    let view = process(&[("PATH", &format!("/app/.venv/bin:{PATH}"))]);
    let (sw, notes) = read_layers(&layers, &view, None);
    assert!(notes.is_empty(), "{notes:?}");
    let got: Vec<String> = sw.dists.iter().map(|(d, v)| format!("{d} {v}")).collect();
    assert_eq!(got, ["torch 2.7.1", "deepspeed 0.18.2"], "{:?}", sw.read);
    assert!(sw.absence_proven(), "{:?}", sw.unread);
    assert!(
        sw.read
            .contains(&"/app/.venv/lib/python3.12/site-packages".to_owned())
    );

    // The merged view's files, as the container would see them.
    assert!(layers.is_dir("opt/venv").unwrap());
    assert_eq!(
        layers.read_regular("usr/bin/python3", 16).unwrap(),
        b"ELF",
        "a link in one layer to a file in another"
    );
    assert_eq!(
        layers.read_link("app/.venv/bin/python3").unwrap(),
        Path::new("/usr/bin/python3")
    );
    assert_eq!(
        layers
            .is_dir("opt/venv/lib/python3.12/site-packages")
            .unwrap_err(),
        Errno::ENOENT,
        "hidden by the opaque directory"
    );
    let d = layers.dir(site).unwrap();
    assert!(!layers.has_entry(&d, "xformers-0.0.30.dist-info"));
    assert!(layers.has_entry(&d, "torch-2.7.1.dist-info"));
}

#[test]
fn no_link_of_a_layer_leads_out_of_the_layers() {
    gpuarch_testkit::skip_unless!(gpuarch_testkit::unless_root(
        "for a FIFO and a device node in a layer"
    ));
    let dir = tempfile::tempdir().unwrap();
    let (l, layers) = layers_of(dir.path(), 2);
    // Beside the layers, where a link might lead: a site with flash-attn.
    let outside = dir.path().join("outside/lib/python3.12/site-packages");
    dist(
        &dir.path().join("outside"),
        "lib/python3.12/site-packages",
        "flash-attn",
        "9.9.9",
    );
    assert!(outside.is_dir());
    let site = "usr/lib/python3.12/site-packages";
    python(&l[1], "usr", 12);
    dist(&l[1], site, "torch", "2.9.1");
    // Links that climb out, relative and absolute, and the host's own path.
    link(
        &l[0],
        "opt/conda/lib/python3.11/site-packages",
        "../../../../../../outside/lib/python3.12/site-packages",
    );
    link(
        &l[0],
        "opt/venv/lib/python3.12/site-packages",
        outside.to_str().unwrap(),
    );
    link(
        &l[0],
        "usr/local/lib/python3.12/dist-packages",
        "/../../../../../outside/lib/python3.12/site-packages",
    );
    // METADATA a link to the host's file, a FIFO, a device node; a loop.
    std::fs::write(dir.path().join("host-metadata"), "Version: 6.6.6\n").unwrap();
    let ds = l[0].join(site).join("deepspeed-0.1.0.dist-info");
    std::fs::create_dir_all(&ds).unwrap();
    std::os::unix::fs::symlink(dir.path().join("host-metadata"), ds.join("METADATA")).unwrap();
    let fa = l[0].join(site).join("xformers-0.0.31.dist-info");
    std::fs::create_dir_all(&fa).unwrap();
    nix::unistd::mkfifo(
        &fa.join("METADATA"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let tr = l[0].join(site).join("accelerate-1.2.0.dist-info");
    std::fs::create_dir_all(&tr).unwrap();
    nix::sys::stat::mknod(
        &tr.join("METADATA"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
        nix::sys::stat::makedev(1, 5),
    )
    .unwrap();
    link(&l[0], "loop/a", "b");
    link(&l[0], "loop/b", "a");
    let t = Instant::now();
    let (sw, notes) = read_layers(&layers, &plain(), None);
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(
        sw.get(Dist::FlashAttn),
        None,
        "nothing from outside the layers: {:?}",
        sw.read
    );
    assert_eq!(
        sw.get(Dist::DeepSpeed),
        Some(Release::new(0, 1, 0)),
        "not the host's 6.6.6"
    );
    assert_eq!(
        sw.get(Dist::Xformers),
        Some(Release::new(0, 0, 31)),
        "by its name"
    );
    assert_eq!(sw.get(Dist::Torch), Some(Release::new(2, 9, 1)));
    assert_eq!(
        sw.get(Dist::Accelerate),
        Some(Release::new(1, 2, 0)),
        "a device node is not opened"
    );
    assert_eq!(
        layers
            .read_regular(&format!("{site}/accelerate-1.2.0.dist-info/METADATA"), 8)
            .unwrap_err(),
        Errno::EINVAL
    );
    assert_eq!(layers.is_dir("loop/a").unwrap_err(), Errno::ELOOP);
    // A layer list past the bound is refused, not read.
    let many = vec![l[0].clone(); tree::MAX_LAYERS + 1];
    assert!(Layers::open(&many).is_err());
}

#[test]
fn a_hostile_layer_stack_costs_at_most_the_reads_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (l, _) = layers_of(dir.path(), tree::MAX_LAYERS);
    // Every layer has the same deep directory, so each name looked up is
    // looked up in all of them; the top layer's PATH entries are chains
    // of links whose targets climb back with `..`, which the walk takes
    // from the merged view's top each time.
    let deep = "p/a/b/c/d/e/f/g/h";
    for layer in &l {
        std::fs::create_dir_all(layer.join(deep)).unwrap();
    }
    let up = "../".repeat(9);
    let mut path = Vec::new();
    for k in 0..32 {
        for j in 0..40 {
            link(
                &l[0],
                &format!("bin{k}/{j}"),
                &format!("/{deep}/{up}bin{k}/{}", j + 1),
            );
        }
        path.push(format!("/bin{k}/0"));
    }
    let view = process(&[("PATH", &path.join(":"))]);
    let mut layers = Layers::open(&l).unwrap();
    // On this thread, not abandoned after WAIT: the reader itself stops.
    let t = Instant::now();
    let (sw, notes) = read_here(&mut layers, &view, None, MAX_ENTRIES, DEADLINE);
    let took = t.elapsed();
    assert!(took < DEADLINE * 4, "{took:?}");
    assert!(!sw.was_read() && !sw.absence_proven(), "{sw:?}");
    assert!(notes[0].contains("not read"), "{notes:?}");
    eprintln!("{} layers of link chains: {took:?}, {notes:?}", l.len());
}

/// Found by the `image_read` fuzz target: overlayfs lists a whiteout where
/// the directory comes from one layer alone (a layer deleting what no
/// layer below it holds), though looking the name up finds nothing. The
/// hook, reading the mounted rootfs, took that name for a torch 2.7.1;
/// gpuarchd, reading the layers, did not. Both now find torch 2.9.1 alone.
#[test]
fn a_whiteout_overlayfs_lists_is_no_distribution() {
    gpuarch_testkit::skip_unless!(gpuarch_testkit::unless_root(
        "for a whiteout (mknod) and an overlayfs mount"
    ));
    let dir = tempfile::tempdir().unwrap();
    let (l, layers) = layers_of(dir.path(), 2);
    let site = "usr/lib/python3.12/site-packages";
    python(&l[1], "usr", 12);
    dist(&l[0], site, "torch", "2.9.1");
    whiteout(&l[0], &format!("{site}/torch-2.7.1.dist-info"));
    let view = process(&[]);
    let torch = |sw: &Software| {
        sw.dists
            .iter()
            .map(|(d, v)| format!("{d} {v}"))
            .collect::<Vec<_>>()
    };

    let (by_layers, notes) = read_layers(&layers, &view, None);
    assert_eq!(torch(&by_layers), ["torch 2.9.1"], "{notes:?}");

    // The rootfs as a runtime mounts it, in a mount namespace of this
    // thread's own (the reader's thread, started from it, shares it).
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).unwrap();
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .unwrap();
    let lower = format!("lowerdir={}:{}", l[0].display(), l[1].display());
    nix::mount::mount(
        Some("overlay"),
        &rootfs,
        Some("overlay"),
        nix::mount::MsFlags::MS_RDONLY,
        Some(lower.as_str()),
    )
    .unwrap();
    let listed: Vec<String> = std::fs::read_dir(rootfs.join(site))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let root = Root::open(&rootfs).unwrap();
    let (by_root, notes) = read(&root, &view, None);
    drop(root);
    nix::mount::umount2(&rootfs, nix::mount::MntFlags::MNT_DETACH).unwrap();
    assert_eq!(
        torch(&by_root),
        ["torch 2.9.1"],
        "listed: {listed:?}; {notes:?}"
    );
    assert_eq!(by_root.read, by_layers.read);
}
