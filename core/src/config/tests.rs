//! The config file, parsed whole: defaults, every section, and the
//! errors a user sees.

use super::*;
use crate::env::EnvVar;

#[test]
fn defaults_and_a_full_file() {
    assert_eq!(Config::from_yaml("").unwrap(), Config::default());
    assert_eq!(Config::from_yaml("# nothing\n").unwrap(), Config::default());
    let c = Config::from_yaml("strict: true\nenv:\n  override: true\n  disable: [GPUARCH_FP8]\n")
        .unwrap();
    assert!(c.strict && c.env.override_existing);
    assert_eq!(c.env.disable, [EnvVar::Fp8].into());
    let c = Config::from_yaml(
        "hook: {timeout_ms: 250}\nruntime: {path: /usr/bin/crun}\nkernels: {mount_root: /srv/k}\n",
    )
    .unwrap();
    assert_eq!(c.hook.timeout_ms, 250);
    assert_eq!(
        c.runtime.path.as_deref(),
        Some(std::path::Path::new("/usr/bin/crun"))
    );
    assert_eq!(c.kernels.mount_root, PathBuf::from("/srv/k"));
    let c = Config::from_yaml("daemon: {refresh_interval_s: 5, nvml_timeout_ms: 250}\n").unwrap();
    assert_eq!(c.daemon.refresh_interval_s, 5);
    assert_eq!(c.daemon.nvml_timeout_ms, 250);
    assert_eq!(Config::default().daemon.refresh_interval_s, 60);
    let c = Config::from_yaml(
        "kernels: {workers: 4, prewarm: false, max_bytes: 1048576, cuda_dirs: [/opt/cuda]}\n",
    )
    .unwrap();
    assert_eq!((c.kernels.workers, c.kernels.prewarm), (4, false));
    assert_eq!(c.kernels.max_bytes, 1 << 20);
    assert_eq!(c.kernels.cuda_dirs, [PathBuf::from("/opt/cuda")]);
    let e = Config::from_yaml("kernels: {workers: 0}\n").unwrap_err();
    assert!(e.to_string().contains("workers 0 is out of range"), "{e}");
    let e = Config::from_yaml("kernels: {package_dirs: [pkgs]}\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("kernels.package_dirs must be absolute"),
        "{e}"
    );
}

#[test]
fn jit_caches_are_off_until_enabled_and_scopes_are_named() {
    let c = Config::default().jit_cache;
    assert!(!c.enable);
    assert_eq!(
        (c.scope, c.dir.to_str()),
        (JitScope::Image, Some(DEFAULT_JIT_DIR))
    );
    let c = Config::from_yaml("jit_cache: {enable: true, scope: namespace, dir: /srv/jit}\n")
        .unwrap()
        .jit_cache;
    assert!(c.enable);
    assert_eq!(
        (c.scope, c.dir),
        (JitScope::Namespace, PathBuf::from("/srv/jit"))
    );
    let e = Config::from_yaml("jit_cache:\n  scope: everyone\n").unwrap_err();
    assert_eq!(e.location().map(|l| l.0), Some(2), "{e}");
    assert!(e.to_string().contains("everyone"), "{e}");
    for dir in ["jit", "/"] {
        let e = Config::from_yaml(&format!("jit_cache: {{dir: {dir}}}\n")).unwrap_err();
        assert!(e.to_string().contains("jit_cache.dir must be"), "{e}");
    }
}

