use super::*;
use nix::errno::Errno;
use tree::Tree;

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn link(root: &Path, rel: &str, target: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, p).unwrap();
}

/// A process with this env, running as root.
fn process(env: &[(&str, &str)]) -> ContainerView {
    ContainerView {
        user: Some((0, 0)),
        ..ContainerView::with_env(env.iter().map(|(k, v)| (*k, *v)))
    }
}

fn plain() -> ContainerView {
    process(&[])
}

#[test]
fn consumers_come_from_metadata_in_every_environment() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    write(
        r,
        "usr/local/lib/python3.12/dist-packages/torch-2.9.1+cu128.dist-info/METADATA",
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.9.1+cu128\n\nVersion: 9.9\n",
    );
    write(
        r,
        "opt/conda/lib/python3.11/site-packages/flashinfer_python-0.6.5.dist-info/METADATA",
        "Name: flashinfer-python\nVersion: 0.6.5\n",
    );
    // The name says 0.0.1; METADATA is what pip reads.
    write(
        r,
        "usr/lib/python3/dist-packages/xformers-0.0.1.dist-info/METADATA",
        "Name: xformers\nVersion: 0.0.33.post2\n",
    );
    // No METADATA: the entry's name.
    std::fs::create_dir_all(r.join("usr/lib/python3.12/site-packages/deepspeed-0.19.8.dist-info"))
        .unwrap();
    write(
        r,
        "usr/lib/python3.12/site-packages/numpy-2.1.0.dist-info/METADATA",
        "Version: 2.1.0\n",
    );
    let root = Root::open(r).unwrap();
    let (sw, notes) = read(&root, &plain(), None);
    assert!(notes.is_empty(), "{notes:?}");
    let got: Vec<String> = sw.dists.iter().map(|(d, v)| format!("{d} {v}")).collect();
    assert_eq!(
        got,
        [
            "torch 2.9.1",
            "flashinfer-python 0.6.5",
            "xformers 0.0.33",
            "deepspeed 0.19.8"
        ]
    );
    assert_eq!(sw.read.len(), 4, "{:?}", sw.read);
}

#[test]
fn two_torches_make_torch_unknown_and_no_environment_is_known_absence() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    for (env, v) in [
        ("usr/lib/python3.10/site-packages", "2.7.1"),
        ("opt/venv/lib/python3.12/site-packages", "2.9.1"),
    ] {
        write(
            r,
            &format!("{env}/torch-{v}.dist-info/METADATA"),
            &format!("Version: {v}\n"),
        );
    }
    let (sw, notes) = read(&Root::open(r).unwrap(), &plain(), None);
    assert_eq!(sw.get(Dist::Torch), None);
    assert!(sw.was_read());
    assert!(
        notes[0].contains(
            "torch 2.7.1 (\"/usr/lib/python3.10/site-packages/torch-2.7.1.dist-info\") and 2.9.1"
        ),
        "{notes:?}"
    );
    let empty = tempfile::tempdir().unwrap();
    let (sw, _) = read(&Root::open(empty.path()).unwrap(), &plain(), None);
    assert!(sw.was_read() && sw.dists.is_empty() && !sw.may_have(Dist::DeepSpeed));
}

