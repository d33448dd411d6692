#![allow(clippy::unwrap_used)]
//! The `command` backend with a real tool: ptxas from NVIDIA's nvcc wheel
//! assembles PTX for each arch; a failing command and a hanging one.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use gpuarch_core::arch::Target;
use gpuarch_kernels::build::{Builder, Fetch};
use gpuarch_kernels::inspect;
use gpuarch_kernels::spec::Package;
use gpuarch_kernels::store::Store;
use gpuarch_kernels::toolchain::Nvrtc;

fn package(dir: &Path, name: &str, build: &str) -> Package {
    let p = dir.join(name);
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(
        p.join("kernel.yaml"),
        format!(
            "name: {name}\nversion: '1'\nsources: [saxpy.ptx]\nexports: [saxpy]\nbuild:\n{build}\nvariants:\n  - name: fp32\n    dtype: float32\n"
        ),
    )
    .unwrap();
    Package::load(&p).unwrap()
}

fn ptx_package(dir: &Path, cuda: &Path, name: &str, build: &str) -> Package {
    let n = Nvrtc::load(&[cuda.to_owned()]).unwrap();
    let ptx = n
        .compile(
            ("saxpy.cu", include_bytes!("../packages/saxpy/saxpy.cu")),
            &[],
            Target::parse("compute_75").unwrap(),
            &[],
        )
        .unwrap()
        .code;
    std::fs::create_dir_all(dir.join(name)).unwrap();
    std::fs::write(dir.join(name).join("saxpy.ptx"), ptx).unwrap();
    package(dir, name, build)
}

#[test]
fn ptxas_builds_each_arch_in_a_clean_environment() {
    let Some(cuda) = common::cuda_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let pkg = ptx_package(
        tmp.path(),
        &cuda,
        "saxpy-ptxas",
        "  backend: command\n  argv: [sh, -c, 'env | sort > \"$OUT/env.txt\" && exec ptxas -arch=${ARCH} -o ${OUT}/saxpy.cubin ${SRC}/saxpy.ptx']\n  env: {EXTRA: 'for ${ARCH}'}\n",
    );
    let b = Builder::new(
        Store::open(&tmp.path().join("store"), 1 << 30).unwrap(),
        vec![cuda.clone()],
        Duration::from_secs(120),
    );
    for arch in ["sm_75", "sm_86", "sm_90"] {
        let r = b.resolve(&pkg, Target::parse(arch).unwrap(), Fetch::Build);
        let (e, built) = r
            .served
            .unwrap_or_else(|| panic!("{arch}: {:?} {:?}", r.error, r.unavailable));
        assert!(built);
        let cubin = e.dir.join("saxpy.cubin");
        assert_eq!(
            inspect::cubin_target(&std::fs::read(&cubin).unwrap())
                .unwrap()
                .to_string(),
            arch
        );
        assert_eq!(common::cuobjdump_arch(&cuda, &cubin), arch);
        assert!(
            e.manifest.toolkit.contains("ptxas") || e.manifest.toolkit.contains("/sh "),
            "{}",
            e.manifest.toolkit
        );
        let env = std::fs::read_to_string(e.dir.join("env.txt")).unwrap();
        let cap = Target::parse(arch).unwrap().cap.to_string();
        assert!(
            env.contains(&format!("TORCH_CUDA_ARCH_LIST={cap}\n")),
            "{env}"
        );
        assert!(env.contains(&format!("EXTRA=for {arch}\n")), "{env}");
        assert!(
            !env.contains("CARGO"),
            "the test's environment leaked in: {env}"
        );
        let home = env.lines().find_map(|l| l.strip_prefix("HOME=")).unwrap();
        assert!(
            home.starts_with(tmp.path().join("store/tmp").to_str().unwrap()),
            "{home}"
        );
    }
}

#[test]
fn a_failing_command_is_recorded_and_a_hanging_one_is_killed() {
    let Some(cuda) = common::cuda_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let b = Builder::new(
        Store::open(&tmp.path().join("store"), 1 << 30).unwrap(),
        vec![cuda.clone()],
        Duration::from_secs(120),
    );
    let sm86 = Target::parse("sm_86").unwrap();
    let bad = ptx_package(
        tmp.path(),
        &cuda,
        "bad",
        "  backend: command\n  argv: [sh, -c, 'echo ptxas fatal: no such option >&2; exit 3']\n",
    );
    let r = b.resolve(&bad, sm86, Fetch::Build);
    assert!(r.served.is_none() && r.error.is_none(), "{r:?}");
    assert_eq!(r.unavailable[0].variant, "fp32");
    assert!(
        r.unavailable[0].reason.contains("exit status: 3")
            && r.unavailable[0]
                .reason
                .contains("ptxas fatal: no such option"),
        "{}",
        r.unavailable[0].reason
    );
    // Recorded: asking again does not run it again.
    let t = Instant::now();
    assert_eq!(
        b.resolve(&bad, sm86, Fetch::Build).unavailable,
        r.unavailable
    );
    assert!(t.elapsed() < Duration::from_millis(500));

    let slow = ptx_package(
        tmp.path(),
        &cuda,
        "slow",
        "  backend: command\n  argv: [sh, -c, 'sleep 30 & sleep 30']\n  timeout_s: 1\n",
    );
    let t = Instant::now();
    let r = b.resolve(&slow, sm86, Fetch::Build);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let e = r.error.unwrap();
    assert!(e.contains("ran past its 1 s limit"), "{e}");
    // Not recorded as a refusal: a later request tries again.
    assert!(r.unavailable.is_empty());
    assert!(
        std::fs::read_dir(tmp.path().join("store/failures"))
            .unwrap()
            .count()
            == 1
    );
}

/// A build script among the package's sources runs from the file opened
/// and checked, through its descriptor: its interpreter reads it by that
/// name.
#[test]
fn a_build_script_runs_from_the_file_that_was_checked() {
    use std::os::unix::fs::PermissionsExt;
    let Some(cuda) = common::cuda_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("scripted");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("build.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"ran as $0 with $1\" > \"$OUT/how.txt\"\nexec ptxas -arch=$ARCH -o $OUT/saxpy.cubin $SRC/saxpy.ptx\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    ptx_package(tmp.path(), &cuda, "scripted", "  backend: nvrtc\n");
    std::fs::write(
        dir.join("kernel.yaml"),
        "name: scripted\nversion: '1'\nsources: [saxpy.ptx, build.sh]\nexports: [saxpy]\n\
         build:\n  backend: command\n  argv: [./build.sh, first]\n\
         variants:\n  - name: fp32\n    dtype: float32\n",
    )
    .unwrap();
    let pkg = Package::load(&dir).unwrap();
    let b = Builder::new(
        Store::open(&tmp.path().join("store"), 1 << 30).unwrap(),
        vec![cuda.clone()],
        Duration::from_secs(120),
    );
    let r = b.resolve(&pkg, Target::parse("sm_86").unwrap(), Fetch::Build);
    let (e, _) = r
        .served
        .unwrap_or_else(|| panic!("{:?} {:?}", r.error, r.unavailable));
    let how = std::fs::read_to_string(e.dir.join("how.txt")).unwrap();
    assert!(
        how.starts_with("ran as /proc/self/fd/") && how.ends_with(" with first\n"),
        "{how}"
    );
}
