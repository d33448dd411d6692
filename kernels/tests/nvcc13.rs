//! The inspector on what CUDA 13 really writes, against cuobjdump.
//!
//! tests/fixtures/nvcc13 holds the output of nvcc 13.0.88 (driver 580, on
//! an H100 host) for `probe.cu`: one cubin per target and two fatbins (one
//! compressed) mixing `sm_90a`, `sm_100a`, `sm_100`, `sm_90` and
//! `compute_120` PTX, with what `cuobjdump --list-elf --list-ptx` said of
//! each (`cuobjdump.txt`). nvcc 13 no longer marks `a` targets in e_flags
//! (its `sm_90a` and `sm_90` cubins have the same header), so these files
//! are what holds the inspector to the places it does mark them.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use gpuarch_core::arch::{ComputeCapability, Target};
use gpuarch_kernels::inspect::{self, Placement};

fn fixtures() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/nvcc13"
    ))
}

/// File name to the targets cuobjdump listed for it. cuobjdump names each
/// piece `<stem>[.<n>].<target>.cubin|ptx`, PTX by its SM.
fn cuobjdump() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(fixtures().join("cuobjdump.txt")).unwrap();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut file = String::new();
    for line in text.lines() {
        if let Some(f) = line.strip_prefix("== ") {
            file = f.to_owned();
            out.insert(file.clone(), BTreeSet::new());
        } else if let Some((_, name)) = line.split_once(": ") {
            let mut parts = name.rsplit('.');
            let (kind, target) = (parts.next().unwrap(), parts.next().unwrap());
            let t = match kind {
                "ptx" => target.replace("sm_", "compute_"),
                _ => target.to_owned(),
            };
            out.get_mut(&file).unwrap().insert(t);
        }
    }
    out
}

#[test]
fn every_file_carries_what_cuobjdump_lists() {
    let want = cuobjdump();
    assert!(want.len() >= 14, "cuobjdump.txt lists {} files", want.len());
    for (file, targets) in &want {
        let data = std::fs::read(fixtures().join(file)).unwrap();
        let got: BTreeSet<String> = inspect::inspect(&data)
            .unwrap_or_else(|e| panic!("{file}: {e}"))
            .iter()
            .map(|o| o.target.to_string())
            .collect();
        assert_eq!(&got, targets, "{file}");
    }
}

#[test]
fn arch_specific_code_runs_only_on_its_own_capability() {
    let cap = |s: &str| ComputeCapability::parse_reported(s).unwrap();
    let on = |file: &str, c: &str| {
        let objs = inspect::inspect(&std::fs::read(fixtures().join(file)).unwrap()).unwrap();
        inspect::placement(&objs, cap(c), None)
    };
    // sm_100a is for 10.0 alone; sm_100 (and sm_100f, the same SASS) also
    // runs on 10.3. Read as plain sm_100, the a build would be served to a
    // 10.3 GPU that cannot load it.
    assert_eq!(
        on("sm_100a.cubin", "10.0"),
        Placement::Sass(Target::parse("sm_100a").unwrap())
    );
    assert!(matches!(on("sm_100a.cubin", "10.3"), Placement::No(_)));
    assert!(matches!(on("sm_100f.cubin", "10.3"), Placement::Sass(_)));
    assert!(matches!(on("sm_103a.cubin", "10.0"), Placement::No(_)));
    // The compressed fatbin: its sm_100a entry is skipped on 10.3, where
    // the plain sm_100 entry serves.
    assert_eq!(
        on("mixed-z.fatbin", "10.3"),
        Placement::Sass(Target::parse("sm_100").unwrap())
    );
    assert_eq!(
        on("mixed-z.fatbin", "9.0"),
        Placement::Sass(Target::parse("sm_90a").unwrap())
    );
}