#[test]
fn a_hostile_image_neither_blocks_nor_leads_outside_nor_costs_without_bound() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("rootfs");
    let env = "usr/lib/python3.12/site-packages";
    // METADATA a FIFO: opening it to read would wait for a writer.
    let d = r.join(env).join("torch-2.7.1.dist-info");
    std::fs::create_dir_all(&d).unwrap();
    nix::unistd::mkfifo(
        &d.join("METADATA"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    // METADATA an absolute link: it resolves inside the image, to the
    // image's file, never the host's beside it.
    let d = r.join(env).join("deepspeed-0.1.0.dist-info");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(dir.path().join("host-metadata"), "Version: 6.6.6\n").unwrap();
    std::os::unix::fs::symlink(dir.path().join("host-metadata"), d.join("METADATA")).unwrap();
    // An environment that is a link out of the image: followed inside.
    std::fs::create_dir_all(r.join("opt/conda/lib/python3.11")).unwrap();
    std::os::unix::fs::symlink(
        "/../../../../",
        r.join("opt/conda/lib/python3.11/site-packages"),
    )
    .unwrap();
    let root = Root::open(&r).unwrap();
    let t = Instant::now();
    let (sw, notes) = read(&root, &plain(), None);
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(
        sw.get(Dist::Torch),
        Some(Release::new(2, 7, 1)),
        "by its name"
    );
    assert_eq!(
        sw.get(Dist::DeepSpeed),
        Some(Release::new(0, 1, 0)),
        "not the host's 6.6.6"
    );
    assert!(notes.is_empty(), "{notes:?}");
    // Entries past the bound: the image counts as not read.
    for i in 0..64 {
        std::fs::create_dir_all(r.join(env).join(format!("pkg{i}"))).unwrap();
    }
    let (sw, notes) = read_within(&root, &plain(), None, 32, DEADLINE, WAIT);
    assert!(!sw.was_read() && sw.dists.is_empty());
    assert!(
        notes[0].contains("not read: over 32 directory entries"),
        "{notes:?}"
    );
}

#[test]
fn the_cache_answers_until_an_environment_changes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let r = dir.path();
    let env = "usr/lib/python3.12/site-packages";
    write(
        r,
        &format!("{env}/torch-2.7.1.dist-info/METADATA"),
        "Version: 2.7.1\n",
    );
    let root = Root::open(r).unwrap();
    let (first, _) = read(&root, &plain(), Some(cache.path()));
    // The consumers, and what discovery found for this process.
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 2);
    // A changed METADATA alone is not seen: the entry answers.
    write(
        r,
        &format!("{env}/torch-2.7.1.dist-info/METADATA"),
        "Version: 2.9.1\n",
    );
    assert_eq!(read(&root, &plain(), Some(cache.path())).0, first);
    // A package installed changes the environment: read again.
    std::thread::sleep(Duration::from_millis(20));
    write(
        r,
        &format!("{env}/deepspeed-0.19.8.dist-info/METADATA"),
        "Version: 0.19.8\n",
    );
    let (again, _) = read(&root, &plain(), Some(cache.path()));
    assert_eq!(again.get(Dist::Torch), Some(Release::new(2, 9, 1)));
    assert!(again.get(Dist::DeepSpeed).is_some());
    // A missing cache directory is not created.
    let gone = cache.path().join("gone");
    let _ = read(&root, &plain(), Some(&gone));
    assert!(!gone.exists());
}

/// A dist-info with real METADATA headers.
fn dist(root: &Path, site: &str, name: &str, version: &str) {
    write(
        root,
        &format!(
            "{site}/{}-{version}.dist-info/METADATA",
            name.replace('-', "_")
        ),
        &format!("Metadata-Version: 2.4\nName: {name}\nVersion: {version}\nSummary: x\n\n"),
    );
}

/// What one image's read found: "dist version" each, and whether absence
/// is proven.
fn found(r: &Path, view: &ContainerView) -> (Vec<String>, bool, Software) {
    let (sw, notes) = read(&Root::open(r).unwrap(), view, None);
    assert!(notes.is_empty(), "{notes:?}");
    let got = sw.dists.iter().map(|(d, v)| format!("{d} {v}")).collect();
    (got, sw.absence_proven(), sw)
}

/// A Python at `prefix` (its stdlib dir and `bin/python3 -> python3.N`).
fn python(r: &Path, prefix: &str, minor: u32) {
    let pre = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    write(r, &format!("{pre}bin/python3.{minor}"), "ELF");
    link(r, &format!("{pre}bin/python3"), &format!("python3.{minor}"));
    write(r, &format!("{pre}lib/python3.{minor}/os.py"), "");
}

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[test]
fn uvs_app_venv_is_read_through_its_interpreter_on_path() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr/local", 12);
    // uv: bin/python -> the base's interpreter, python3 -> python.
    link(r, "app/.venv/bin/python", "/usr/local/bin/python3");
    link(r, "app/.venv/bin/python3", "python");
    write(
        r,
        "app/.venv/pyvenv.cfg",
        "home = /usr/local/bin\nimplementation = CPython\nuv = 0.9.5\nversion_info = 3.12.12\ninclude-system-site-packages = false\n",
    );
    let site = "app/.venv/lib/python3.12/site-packages";
    dist(r, site, "torch", "2.9.1");
    dist(r, site, "deepspeed", "0.18.9");
    let path = format!("/app/.venv/bin:{PATH}");
    let (got, proven, sw) = found(r, &process(&[("PATH", &path)]));
    assert_eq!(got, ["torch 2.9.1", "deepspeed 0.18.9"]);
    assert!(proven, "{sw:?}");
    assert!(sw.read.contains(&format!("/{site}")), "{:?}", sw.read);
}