#[test]
fn a_remote_names_a_repository_and_plain_http_stays_on_loopback() {
    assert_eq!(Config::default().kernels.remote, None);
    let c = Config::from_yaml("kernels:\n  remote:\n    repository: 127.0.0.1:5000/gpuarch/kernels\n    plain_http: true\n")
        .unwrap();
    let r = c.kernels.remote.unwrap();
    assert_eq!(
        (r.registry(), r.push, r.pull_timeout_ms),
        ("127.0.0.1:5000", false, 20_000)
    );
    for (repo, plain, why) in [
        ("gpuarch/kernels", false, "not a registry host"),
        (
            "registry.example",
            false,
            "needs a registry host and a path",
        ),
        ("registry.example/Kernels", false, "lowercase"),
        ("registry.example/k:tag", false, "lowercase"),
        ("registry.example/k@sha256:00", false, "no tag or digest"),
        (
            "registry.example:5000/k",
            true,
            "only for a registry on loopback",
        ),
        (
            "127.0.0.1.evil.example/k",
            true,
            "only for a registry on loopback",
        ),
    ] {
        let y =
            format!("kernels:\n  remote:\n    repository: \"{repo}\"\n    plain_http: {plain}\n");
        let e = Config::from_yaml(&y).unwrap_err();
        assert!(e.to_string().contains(why), "{repo}: {e}");
    }
    for ok in ["localhost:5000/k", "[::1]:5000/k"] {
        let y = format!("kernels:\n  remote:\n    repository: \"{ok}\"\n    plain_http: true\n");
        assert!(Config::from_yaml(&y).is_ok(), "{ok}");
    }
    let e = Config::from_yaml(
        "kernels:\n  remote:\n    repository: r.example/k\n    pull_timeout_ms: 5\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("pull_timeout_ms"), "{e}");
}

#[test]
fn the_nfd_export_is_off_until_enabled_and_names_a_file() {
    let c = Config::default().export;
    assert!(!c.nfd);
    assert_eq!(c.nfd_file, PathBuf::from(DEFAULT_NFD_FILE));
    let c = Config::from_yaml("export: {nfd: true, nfd_file: /srv/features.d/gpus}\n")
        .unwrap()
        .export;
    assert!(c.nfd);
    assert_eq!(c.nfd_file, PathBuf::from("/srv/features.d/gpus"));
    for f in ["gpuarch", "/srv/features.d/.gpuarch", "/"] {
        let e = Config::from_yaml(&format!("export: {{nfd_file: \"{f}\"}}\n")).unwrap_err();
        assert!(
            e.to_string().contains("export.nfd_file must be"),
            "{f}: {e}"
        );
    }
    let e = Config::from_yaml("export:\n  nfd: yes please\n").unwrap_err();
    assert_eq!(e.location().map(|l| l.0), Some(2), "{e}");
}

#[test]
fn only_opt_in_variables_may_be_enabled() {
    let c = Config::from_yaml("env:\n  enable: [ACCELERATE_MIXED_PRECISION]\n").unwrap();
    assert_eq!(c.env.enable, [EnvVar::AccelerateMixedPrecision].into());
    let e = Config::from_yaml("env:\n  enable: [GPUARCH_DTYPE]\n").unwrap_err();
    assert!(
        e.to_string().contains("GPUARCH_DTYPE is set by default")
            && e.to_string().contains("ACCELERATE_MIXED_PRECISION"),
        "{e}"
    );
}

#[test]
fn the_default_toolkit_is_a_cuda_version_quoted_or_not() {
    use crate::arch::CudaVersion;
    for text in [
        "env:\n  cuda_version: \"12.8\"\n",
        "env:\n  cuda_version: 12.8\n",
    ] {
        let c = Config::from_yaml(text).unwrap();
        assert_eq!(c.env.cuda_version, Some(CudaVersion::new(12, 8)), "{text}");
    }
    let e = Config::from_yaml("env:\n  cuda_version: twelve\n").unwrap_err();
    assert_eq!(e.location().map(|l| l.0), Some(2), "{e}");
    assert!(e.to_string().contains("twelve"), "{e}");
}

#[test]
fn mistakes_name_the_line_and_the_key() {
    let e = Config::from_yaml("strict: false\nenv:\n  overide: true\n").unwrap_err();
    assert_eq!(e.location().map(|l| l.0), Some(3), "{e}");
    assert!(e.to_string().contains("overide"), "{e}");

    let e = Config::from_yaml("env:\n  disable: [GPUARCH_FP9]\n").unwrap_err();
    assert_eq!(e.location().map(|l| l.0), Some(2), "{e}");
    assert!(
        e.to_string().contains("unknown variable 'GPUARCH_FP9'"),
        "{e}"
    );

    let e = Config::from_yaml("strict: [\n").unwrap_err();
    assert!(e.location().is_some(), "{e}");

    let e = Config::from_yaml("hook:\n  timeout_ms: 0\n").unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    assert_eq!(e.location().map(|l| l.0), Some(2), "{e}");

    let e = Config::from_yaml("runtime:\n  path: runc\n").unwrap_err();
    assert!(
        e.to_string().contains("runtime.path must be absolute"),
        "{e}"
    );

    let e = Config::from_yaml("daemon:\n  refresh_interval_s: 0\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("refresh_interval_s 0 is out of range"),
        "{e}"
    );
    assert_eq!(e.location().map(|l| l.0), Some(2), "{e}");

    let e = Config::from_yaml("strict: maybe\n").unwrap_err();
    assert!(e.to_string().starts_with("line 1"), "{e}");
}

#[test]
fn nri_index_is_two_digits_however_yaml_spells_it() {
    for (yaml, want) in [
        ("50", "50"),
        ("\"05\"", "05"),
        ("7", "07"),
        ("\"99\"", "99"),
    ] {
        let c = Config::from_yaml(&format!("nri:\n  index: {yaml}\n")).unwrap();
        assert_eq!(c.nri.index, want, "{yaml}");
    }
    for bad in ["100", "\"5a\"", "-1", "[1]", "\"\""] {
        let e = Config::from_yaml(&format!("nri:\n  index: {bad}\n")).unwrap_err();
        assert!(e.to_string().contains("two digits"), "{bad}: {e}");
    }
    assert_eq!(
        Config::default().nri.socket,
        PathBuf::from(DEFAULT_NRI_SOCKET)
    );
    assert!(!Config::default().nri.enable);
}

/// An error gives its position once, first (serde_yaml's own message
/// repeated it: "line 2, column 1: ... at line 2 column 1").
#[test]
fn an_error_names_its_line_once() {
    for text in ["strict: false\nstrictt: false\n", "kernels: [\n"] {
        let e = Config::from_yaml(text).unwrap_err().to_string();
        assert!(e.starts_with("line 2, column 1: "), "{e}");
        assert_eq!(e.matches("line 2").count(), 1, "{e}");
    }
}

/// What gpuarchd publishes as its config in force reads back as the same
/// config, defaults and all.
#[test]
fn the_config_in_force_reads_back_as_itself() {
    let c = Config::from_yaml("strict: true\njit_cache:\n  enable: true\n  scope: uid\n").unwrap();
    let back = Config::from_yaml(&serde_yaml::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
    let d = Config::default();
    assert_eq!(
        Config::from_yaml(&serde_yaml::to_string(&d).unwrap()).unwrap(),
        d
    );
}
