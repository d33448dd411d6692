use super::*;
use nix::errno::Errno;
use tree::Tree;

mod layers;
mod layouts;

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
fn of_two_releases_in_two_environments_the_oldest_decides_and_no_library_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    for (env, ds, fi) in [
        ("usr/local/lib/python3.12/dist-packages", "0.17.6", "0.6.13"),
        ("opt/venv/lib/python3.12/site-packages", "0.14.5", "0.6.12"),
    ] {
        write(
            r,
            &format!("{env}/deepspeed-{ds}.dist-info/METADATA"),
            &format!("Version: {ds}\n"),
        );
        write(
            r,
            &format!("{env}/flashinfer_python-{fi}.dist-info/METADATA"),
            &format!("Version: {fi}\n"),
        );
    }
    let (sw, notes) = read(&Root::open(r).unwrap(), &plain(), None);
    // DeepSpeed 0.14 cannot parse `10.0`: it must not be hidden by 0.17.
    assert_eq!(sw.get(Dist::DeepSpeed), Release::parse("0.14.5"));
    assert_eq!(sw.get(Dist::FlashInfer), Release::parse("0.6.12"));
    assert!(sw.exact.is_empty(), "{:?}", sw.exact);
    let notes = notes.join("\n");
    assert!(
        notes.contains("the image holds deepspeed 0.14.5 (\"/opt/venv/lib/python3.12/site-packages/deepspeed-0.14.5.dist-info\") and 0.17.6")
            && notes.contains("the oldest decides")
            && notes.contains("the image holds flashinfer-python 0.6.12 and 0.6.13: no library is served for it"),
        "{notes}"
    );
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

/// Found by the `image_read` fuzz target: a start answered from the cache
/// said nothing of what the first start's read said (two releases of a
/// consumer, and which decides), so only the first container's record
/// told the operator why.
#[test]
fn what_a_read_said_is_said_again_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 12);
    dist(r, "usr/lib/python3.12/site-packages", "deepspeed", "0.17.6");
    dist(
        r,
        "opt/venv/lib/python3.12/site-packages",
        "deepspeed",
        "0.14.5",
    );
    let root = Root::open(r).unwrap();
    let (fresh, said) = read(&root, &plain(), None);
    assert!(
        said.iter().any(|n| n.contains("the oldest decides")),
        "{said:?}"
    );
    let first = read(&root, &plain(), Some(cache.path()));
    // The same process: what discovery found, and the consumers, cached.
    let again = read(&root, &plain(), Some(cache.path()));
    // Another process that finds the same environments: discovery runs
    // again, the consumers come from the cache.
    let other = ContainerView {
        env: vec![("HOME".into(), "/nonexistent".into())],
        ..plain()
    };
    let elsewhere = read(&root, &other, Some(cache.path()));
    // An entry written before the notes were kept is read again, and
    // replaced.
    let entry = cache
        .path()
        .join(format!("{}.json", first.0.image_key.as_deref().unwrap()));
    std::fs::write(&entry, serde_json::to_vec(&first.0).unwrap()).unwrap();
    let replaced = read(&root, &plain(), Some(cache.path()));
    assert!(
        std::fs::read_to_string(&entry)
            .unwrap()
            .contains("oldest decides")
    );
    for (what, got) in [
        ("first", &first),
        ("again", &again),
        ("elsewhere", &elsewhere),
        ("replaced", &replaced),
    ] {
        assert_eq!(got.1, said, "{what}");
        assert_eq!(got.0.dists, fresh.dists, "{what}");
    }
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
