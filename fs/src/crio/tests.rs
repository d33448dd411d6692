//! Unit tests of `fs/src/crio.rs`: CRI-O's storage as CRI-O takes it.

use super::*;
use std::fs;

/// An `NriConfig` whose CRI-O files are under `dir`.
fn nri(dir: &Path) -> NriConfig {
    NriConfig {
        crio_config: dir.join("crio/crio.conf"),
        storage_conf: dir.join("containers/storage.conf"),
        ..NriConfig::default()
    }
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

#[test]
fn crio_conf_and_its_drop_ins_win_over_storage_conf_and_gpuarchs_own_over_both() {
    let d = tempfile::tempdir().unwrap();
    let n = nri(d.path());
    // Nothing there: containers/storage's defaults.
    let s = CrioStorage::of(&n);
    assert_eq!(s.root.value, Path::new(DEFAULT_STORAGE_ROOT));
    assert_eq!(s.root.from, "the default");
    assert!(s.problems.is_empty() && s.image_stores.is_empty(), "{s:?}");
    write(
        &n.storage_conf,
        "[storage]\ndriver = \"overlay\"\ngraphroot = \"/data/storage\"\nrunroot = \"/run/data\"\n\
         imagestore = \"/data/images\"\n\
         [storage.options]\nadditionalimagestores = [\"/ro/store\", \"\"]\n",
    );
    let s = CrioStorage::of(&n);
    assert_eq!(s.root.value, Path::new("/data/storage"));
    assert_eq!(s.root.from, n.storage_conf.display().to_string());
    assert_eq!(s.runroot.value, Path::new("/run/data"));
    assert_eq!(
        s.image_stores,
        [PathBuf::from("/data/images"), PathBuf::from("/ro/store")]
    );
    // crio.conf's root, then a drop-in's, in name order.
    write(&n.crio_config, "[crio]\nroot = \"/crio/root\"\n");
    let dropins = d.path().join("crio/crio.conf.d");
    write(
        &dropins.join("20-later.conf"),
        "[crio]\nroot = \"/crio/later\"\n",
    );
    write(
        &dropins.join("10-first.conf"),
        "[crio]\nroot = \"/crio/first\"\nrunroot = \"/run/crio\"\n\
         storage_option = [\"overlay.mountopt=nodev\", \"overlay.imagestore=/ro/two\"]\n",
    );
    write(
        &dropins.join("30-not-a-drop-in.bak"),
        "[crio]\nroot = \"/no\"\n",
    );
    let s = CrioStorage::of(&n);
    assert_eq!(s.root.value, Path::new("/crio/later"));
    assert!(s.root.from.ends_with("20-later.conf"), "{s:?}");
    assert_eq!(s.runroot.value, Path::new("/run/crio"));
    assert_eq!(
        s.image_stores,
        [
            PathBuf::from("/data/images"),
            PathBuf::from("/ro/store"),
            PathBuf::from("/ro/two")
        ]
    );
    // gpuarch's own settings, where set, win; its stores come first.
    let own = NriConfig {
        storage_root: Some("/mine".into()),
        storage_image_stores: vec!["/ro/two".into()],
        ..n.clone()
    };
    let s = CrioStorage::of(&own);
    assert_eq!(
        (s.root.value.as_path(), s.root.from.as_str()),
        (Path::new("/mine"), "nri.storage_root")
    );
    assert_eq!(s.runroot.value, Path::new("/run/crio"));
    assert_eq!(
        s.image_stores,
        [
            PathBuf::from("/ro/two"),
            PathBuf::from("/data/images"),
            PathBuf::from("/ro/store")
        ]
    );
}

#[test]
fn a_file_that_cannot_be_taken_is_said_and_the_others_still_count() {
    let d = tempfile::tempdir().unwrap();
    let n = nri(d.path());
    write(
        &n.storage_conf,
        "[storage]\ngraphroot = \"/data/storage\"\n",
    );
    write(&n.crio_config, "[crio\nroot = \"/broken\"\n");
    let dropins = d.path().join("crio/crio.conf.d");
    write(
        &dropins.join("10-relative.conf"),
        "[crio]\nroot = \"var/lib\"\nrunroot = 7\n",
    );
    // A FIFO where a drop-in is: never opened for reading, so never
    // waited on.
    fs::create_dir_all(&dropins).unwrap();
    nix::unistd::mkfifo(&dropins.join("20-fifo.conf"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    // Over the bound: not read.
    write(
        &dropins.join("30-big.conf"),
        &format!(
            "# {}\n[crio]\nroot = \"/big\"\n",
            "x".repeat(crate::MAX_CONFIG as usize)
        ),
    );
    write(&dropins.join("40-binary.conf"), "\u{0}\u{ff}");
    fs::write(
        dropins.join("50-latin1.conf"),
        b"[crio]\nroot = \"/\xe9\"\n",
    )
    .unwrap();
    let t = std::time::Instant::now();
    let s = CrioStorage::of(&n);
    assert!(t.elapsed() < std::time::Duration::from_secs(2));
    assert_eq!(s.root.value, Path::new("/data/storage"), "{s:?}");
    let problems = s.problems.join("\n");
    for want in [
        "crio.conf: not TOML",
        "10-relative.conf: root \"var/lib\" is not an absolute path; not taken",
        "10-relative.conf: runroot is not a string; not taken",
        "20-fifo.conf: not a regular file",
        "30-big.conf: over 1048576 bytes; not read",
        "50-latin1.conf: not UTF-8",
    ] {
        assert!(problems.contains(want), "no {want:?} in\n{problems}");
    }
}

#[test]
fn drop_ins_past_the_bound_are_said_not_read() {
    let d = tempfile::tempdir().unwrap();
    let n = nri(d.path());
    let dropins = d.path().join("crio/crio.conf.d");
    for i in 0..MAX_DROP_INS + 2 {
        write(
            &dropins.join(format!("{i:03}.conf")),
            &format!("[crio]\nroot = \"/r{i}\"\n"),
        );
    }
    let s = CrioStorage::of(&n);
    // Name order: the 64th (063.conf) is the last read.
    assert_eq!(s.root.value, Path::new(&format!("/r{}", MAX_DROP_INS - 1)));
    assert!(
        s.problems[0].contains("over 64 drop-ins; those after")
            && s.problems[0].ends_with("063.conf not read"),
        "{:?}",
        s.problems
    );
}