/// A merged-/usr image (Debian and Ubuntu since 2023: `/bin`, `/lib` and
/// `/lib64` are links into `/usr`) whose PATH finds Python through `/bin`
/// too: the prefixes `/` and `/usr` share one `lib`, which the read lists
/// once (envs.rs, `subdirs_once`); both still count as found, so absence
/// stays proven.
#[test]
fn a_merged_usr_lib_shared_by_two_prefixes_counts_for_both() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 12);
    link(r, "bin", "usr/bin");
    link(r, "lib", "usr/lib");
    std::fs::create_dir_all(r.join("usr/lib64")).unwrap();
    link(r, "lib64", "usr/lib64");
    dist(r, "usr/lib/python3.12/site-packages", "torch", "2.9.1");
    dist(r, "usr/lib/python3/dist-packages", "accelerate", "1.15.0");
    // /usr/bin's python3 has the prefix `/usr`, /bin's the prefix `/`,
    // whose lib is /usr/lib again.
    let (got, proven, sw) = found(r, &process(&[("PATH", "/usr/bin:/bin")]));
    assert_eq!(got, ["torch 2.9.1", "accelerate 1.15.0"]);
    assert!(proven, "{sw:?}");
    // Each site once, under the name found first.
    let mut read = sw.read.clone();
    read.sort();
    read.dedup();
    assert_eq!(read.len(), sw.read.len(), "{:?}", sw.read);
}

#[test]
fn a_venv_under_opt_found_through_path_as_on_the_h100_host() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 12);
    link(r, "opt/torch/.venv/bin/python3", "/usr/bin/python3");
    write(
        r,
        "opt/torch/.venv/pyvenv.cfg",
        "home = /usr/bin\ninclude-system-site-packages = true\nversion = 3.12.3\n",
    );
    dist(
        r,
        "opt/torch/.venv/lib/python3.12/site-packages",
        "torch",
        "2.11.0+cu130",
    );
    // The system site the venv includes.
    dist(r, "usr/lib/python3/dist-packages", "accelerate", "1.10.1");
    let path = format!("/opt/torch/.venv/bin:{PATH}");
    let view = process(&[("PATH", &path), ("VIRTUAL_ENV", "/opt/torch/.venv")]);
    let (got, proven, _) = found(r, &view);
    assert_eq!(got, ["torch 2.11.0", "accelerate 1.10.1"]);
    assert!(proven);
}

#[test]
fn user_sites_of_root_and_of_a_user_whose_home_is_in_passwd() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 11);
    dist(
        r,
        "root/.local/lib/python3.11/site-packages",
        "deepspeed",
        "0.17.6",
    );
    write(
        r,
        "etc/passwd",
        "root:x:0:0:root:/root:/bin/bash\nml:x:1000:1000::/home/ml:/bin/sh\n",
    );
    dist(
        r,
        "home/ml/.local/lib/python3.11/site-packages",
        "xformers",
        "0.0.33.post2",
    );
    // Root, HOME unset: /root/.local, not ml's.
    let (got, proven, _) = found(r, &process(&[("PATH", PATH)]));
    assert_eq!(got, ["deepspeed 0.17.6"]);
    assert!(proven);
    // uid 1000 without HOME: its home from the image's /etc/passwd.
    let ml = ContainerView {
        user: Some((1000, 1000)),
        ..process(&[("PATH", PATH)])
    };
    let (got, _, _) = found(r, &ml);
    assert_eq!(got, ["xformers 0.0.33", "deepspeed 0.17.6"]);
    // PYTHONUSERBASE wins over both.
    dist(
        r,
        "srv/pyuser/lib/python3.11/site-packages",
        "flash-attn",
        "2.8.3",
    );
    let (got, _, _) = found(
        r,
        &process(&[("PATH", PATH), ("PYTHONUSERBASE", "/srv/pyuser")]),
    );
    assert!(got.contains(&"flash-attn 2.8.3".to_owned()), "{got:?}");
}

