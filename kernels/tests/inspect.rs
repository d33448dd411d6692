#![allow(clippy::unwrap_used)]
//! The inspector on binaries made here: cubins from NVRTC, fatbins holding
//! them, and a shared library carrying a fatbin in `.nv_fatbin`, each
//! cross-checked with NVIDIA's cuobjdump.

mod common;
#[path = "../../tests/src/fatlib.rs"]
mod fatlib;

use std::path::Path;

use gpuarch_core::arch::{ComputeCapability, CudaVersion, Target};
use gpuarch_kernels::inspect::{self, Placement};
use gpuarch_kernels::toolchain::Nvrtc;

const SAXPY: &[u8] = include_bytes!("../packages/saxpy/saxpy.cu");

fn compile(n: &Nvrtc, target: &str) -> Vec<u8> {
    let c = n
        .compile(
            ("saxpy.cu", SAXPY),
            &[],
            Target::parse(target).unwrap(),
            &[],
        )
        .unwrap();
    c.code
}

fn cc(s: &str) -> ComputeCapability {
    ComputeCapability::parse_known(s).unwrap()
}

#[test]
fn fatbins_and_libraries_report_what_cuobjdump_reports() {
    let Some(cuda) = common::cuda_dir() else {
        return;
    };
    let n = Nvrtc::load(std::slice::from_ref(&cuda)).unwrap();
    let sm75 = compile(&n, "sm_75");
    let sm86 = compile(&n, "sm_86");
    let ptx80 = compile(&n, "compute_80");
    let tmp = tempfile::tempdir().unwrap();

    // A fatbin with sm_75 and sm_86 SASS, as cuobjdump sees it.
    let two = common::fatbin(&[(2, 75, &sm75), (2, 86, &sm86)]);
    let path = tmp.path().join("two.fatbin");
    std::fs::write(&path, &two).unwrap();
    let listed = common::cuobjdump(&cuda, &["-lelf"], &path);
    assert!(
        listed.contains("two.1.sm_75.cubin") && listed.contains("two.2.sm_86.cubin"),
        "{listed}"
    );
    let objs = inspect::inspect(&two).unwrap();
    let names: Vec<String> = objs.iter().map(|o| o.target.to_string()).collect();
    assert_eq!(names, ["sm_75", "sm_86"]);
    // Plus compute_80 PTX. (cuobjdump 13.5 refuses the PTX entry header
    // this test writes, so this entry is checked by our reader alone.)
    let fb = common::fatbin(&[(2, 75, &sm75), (2, 86, &sm86), (1, 80, &ptx80)]);
    let objs = inspect::inspect(&fb).unwrap();
    let names: Vec<String> = objs.iter().map(|o| o.target.to_string()).collect();
    assert_eq!(names, ["sm_75", "sm_86", "compute_80"]);
    assert!(objs.iter().all(|o| o.verified && o.functions == ["saxpy"]));
    let driver = Some(CudaVersion::new(12, 9));
    assert_eq!(
        inspect::placement(&objs, cc("8.9"), driver),
        Placement::Sass(Target::parse("sm_86").unwrap())
    );
    assert_eq!(
        inspect::placement(&objs, cc("9.0"), driver),
        Placement::Jit(Target::parse("compute_80").unwrap())
    );

    // Only sm_75 SASS: an 8.6 GPU runs none of it, and says why.
    let only75 = common::fatbin(&[(2, 75, &sm75)]);
    let p75 = tmp.path().join("sm75.fatbin");
    std::fs::write(&p75, &only75).unwrap();
    assert!(common::cuobjdump(&cuda, &["-lelf"], &p75).contains("sm_75.cubin"));
    let objs = inspect::inspect(&only75).unwrap();
    match inspect::placement(&objs, cc("8.6"), driver) {
        Placement::No(why) => assert!(
            why.contains("carries only sm_75") && why.contains("same major"),
            "{why}"
        ),
        other => panic!("sm_75-only code placed on 8.6: {other:?}"),
    }
    assert!(matches!(
        inspect::placement(&objs, cc("7.5"), driver),
        Placement::Sass(_)
    ));

    // The two-SASS fatbin inside a shared library's .nv_fatbin section.
    let lib = shared_library_with(tmp.path(), &two);
    let listed = common::cuobjdump(&cuda, &["-lelf"], &lib);
    assert!(
        listed.contains("sm_75") && listed.contains("sm_86"),
        "{listed}"
    );
    let objs = inspect::inspect(&std::fs::read(&lib).unwrap()).unwrap();
    let names: Vec<String> = objs.iter().map(|o| o.target.to_string()).collect();
    assert_eq!(names, ["sm_75", "sm_86"]);
    assert!(objs[0].origin.contains(".nv_fatbin"), "{}", objs[0].origin);

    // A library without GPU code is no GPU code, not an error.
    let plain = shared_library_with(tmp.path(), &[]);
    assert!(
        inspect::inspect(&std::fs::read(plain).unwrap())
            .unwrap()
            .is_empty()
    );
}

