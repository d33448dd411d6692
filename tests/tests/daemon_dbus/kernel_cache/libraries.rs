//! Imported libraries: each container served by the code its GPUs run; a
//! consumer's wheel imported through the bus and laid out per GPU set.

use super::*;

#[test]
fn imported_libraries_serve_each_container_by_the_code_they_carry() {
    need_bus!("gcc", "objcopy");
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    let nvrtc = gpuarch_kernels::toolchain::Nvrtc::load(std::slice::from_ref(&cuda)).unwrap();
    let src = std::fs::read(workspace_root().join("kernels/packages/saxpy/saxpy.cu")).unwrap();
    let code = |t: &str| {
        let t = gpuarch_core::arch::Target::parse(t).unwrap();
        nvrtc.compile(("saxpy.cu", &src), &[], t, &[]).unwrap().code
    };
    let (sm75, sm86, sm80, sm90) = (code("sm_75"), code("sm_86"), code("sm_80"), code("sm_90"));
    let fatbin = gpuarch_kernels::inspect::write_fatbin;
    let libs = tempfile::tempdir().unwrap();
    // nobody opens them too (and is refused by the bus, not the file).
    std::fs::set_permissions(
        libs.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let lib = |name: &str, entries: &[(u16, u32, &[u8])]| {
        gpuarch_tests::fatlib::shared_library_with(libs.path(), name, &fatbin(entries))
    };
    let both = lib("libsaxpy.so", &[(2, 75, &sm75), (2, 86, &sm86)]);
    let only80 = lib("libsaxpy80.so", &[(2, 80, &sm80)]);
    let only90 = lib("libsaxpy90.so", &[(2, 90, &sm90)]);
    let plain = gpuarch_tests::fatlib::shared_library_with(libs.path(), "libplain.so", &[]);

    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let import = |args: &[&str]| {
        let mut a = vec!["kernels", "import"];
        a.extend_from_slice(args);
        let o = node.ctl(None, &a);
        (o.status.code(), all_text(&o))
    };
    let s = |p: &Path| p.to_str().unwrap().to_owned();

    // One library with sm_75 and sm_86 SASS: each GPU gets its own code.
    let (code, out) = import(&["saxpy", &s(&both)]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("libsaxpy.so: carries sm_75, sm_86"), "{out}");
    assert!(out.contains("GPU 0 (7.5): runs from SASS sm_75"), "{out}");
    assert!(out.contains("GPU 1 (8.6): runs from SASS sm_86"), "{out}");
    let (cfg, log) = precreate(&node, "0,1");
    let view = view_manifest(&cfg, "saxpy").unwrap_or_else(|| panic!("not mounted: {log}"));
    assert_eq!(
        served(&view),
        [
            "sm_75 libsaxpy.so/libsaxpy.so",
            "sm_86 libsaxpy.so/libsaxpy.so"
        ]
    );
    // The file in the container is the imported one, byte for byte.
    let source = cfg["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["destination"] == "/opt/gpuarch/kernels")
        .unwrap()["source"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        std::fs::read(Path::new(&source).join("saxpy/libsaxpy.so/libsaxpy.so")).unwrap(),
        std::fs::read(&both).unwrap()
    );
    // Nothing is asked of gpuarchd's builder for an import.
    assert!(
        std::fs::read_dir(node.path("spool")).map_or(true, |mut d| d.next().is_none()),
        "an import was requested as a build"
    );

    // sm_80 only, for the loader: the 3090 runs it, the 2080 Ti does not.
    let (code, out) = import(&["saxpy80", &s(&only80), "--ldconfig"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("GPU 0 (7.5): will not run"), "{out}");
    assert!(out.contains("GPU 1 (8.6): runs from SASS sm_80"), "{out}");
    assert!(!out.contains("warning"), "{out}");
    let (cfg, log) = precreate(&node, "1");
    let view = view_manifest(&cfg, "saxpy80").unwrap_or_else(|| panic!("not mounted: {log}"));
    assert_eq!(served(&view), ["sm_80 libsaxpy80.so/libsaxpy80.so"]);
    assert_eq!(view["libraries"], serde_json::json!(["libsaxpy80.so"]));
    // The loader cache needs the createContainer stage: it is added.
    let hooks = cfg["hooks"]["createContainer"].to_string();
    assert!(hooks.contains("gpuarch-hook"), "{hooks}");
    for visible in ["0", "0,1"] {
        let (cfg, log) = precreate(&node, visible);
        assert!(view_manifest(&cfg, "saxpy80").is_none(), "{visible}: {cfg}");
        assert!(
            log.contains("kernel package saxpy80 not mounted: no imported file runs on all of"),
            "{visible}: {log}"
        );
    }

    // Code for no GPU of this host: accepted, with a warning.
    let (code, out) = import(&["saxpy90", &s(&only90)]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("warning: it runs on none of this host's GPUs"),
        "{out}"
    );
    assert!(node.log().contains("runs on none of this host's GPUs"));

    // A failed import changes nothing: the earlier one is still served.
    let before = std::fs::read(node.path("kernels/saxpy/manifest.json")).unwrap();
    let (code, out) = import(&["saxpy", &s(&plain), &s(&both)]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("saxpy not imported, nothing changed: libplain.so: it carries no GPU code"),
        "{out}"
    );
    assert_eq!(
        std::fs::read(node.path("kernels/saxpy/manifest.json")).unwrap(),
        before
    );
    let (cfg, _) = precreate(&node, "0");
    assert_eq!(
        served(&view_manifest(&cfg, "saxpy").unwrap()),
        ["sm_75 libsaxpy.so/libsaxpy.so"]
    );

    // Without kernels.remote there is nothing to push to or pull from.
    for args in [&["kernels", "push"][..], &["kernels", "pull"]] {
        let o = node.ctl(None, args);
        assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
        assert!(
            all_text(&o).contains("no registry: kernels.remote is not set"),
            "{}",
            all_text(&o)
        );
    }

    // Only root and group gpuarch import; a file name can't be passed twice.
    let o = node.ctl(Some(&[]), &["kernels", "import", "x", &s(&both)]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("permission denied by the bus policy"),
        "{}",
        all_text(&o)
    );
    let (code, out) = import(&["x", &s(&both), &s(&both)]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("given twice"), "{out}");

    // Unimport: new containers no longer get it, its file is unpinned and
    // stays in the cache for the LRU; the other imports are untouched.
    let o = node.ctl(Some(&[]), &["kernels", "unimport", "saxpy80"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("permission denied by the bus policy"),
        "{}",
        all_text(&o)
    );
    let o = node.ctl(None, &["kernels", "unimport", "saxpy80"]);
    assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("removed import saxpy80: 1 file(s) unpinned"),
        "{}",
        all_text(&o)
    );
    assert!(!node.path("kernels/saxpy80").exists());
    let (cfg, log) = precreate(&node, "1");
    assert!(view_manifest(&cfg, "saxpy80").is_none(), "{log}");
    assert!(view_manifest(&cfg, "saxpy").is_some(), "{log}");
    let listed: serde_json::Value =
        serde_json::from_slice(&node.ctl(None, &["--json", "kernels"]).stdout).unwrap();
    let pinned = |pkg: &str| -> Vec<bool> {
        listed["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["package"] == pkg)
            .map(|k| k["pinned"].as_bool().unwrap())
            .collect()
    };
    assert_eq!(pinned("saxpy80"), [false], "{listed}");
    assert_eq!(pinned("saxpy"), [true], "{listed}");
    let o = node.ctl(None, &["kernels", "unimport", "saxpy80"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("no import named saxpy80 (imports: saxpy, saxpy90)"),
        "{}",
        all_text(&o)
    );
    node.stop();
}

/// `ImportLibrary` through the bus, as `gpuarchctl kernels import-wheel`:
/// the real flashinfer-cubin wheel imported, and a tree laid out for every
/// set of the host's GPUs a container could be given; refused to nobody,
/// and for what is not a wheel, changing nothing.
#[test]
fn a_consumers_wheel_is_imported_through_the_bus_and_laid_out_for_every_set_of_gpus() {
    need_bus!();
    let Some(wheel) = std::env::var_os("GPUARCH_FLASHINFER_CUBIN_WHEEL") else {
        gpuarch_tests::skip(
            "GPUARCH_FLASHINFER_CUBIN_WHEEL names no wheel (scripts/test downloads it)",
        );
        return;
    };
    let wheel = std::path::PathBuf::from(wheel);
    let mut node = Node::new("blackwell-mix", Policy::Shipped);
    node.start(&[]);
    let libs = node.path("cache/libraries/flashinfer-cubin");

    // Nobody: refused by the bus policy, before gpuarchd reads anything.
    let o = node.ctl(
        Some(&[]),
        &["kernels", "import-wheel", wheel.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("permission denied by the bus policy"),
        "{}",
        all_text(&o)
    );

    // Not a wheel, and not a file: refused, nothing made.
    let junk = node.path("junk.whl");
    std::fs::write(&junk, b"not a zip").unwrap();
    let o = node.ctl(None, &["kernels", "import-wheel", junk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("junk.whl not imported, nothing changed: junk.whl: not a wheel"),
        "{}",
        all_text(&o)
    );
    let o = node.ctl(None, &["kernels", "import-wheel", "/dev/null"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("null: neither a wheel nor a directory"),
        "{}",
        all_text(&o)
    );
    // A directory that holds no installed copy.
    let o = node.ctl(
        None,
        &["kernels", "import-wheel", node.path("").to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("no .dist-info of a library gpuarch imports"),
        "{}",
        all_text(&o)
    );
    assert!(!libs.exists());

    // The wheel: 7.0, 10.3, 11.0 and 12.1 on this host, 15 sets.
    let o = node.ctl(None, &["kernels", "import-wheel", wheel.to_str().unwrap()]);
    let out = all_text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("imported flashinfer-cubin 0.6.13: 16011 files"),
        "{out}"
    );
    assert!(out.contains("10.3: 15658 kernels"), "{out}");
    assert!(out.contains("12.1: no kernels for it"), "{out}");
    assert!(out.contains("7.0+10.3+11.0+12.1: "), "{out}");
    let serve = libs.join("0.6.13/serve");
    let trees = std::fs::read_dir(&serve)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_dir())
        .count();
    assert_eq!(trees, 15, "{out}");
    let served: gpuarch_wire::library::Served =
        serde_json::from_slice(&std::fs::read(serve.join("10.3.json")).unwrap()).unwrap();
    assert!(
        served.complete() && served.code_files == 15658,
        "{served:?}"
    );

    // Each tree is exactly the code that runs on its set, by the targets
    // the inspector read from every file, with the library's metadata.
    let index: gpuarch_kernels::library::Index =
        serde_json::from_slice(&std::fs::read(libs.join("0.6.13/index.json")).unwrap()).unwrap();
    assert!(index.files.len() > 16_000, "{}", index.files.len());
    assert!(
        index
            .files
            .iter()
            .filter(|(k, _)| k.ends_with(".cubin"))
            .all(|(_, f)| !f.targets.is_empty()),
        "every cubin is read by the inspector"
    );
    let runs = |t: &str, c: gpuarch_core::arch::ComputeCapability| {
        gpuarch_core::arch::Target::parse(t)
            .unwrap()
            .check(c, None, None)
            .runs
    };
    for e in std::fs::read_dir(&serve).unwrap().flatten() {
        if !e.file_type().unwrap().is_dir() {
            continue;
        }
        let set = e.file_name().to_string_lossy().into_owned();
        let caps: Vec<_> = set
            .split('+')
            .map(|c| gpuarch_core::arch::ComputeCapability::parse_known(c).unwrap())
            .collect();
        let served: gpuarch_wire::library::Served =
            serde_json::from_slice(&std::fs::read(serve.join(format!("{set}.json"))).unwrap())
                .unwrap();
        let mut held = 0;
        for (k, f) in &index.files {
            let wanted =
                f.targets.is_empty() || f.targets.iter().any(|t| caps.iter().any(|c| runs(t, *c)));
            assert_eq!(e.path().join(k).is_file(), wanted, "{set}: {k}");
            held += usize::from(wanted);
        }
        assert_eq!(served.files as usize, held, "{set}");
        assert!(served.complete(), "{set}: {:?}", served.missing);
        // 0.6.13's lists name CuTe DSL modules the wheel lacks, each in a
        // directory of its own arch with no code: fetched into a tmpfs.
        // (Blackwell's 10.x and Thor's 11.0 have such modules listed.)
        let fetch: Vec<String> = caps
            .iter()
            .filter(|c| matches!(c.major, 10 | 11))
            .map(|c| {
                format!(
                    "801e770219613fbf088bc074c414732b26cc550d/fmha/cute-dsl/x86_64/sm_{}a",
                    c.digits()
                )
            })
            .collect();
        assert_eq!(served.fetch_dirs, fetch, "{set}");
        let named = |tag: &str| {
            index
                .files
                .keys()
                .filter(|k| k.contains(tag) && e.path().join(k).is_file())
                .count()
        };
        // No 10.0 here: a B300 set has its own Sm103a cubins and no B200's.
        if set.contains("10.3") {
            assert!(named("Sm103a") > 0 && named("Sm100a") == 0, "{set}");
        } else {
            assert_eq!(served.code_files, 0, "{set}");
        }
    }
}
