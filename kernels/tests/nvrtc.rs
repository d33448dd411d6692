#![allow(clippy::unwrap_used)]
//! Real NVRTC builds of the sample packages, checked from the cubins' ELF
//! headers and cross-checked with NVIDIA's cuobjdump.

mod common;

use std::time::Duration;

use gpuarch_core::arch::Target;
use gpuarch_kernels::build::Builder;
use gpuarch_kernels::inspect;
use gpuarch_kernels::spec;
use gpuarch_kernels::store::Store;

const ARCHS: [&str; 5] = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90"];

#[test]
fn sample_packages_build_for_five_archs_and_carry_what_they_claim() {
    let Some(cuda) = common::cuda_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path(), 1 << 30).unwrap();
    let b = Builder::new(store, vec![cuda.clone()], Duration::from_secs(600));
    let (pkgs, errors) = spec::discover(&[common::packages_dir()]);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        pkgs.keys().map(String::as_str).collect::<Vec<_>>(),
        ["rmsnorm", "rotary", "saxpy"]
    );
    for arch in ARCHS {
        let t = Target::parse(arch).unwrap();
        for p in pkgs.values() {
            let r = b.resolve(p, t, true);
            let (entry, built) = r.served.unwrap_or_else(|| {
                panic!("{} {arch}: {:?} {:?}", p.name(), r.error, r.unavailable)
            });
            assert!(built, "{} {arch} came from an empty store", p.name());
            let cubin = entry.dir.join(format!("{}.cubin", p.name()));
            let data = std::fs::read(&cubin).unwrap();
            assert_eq!(inspect::cubin_target(&data).unwrap().to_string(), arch);
            assert_eq!(
                common::cuobjdump_arch(&cuda, &cubin),
                arch,
                "{}",
                cubin.display()
            );
            assert_eq!(entry.manifest.arch, arch);
            assert!(
                entry.manifest.toolkit.starts_with("nvrtc 12."),
                "{:?}",
                entry.manifest
            );
            let want_variant = match (p.name(), arch) {
                ("saxpy", _) => "fp32",
                (_, "sm_75") => "fp16",
                _ => "bf16",
            };
            assert_eq!(entry.manifest.variant, want_variant, "{} {arch}", p.name());
            if p.name() == "saxpy" {
                let ptx = std::fs::read(entry.dir.join("saxpy.ptx")).unwrap();
                let o = inspect::inspect(&ptx).unwrap();
                assert_eq!(o[0].target, Target::ptx(t.cap));
                assert_eq!(o[0].functions, ["saxpy"]);
            }
            // Asking again builds nothing.
            let again = b.resolve(p, t, true);
            assert!(!again.served.unwrap().1, "{} {arch} rebuilt", p.name());
        }
    }
    // The fallbacks on Turing, each with its reason.
    let sm75 = Target::parse("sm_75").unwrap();
    let r = b.resolve(&pkgs["rmsnorm"], sm75, false);
    assert_eq!(r.unavailable.len(), 1, "{:?}", r.unavailable);
    assert_eq!(r.unavailable[0].variant, "bf16");
    assert!(
        r.unavailable[0].reason.contains("requires .target sm_80"),
        "the compiler's message: {}",
        r.unavailable[0].reason
    );
    let r = b.resolve(&pkgs["rotary"], sm75, false);
    assert_eq!(r.unavailable[0].variant, "bf16");
    assert!(
        r.unavailable[0].reason.contains("is for capability >=8.0"),
        "{}",
        r.unavailable[0].reason
    );
}
