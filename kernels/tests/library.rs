//! FlashInfer's own `flashinfer-cubin` wheel, imported whole and served per
//! set of GPUs. The wheel (458 MB, 16,017 files) comes from PyPI:
//! scripts/test downloads it and names it in GPUARCH_FLASHINFER_CUBIN_WHEEL.
#![allow(clippy::unwrap_used)]

use gpuarch_core::arch::ComputeCapability;
use gpuarch_kernels::library::{self, Limits};

fn cap(s: &str) -> ComputeCapability {
    ComputeCapability::parse_known(s).unwrap()
}

#[test]
fn flashinfers_own_wheel_is_served_per_architecture() {
    let Some(wheel) = std::env::var_os("GPUARCH_FLASHINFER_CUBIN_WHEEL") else {
        gpuarch_testkit::skip(
            "GPUARCH_FLASHINFER_CUBIN_WHEEL names no flashinfer-cubin wheel (scripts/test downloads 0.6.13)",
        );
        return;
    };
    let wheel = std::path::PathBuf::from(wheel);
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("libraries");
    let start = std::time::Instant::now();
    let f = std::fs::File::open(&wheel).unwrap();
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    let index = library::import_wheel(
        &root,
        &f,
        &library::Source::file(&name),
        &Limits::for_store(8 << 30),
    )
    .unwrap();
    eprintln!(
        "imported {} {}: {} files, {} bytes, {} missing, in {:.1} s",
        index.dist,
        index.version,
        index.files.len(),
        index.bytes(),
        index.missing.len(),
        start.elapsed().as_secs_f64()
    );
    assert_eq!(index.dist, "flashinfer-cubin");
    let cubins = index.files.keys().filter(|k| k.ends_with(".cubin")).count();
    assert!(cubins > 15_000, "{cubins} cubins");
    assert!(
        index
            .files
            .iter()
            .filter(|(k, _)| k.ends_with(".cubin"))
            .all(|(_, f)| !f.targets.is_empty()),
        "every cubin is read by the inspector"
    );

    let runs = |t: &str, c: ComputeCapability| {
        gpuarch_core::arch::Target::parse(t)
            .unwrap()
            .check(c, None, None)
            .runs
    };
    for set in [
        &["9.0"][..],
        &["10.0"],
        &["10.3"],
        &["12.0"],
        &["10.0", "10.3"],
    ] {
        let caps: Vec<_> = set.iter().map(|s| cap(s)).collect();
        let start = std::time::Instant::now();
        let (dir, served) = library::serve(&root, &index.dist, &index.version, &caps).unwrap();
        eprintln!(
            "{}: {} files ({} GPU code), {} bytes, complete: {} ({} missing), made in {:.2} s",
            library::set_name(&caps),
            served.files,
            served.code_files,
            served.bytes,
            served.complete(),
            served.missing_count,
            start.elapsed().as_secs_f64()
        );
        // What the tree holds is exactly the code that runs on the set,
        // with the library's metadata.
        let expect: Vec<&String> = index
            .files
            .iter()
            .filter(|(_, f)| {
                f.targets.is_empty() || f.targets.iter().any(|t| caps.iter().any(|c| runs(t, *c)))
            })
            .map(|(k, _)| k)
            .collect();
        assert_eq!(served.files as usize, expect.len());
        for k in &expect {
            assert!(dir.join(k).is_file(), "{k} not in the tree for {set:?}");
        }
        for (k, f) in &index.files {
            if !f.targets.is_empty() && !f.targets.iter().any(|t| caps.iter().any(|c| runs(t, *c)))
            {
                assert!(!dir.join(k).exists(), "{k} is in the tree for {set:?}");
            }
        }
        // 0.6.13's lists name CuTe DSL modules the wheel lacks, each
        // in a directory of its own arch with no code: fetched into a tmpfs.
        assert!(served.complete(), "{set:?}: {:?}", served.missing);
        let fetch: Vec<String> = caps
            .iter()
            .filter(|c| c.major == 10)
            .map(|c| {
                format!(
                    "801e770219613fbf088bc074c414732b26cc550d/fmha/cute-dsl/x86_64/sm_{}a",
                    c.digits()
                )
            })
            .collect();
        assert_eq!(served.fetch_dirs, fetch, "{set:?}");
        let named = |tag: &str| expect.iter().filter(|k| k.contains(tag)).count();
        match set {
            ["9.0"] | ["12.0"] => assert_eq!(served.code_files, 0, "{set:?}"),
            ["10.0"] => assert!(named("Sm100a") > 0 && named("Sm103a") == 0),
            ["10.3"] => assert!(named("Sm103a") > 0 && named("Sm100a") == 0),
            _ => assert!(named("Sm103a") > 0 && named("Sm100a") > 0),
        }
    }
}
