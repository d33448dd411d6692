#![allow(clippy::unwrap_used)]
//! Real NVRTC builds of the sample packages, checked from the cubins' ELF
//! headers and cross-checked with NVIDIA's cuobjdump.

mod common;

use std::time::Duration;

use gpuarch_core::arch::Target;
use gpuarch_kernels::build::{Builder, Fetch};
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
            let r = b.resolve(p, t, Fetch::Build);
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
            let again = b.resolve(p, t, Fetch::Build);
            assert!(!again.served.unwrap().1, "{} {arch} rebuilt", p.name());
        }
    }
    // The fallbacks on Turing, each with its reason.
    let sm75 = Target::parse("sm_75").unwrap();
    let r = b.resolve(&pkgs["rmsnorm"], sm75, Fetch::Stored);
    assert_eq!(r.unavailable.len(), 1, "{:?}", r.unavailable);
    assert_eq!(r.unavailable[0].variant, "bf16");
    assert!(
        r.unavailable[0].reason.contains("requires .target sm_80"),
        "the compiler's message: {}",
        r.unavailable[0].reason
    );
    let r = b.resolve(&pkgs["rotary"], sm75, Fetch::Stored);
    assert_eq!(r.unavailable[0].variant, "bf16");
    assert!(
        r.unavailable[0].reason.contains("is for capability >=8.0"),
        "{}",
        r.unavailable[0].reason
    );
}

const MDWE_CHILD: &str = "GPUARCH_TEST_MDWE_CHILD";

/// gpuarchd.service sets MemoryDenyWriteExecute=yes. The kernel's own form
/// of it (prctl PR_SET_MDWE, Linux 6.3+, kept across execve) is set on a
/// child running NVRTC: a writable and executable mapping is refused there
/// (the control), and the build still succeeds, so NVRTC does not need one.
#[test]
fn nvrtc_builds_under_memory_deny_write_execute() {
    use std::os::unix::process::CommandExt;
    let Some(_) = common::cuda_dir() else {
        return;
    };
    if std::env::var_os(MDWE_CHILD).is_some() {
        return; // the child runs mdwe_child instead
    }
    const PR_SET_MDWE: i32 = 65;
    const PR_MDWE_REFUSE_EXEC_GAIN: u64 = 1;
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "mdwe_child", "--nocapture"])
        .env(MDWE_CHILD, "1");
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            if nix::libc::prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = match cmd.output() {
        Ok(o) => o,
        Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
            gpuarch_testkit::skip("this kernel has no PR_SET_MDWE (Linux 6.3+)");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("mdwe: W+X refused; saxpy sm_86 built"),
        "{out}"
    );
}

#[test]
fn mdwe_child() {
    if std::env::var_os(MDWE_CHILD).is_none() {
        return;
    }
    // The control: with MDWE in force a W+X anonymous mapping fails.
    // SAFETY: a fresh anonymous mapping, unmapped if it was made.
    let p = unsafe {
        nix::libc::mmap(
            std::ptr::null_mut(),
            4096,
            nix::libc::PROT_READ | nix::libc::PROT_WRITE | nix::libc::PROT_EXEC,
            nix::libc::MAP_PRIVATE | nix::libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_eq!(p, nix::libc::MAP_FAILED, "MDWE is not in force");
    let cuda = common::cuda_dir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path(), 1 << 30).unwrap();
    let b = Builder::new(store, vec![cuda], Duration::from_secs(600));
    let (pkgs, _) = spec::discover(&[common::packages_dir()]);
    let r = b.resolve(
        &pkgs["saxpy"],
        Target::parse("sm_86").unwrap(),
        Fetch::Build,
    );
    let (_, built) = r.served.unwrap_or_else(|| panic!("{:?}", r.error));
    assert!(built);
    println!("mdwe: W+X refused; saxpy sm_86 built");
}