#[test]
fn a_conda_named_env_conda_base_and_rhel_lib64() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "opt/conda", 11);
    python(r, "opt/conda/envs/train", 11);
    dist(
        r,
        "opt/conda/envs/train/lib/python3.11/site-packages",
        "flash-attn",
        "2.8.3",
    );
    dist(
        r,
        "opt/conda/lib/python3.11/site-packages",
        "bitsandbytes",
        "0.48.1",
    );
    let path = format!("/opt/conda/envs/train/bin:/opt/conda/bin:{PATH}");
    let view = process(&[("PATH", &path), ("CONDA_PREFIX", "/opt/conda/envs/train")]);
    let (got, proven, _) = found(r, &view);
    assert_eq!(got, ["flash-attn 2.8.3", "bitsandbytes 0.48.1"]);
    assert!(proven);
    // An env not on PATH is still one of conda's envs/*.
    let (got, _, _) = found(r, &process(&[("PATH", PATH)]));
    assert!(got.contains(&"flash-attn 2.8.3".to_owned()), "{got:?}");

    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    // UBI: /usr/bin/python3 -> python3.9, pip's installs under lib64.
    python(r, "usr", 9);
    std::fs::create_dir_all(r.join("usr/lib64/python3.9")).unwrap();
    dist(
        r,
        "usr/local/lib64/python3.9/site-packages",
        "torch",
        "2.7.1",
    );
    dist(r, "usr/local/lib/python3.9/site-packages", "vllm", "0.10.1");
    let (got, proven, _) = found(r, &process(&[("PATH", PATH)]));
    assert_eq!(got, ["torch 2.7.1", "vllm 0.10.1"]);
    assert!(proven);
}

#[test]
fn debians_and_ngcs_dist_packages_and_pythonpath() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 12);
    dist(r, "usr/lib/python3/dist-packages", "accelerate", "1.8.1");
    dist(
        r,
        "usr/local/lib/python3.12/dist-packages",
        "torch",
        "2.8.0a0+5228986c39.nv25.6",
    );
    dist(r, "workspace/libs", "flashinfer-python", "0.6.5");
    let view = process(&[
        ("PATH", PATH),
        ("PYTHONPATH", "/workspace/libs:relative:/gone"),
    ]);
    let (got, proven, _) = found(r, &view);
    assert_eq!(
        got,
        ["torch 2.8.0", "flashinfer-python 0.6.5", "accelerate 1.8.1"]
    );
    assert!(proven);
}

#[test]
fn an_interpreter_whose_environment_is_not_found_proves_no_absence() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 12);
    dist(r, "usr/lib/python3/dist-packages", "xformers", "0.0.33");
    // A Python on PATH with no lib/python3.* where its prefix is.
    write(r, "opt/custom/bin/python3", "ELF");
    // PYTHONPATH naming a zip.
    write(r, "srv/deps.zip", "PK");
    let path = format!("/opt/custom/bin:{PATH}");
    let view = process(&[("PATH", &path), ("PYTHONPATH", "/srv/deps.zip")]);
    let (got, proven, sw) = found(r, &view);
    assert_eq!(got, ["xformers 0.0.33"]);
    assert!(!proven);
    assert!(sw.may_have(Dist::DeepSpeed), "not seen is not absent");
    assert_eq!(
        sw.unread,
        [
            "\"/opt/custom/bin/python3\": no lib/python3.* under \"/opt/custom\"",
            "PYTHONPATH's \"/srv/deps.zip\": not a directory (a zip is not read)",
        ]
    );
}