/// A library that keeps fatbins in its own data (cuFFT 12 keeps 24,000
/// in `.ldata` and registers them itself): the inspector reads them,
/// where cuobjdump lists only `.nv_fatbin`; a stray magic number among
/// the data is passed over, not an error.
#[test]
fn fatbins_a_library_keeps_in_its_data_are_read() {
    let Some(cuda) = common::cuda_dir() else {
        return;
    };
    let n = Nvrtc::load(std::slice::from_ref(&cuda)).unwrap();
    let sm75 = compile(&n, "sm_75");
    let sm90 = compile(&n, "sm_90");
    let tmp = tempfile::tempdir().unwrap();
    let mut data = b"data before".to_vec();
    data.extend(0xBA55_ED50u32.to_le_bytes());
    data.extend(b"\x01\x00\x10\x00not a container, a magic number by chance");
    data.extend(common::fatbin(&[(2, 90, &sm90)]));
    data.extend(b"data after");
    let first = fatlib::shared_library_with(
        tmp.path(),
        "libfirst.so",
        &common::fatbin(&[(2, 75, &sm75)]),
    );
    let lib = tmp.path().join("libcufft-like.so");
    std::fs::copy(&first, &lib).unwrap();
    let ldata = tmp.path().join("ldata.bin");
    std::fs::write(&ldata, &data).unwrap();
    let ok = std::process::Command::new("objcopy")
        .arg(format!("--add-section=.ldata={}", ldata.display()))
        .args(["--set-section-flags", ".ldata=alloc,readonly"])
        .arg(&lib)
        .status()
        .unwrap();
    assert!(ok.success());
    let listed = common::cuobjdump(&cuda, &["-lelf"], &lib);
    assert!(
        listed.contains("sm_75") && !listed.contains("sm_90"),
        "{listed}"
    );
    let objs = inspect::inspect(&std::fs::read(&lib).unwrap()).unwrap();
    let found: Vec<(String, &str)> = objs
        .iter()
        .map(|o| (o.target.to_string(), o.origin.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("sm_75".to_owned(), ".nv_fatbin container 1 entry 1"),
            ("sm_90".to_owned(), ".ldata container 1 entry 1"),
        ]
    );
    assert_eq!(objs[1].functions, ["saxpy"]);
    assert!(matches!(
        inspect::placement(&objs, cc("9.0"), None),
        Placement::Sass(_)
    ));
}

/// `libprobe.so` (`libplain.so` without GPU code): see tests/src/fatlib.rs.
fn shared_library_with(dir: &Path, fatbin: &[u8]) -> std::path::PathBuf {
    let name = if fatbin.is_empty() {
        "libplain.so"
    } else {
        "libprobe.so"
    };
    fatlib::shared_library_with(dir, name, fatbin)
}