#[test]
fn a_real_pip_install_into_a_venv_is_read() {
    // A venv made by this machine's Python and a wheel pip installs into
    // it, as an image's build would.
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    let venv = r.join("opt/env");
    let python = ["python3", "/usr/bin/python3"].into_iter().find(|p| {
        std::process::Command::new(p)
            .args(["-m", "venv", "--help"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some(python) = python else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI: no python3 with venv to make a real environment"
        );
        eprintln!("skipped: no python3 with venv");
        return;
    };
    let ok = std::process::Command::new(python)
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    // A wheel of a consumer's name, built here (no network), installed by
    // the venv's own pip machinery: the base's pip targeting the venv.
    let wheel_dir = tempfile::tempdir().unwrap();
    let wheel = wheel_dir.path().join("accelerate-1.10.1-py3-none-any.whl");
    let mut zip = String::new();
    zip.push_str("import zipfile,sys\n");
    zip.push_str("z=zipfile.ZipFile(sys.argv[1],'w')\n");
    zip.push_str("z.writestr('accelerate/__init__.py','')\n");
    zip.push_str("z.writestr('accelerate-1.10.1.dist-info/METADATA','Metadata-Version: 2.1\\nName: accelerate\\nVersion: 1.10.1\\n')\n");
    zip.push_str("z.writestr('accelerate-1.10.1.dist-info/WHEEL','Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n");
    zip.push_str("z.writestr('accelerate-1.10.1.dist-info/RECORD','')\n");
    let made = std::process::Command::new(python)
        .args(["-c", &zip])
        .arg(&wheel)
        .status()
        .unwrap()
        .success();
    assert!(made);
    let venv_python = venv.join("bin/python3");
    let pip = std::process::Command::new(python)
        .args(["-m", "pip", "--python"])
        .arg(&venv_python)
        .args(["install", "--no-index", "--no-deps", "-q"])
        .arg(&wheel)
        .output()
        .unwrap();
    if !pip.status.success() {
        // pip older than 22.3 has no --python: install with the base's pip
        // into the venv's site.
        let site = std::process::Command::new(&venv_python)
            .args([
                "-c",
                "import sysconfig;print(sysconfig.get_paths()['purelib'])",
            ])
            .output()
            .unwrap();
        let site = String::from_utf8(site.stdout).unwrap();
        let ok = std::process::Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--no-index",
                "--no-deps",
                "-q",
                "--target",
            ])
            .arg(site.trim())
            .arg(&wheel)
            .status()
            .unwrap()
            .success();
        assert!(ok, "{}", String::from_utf8_lossy(&pip.stderr));
    }
    // The venv's interpreter links to this machine's Python, outside the
    // image: found by its pyvenv.cfg, never followed out.
    let view = process(&[("PATH", &format!("/opt/env/bin:{PATH}"))]);
    let (sw, notes) = read(&Root::open(r).unwrap(), &view, None);
    assert_eq!(
        sw.get(Dist::Accelerate),
        Some(Release::new(1, 10, 1)),
        "{sw:?} {notes:?}"
    );
    assert!(
        sw.read
            .iter()
            .any(|s| s.starts_with("/opt/env/lib/python3")),
        "{:?}",
        sw.read
    );
}

#[test]
fn a_directory_whose_read_never_ends_in_time_leaves_the_image_not_read() {
    // 20,000 consumer-named dist-info dirs, each with METADATA: within the
    // wait, then not read.
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    let site = "usr/local/lib/python3.12/dist-packages";
    for i in 0..20_000 {
        dist(r, site, "torch", &format!("2.{}.{}", i / 100, i % 100));
    }
    let root = Root::open(r).unwrap();
    let t = Instant::now();
    let (sw, notes) = read(&root, &plain(), None);
    let took = t.elapsed();
    assert!(took < WAIT + Duration::from_millis(10), "{took:?}");
    // Read in time (few METADATA opened) or not read at all: never more.
    if sw.was_read() {
        assert!(sw.get(Dist::Torch).is_none(), "many torches: none known");
    } else {
        assert!(notes[0].contains("not read"), "{notes:?}");
    }
    // A reader that cannot finish in time is not waited for.
    let (sw, notes) = read_within(&root, &plain(), None, MAX_ENTRIES, DEADLINE, Duration::ZERO);
    assert!(
        !sw.was_read() && notes[0].contains("over 0 ms"),
        "{notes:?}"
    );
}

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

#[test]
fn a_start_like_an_earlier_one_lists_no_directory_until_one_it_depended_on_changes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let r = dir.path();
    let site = "usr/lib/python3.12/site-packages";
    python(r, "usr", 12);
    dist(r, site, "torch", "2.7.1");
    write(r, "srv/venv/pyvenv.cfg", "home = /usr/bin\n");
    link(r, "srv/venv/bin/python3", "/usr/bin/python3");
    dist(
        r,
        "srv/venv/lib/python3.12/site-packages",
        "xformers",
        "0.0.30",
    );
    std::fs::create_dir(r.join("app")).unwrap();
    let view = process(&[("PATH", "/srv/venv/bin:/usr/bin")]);
    let root = Root::open(r).unwrap();
    let c = cache.path();
    assert_eq!(seen_before(&root, &view, c), None, "nothing seen yet");
    let (first, notes) = read(&root, &view, Some(c));
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(first.dists.len(), 2, "{first:?}");
    // Seen: answered from stats alone, for this process only.
    assert_eq!(
        seen_before(&root, &view, c).map(|h| h.0),
        Some(first.clone())
    );
    assert_eq!(seen_before(&root, &plain(), c), None);
    // Each thing discovery depended on, changed, is a new read.
    let changes: [(&str, &dyn Fn()); 6] = [
        ("the venv's pyvenv.cfg", &|| {
            write(
                r,
                "srv/venv/pyvenv.cfg",
                "home = /usr/bin\ninclude-system-site-packages = true\n",
            )
        }),
        ("a conda env where there was none", &|| {
            dist(
                r,
                "opt/conda/envs/x/lib/python3.11/site-packages",
                "deepspeed",
                "0.18.2",
            )
        }),
        ("uv's /app/.venv in an /app that was empty", &|| {
            dist(
                r,
                "app/.venv/lib/python3.12/site-packages",
                "flash_attn",
                "2.8.3",
            )
        }),
        ("root's user site where there was none", &|| {
            dist(
                r,
                "root/.local/lib/python3.12/site-packages",
                "bitsandbytes",
                "0.48.1",
            )
        }),
        ("a Python on PATH relinked", &|| {
            std::fs::remove_file(r.join("usr/bin/python3")).unwrap();
            link(r, "usr/bin/python3", "python3.13");
        }),
        ("a package installed in a site", &|| {
            dist(r, site, "accelerate", "1.2.0")
        }),
    ];
    for (what, change) in changes {
        std::thread::sleep(Duration::from_millis(20));
        change();
        assert_eq!(seen_before(&root, &view, c), None, "{what}");
        let (sw, _) = read(&root, &view, Some(c));
        assert!(seen_before(&root, &view, c).is_some(), "{what}: seen again");
        assert_eq!(seen_before(&root, &view, c).map(|h| h.0), Some(sw));
    }
    let (sw, _) = read(&root, &view, Some(c));
    for d in [
        Dist::DeepSpeed,
        Dist::Accelerate,
        Dist::FlashAttn,
        Dist::Bitsandbytes,
    ] {
        assert!(sw.get(d).is_some(), "{d:?}: {sw:?}");
    }
}

#[test]
fn a_process_whose_user_is_not_known_has_every_users_site_read() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 12);
    write(
        r,
        "etc/passwd",
        "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
    );
    dist(
        r,
        "home/app/.local/lib/python3.12/site-packages",
        "deepspeed",
        "0.18.2",
    );
    dist(
        r,
        ".local/lib/python3.12/site-packages",
        "xformers",
        "0.0.30",
    );
    let mut view = process(&[("PATH", PATH)]);
    let (got, proven, _) = found(r, &view);
    assert!(got.is_empty() && proven, "root's sites alone: {got:?}");
    // A uid passwd does not know: HOME is `/` (runc), its site `/.local`.
    view.user = Some((4242, 4242));
    let (got, _, _) = found(r, &view);
    assert_eq!(got, ["xformers 0.0.30"]);
    view.user = None;
    let (got, proven, sw) = found(r, &view);
    assert_eq!(
        got,
        ["xformers 0.0.30", "deepspeed 0.18.2"],
        "{:?}",
        sw.read
    );
    assert!(proven);
}

#[test]
fn a_release_is_the_version_header_wherever_it_sits_in_the_headers() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    let site = "usr/local/lib/python3.12/site-packages";
    python(r, "usr/local", 12);
    // A build backend that writes Version: after 6 KB of other headers,
    // with CRLF line ends: found past the first read.
    let classifiers = "Classifier: Programming Language :: Python :: 3\r\n".repeat(128);
    write(
        r,
        &format!("{site}/torch-2.7.1+cu128.dist-info/METADATA"),
        &format!(
            "Metadata-Version: 2.1\r\nName: torch\r\n{classifiers}Version: 2.8.0\r\n\r\nbody\r\n"
        ),
    );
    // A `Version:` in the description is not the release's: its name says.
    let long_body = "Version: 9.9.9\n".repeat(600);
    write(
        r,
        &format!("{site}/xformers-0.0.30.dist-info/METADATA"),
        &format!("Metadata-Version: 2.1\nName: xformers\n\n{long_body}"),
    );
    // Headers over the whole bound: the name's release.
    let huge = "Classifier: x\n".repeat(6000);
    write(
        r,
        &format!("{site}/deepspeed-0.18.2.dist-info/METADATA"),
        &format!("Metadata-Version: 2.1\nName: deepspeed\n{huge}Version: 0.1.0\n\n"),
    );
    let view = process(&[("PATH", "/usr/local/bin")]);
    let (got, _, _) = found(r, &view);
    assert_eq!(
        got,
        ["torch 2.8.0", "xformers 0.0.30", "deepspeed 0.18.2"],
        "{got:?}"
    );
}
