//! Hostile rootfs: links, swaps, FIFOs and loader configs the image
//! plants never lead root to the host.

use super::*;

/// A rootfs whose /run and /opt/gpuarch point at host directories: every
/// write and mount lands inside the rootfs, and the host stays as it was.
#[test]
fn a_hostile_rootfs_cannot_reach_the_host() {
    need_containers!("runc", "podman");
    let mut s = Scene::new();
    let host_run = s.path().join("host-run");
    let host_opt = s.path().join("host-opt");
    std::fs::create_dir_all(&host_run).unwrap();
    std::fs::create_dir_all(&host_opt).unwrap();
    let rootfs = s.rootfs();
    std::fs::remove_dir(rootfs.join("run")).unwrap();
    symlink(&host_run, rootfs.join("run")).unwrap();
    symlink(&host_opt, rootfs.join("opt/gpuarch")).unwrap();
    let pkgs = s.path().join("kernels");
    std::fs::create_dir_all(pkgs.join("demo")).unwrap();
    std::fs::write(
        pkgs.join("demo/manifest.json"),
        r#"{"targets": ["sm_75", "sm_86"]}"#,
    )
    .unwrap();
    s.config_yaml = format!("kernels:\n  mount_root: {}\n", pkgs.display());

    let host_empty = || {
        for d in [&host_run, &host_opt] {
            let left: Vec<_> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            assert!(left.is_empty(), "written on the host: {left:?}");
        }
    };
    let seen = s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=0,1"]);
    assert_eq!(seen.ok().hints().0, Some("7.5;8.6"));
    assert!(seen.kernels.contains("\"targets\""), "{seen:?}");
    host_empty();
    let seen = s.podman(&["-e", "NVIDIA_VISIBLE_DEVICES=1"]);
    assert_eq!(seen.ok().hints().0, Some("8.6"));
    host_empty();
}

/// The container's loader variables never reach the hook or what it runs.
#[test]
fn the_containers_ld_preload_never_runs_on_the_host() {
    need_containers!("runc", "podman", "gcc");
    let s = Scene::new();
    let marker = s.path().join("preload-ran");
    let src = s.path().join("evil.c");
    std::fs::write(
        &src,
        format!(
            "#include <fcntl.h>\n__attribute__((constructor)) static void evil(void) {{ open(\"{}\", O_CREAT | O_WRONLY, 0644); }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let lib = s.path().join("evil.so");
    let o = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    // The library works: a host program with it preloaded leaves the marker.
    Command::new("true")
        .env("LD_PRELOAD", &lib)
        .status()
        .unwrap();
    assert!(marker.exists(), "the test's preload library does not run");
    std::fs::remove_file(&marker).unwrap();

    let preload = format!("LD_PRELOAD={}", lib.display());
    let libpath = format!("LD_LIBRARY_PATH={}", s.path().display());
    let env = [
        "NVIDIA_VISIBLE_DEVICES=1",
        preload.as_str(),
        libpath.as_str(),
    ];
    let seen = s.shim("runc", &env);
    assert_eq!(seen.ok().hints().0, Some("8.6"));
    let args: Vec<&str> = env.iter().flat_map(|e| ["-e", e]).collect();
    let seen = s.podman(&args);
    assert_eq!(seen.ok().hints().0, Some("8.6"));
    assert!(
        !marker.exists(),
        "the container's LD_PRELOAD ran on the host"
    );
}

/// The image ships FIFOs at the names the hook's temporary files had (the
/// file's name, `.gpuarch-`, the hook's pid) for the next 4,000 pids. At
/// prestart the hook runs in the host's device cgroup, and a device node
/// there would have been written through to a host device; a FIFO makes
/// the old open block until the budget runs out. Now the temporary names
/// are unpredictable and created exclusively: the Plan is written and
/// every FIFO is left as it was.
#[test]
fn things_the_image_put_at_temporary_names_are_never_opened() {
    need_containers!("runc", "crun", "unshare");
    use nix::sys::stat::{Mode, SFlag, mknod};
    let s = Scene::new();
    let dirs = [("run/gpuarch", "env"), ("etc/profile.d", "gpuarch.sh")];
    for (d, _) in dirs {
        std::fs::create_dir_all(s.rootfs().join(d)).unwrap();
    }
    let next_pid: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let fifos: Vec<PathBuf> = (next_pid + 1..next_pid + 4000)
        .flat_map(|pid| dirs.map(|(d, f)| s.rootfs().join(d).join(format!(".{f}.gpuarch-{pid}"))))
        .collect();
    for f in &fifos {
        mknod(f, SFlag::S_IFIFO, Mode::from_bits_truncate(0o666), 0).unwrap();
    }
    for runtime in ["runc", "crun"] {
        for (stage, key) in [
            ("create-container", "createContainer"),
            ("prestart", "prestart"),
        ] {
            let what = format!("{runtime} {stage}");
            let profile = s.rootfs().join("etc/profile.d/gpuarch.sh");
            let _ = std::fs::remove_file(s.rootfs().join("run/gpuarch/env"));
            let _ = std::fs::remove_file(&profile);
            let hooks = json!({ key: s.hook_entry(stage) });
            let b = s.bundle_with(runtime, &["NVIDIA_VISIBLE_DEVICES=0,1"], Some(hooks));
            let seen = s.run_bundle(runtime, &b, false);
            seen.ok();
            assert!(
                seen.env_file.contains("GPUARCH_DTYPE=float16\n"),
                "{what}: {}",
                seen.env_file
            );
            let profile = std::fs::read_to_string(&profile).unwrap_or_default();
            assert!(
                profile.contains("export GPUARCH_DTYPE='float16'"),
                "{what}: the profile was not written: {profile:?}"
            );
        }
    }
    for f in &fifos {
        let t = std::fs::symlink_metadata(f).unwrap().file_type();
        assert!(
            std::os::unix::fs::FileTypeExt::is_fifo(&t),
            "{} replaced",
            f.display()
        );
    }
}

/// Another container sharing the volume at /opt swaps /opt/gpuarch with a
/// decoy in a `renameat2(RENAME_EXCHANGE)` loop while GPU containers start
/// with the createContainer hook. The hook once bound
/// the store, then looked the path up again to make the mount read-only;
/// the second lookup could land on the decoy, fail, and leave the store
/// mounted writable. Now each mount is read-only before it is attached to
/// the one handle resolved: whichever directory it lands on, nothing the
/// container sees of the store is writable and the source is unchanged.
#[test]
fn a_path_swapped_during_the_mounts_never_leaves_the_store_writable() {
    need_containers!("runc", "crun", "gcc", "unshare");
    let (mut s, root) = kernel_scene();
    // A published package too: its view holds hard links of the store's
    // files (the same inodes), so a writable mount of it would write the
    // store.
    with_published(&mut s, &root);
    let hooks = json!({ "createContainer": s.hook_entry("create-container") });
    // One start lays out the mount points; the decoy is a copy of them.
    let b = s.bundle_with("runc", &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks.clone()));
    s.run_bundle("runc", &b, false).ok();
    let (real, decoy) = (s.rootfs().join("opt/gpuarch"), s.rootfs().join("opt/decoy"));
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&real)
        .arg(&decoy)
        .status()
        .unwrap();
    assert!(cp.success());
    let sources = [root.clone(), s.path().join("cache")];
    let before: Vec<_> = sources.iter().map(|d| tree(d)).collect();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let (a, b) = (
            std::ffi::CString::new(real.as_os_str().as_encoded_bytes()).unwrap(),
            std::ffi::CString::new(decoy.as_os_str().as_encoded_bytes()).unwrap(),
        );
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: two valid NUL-terminated paths.
                let r = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                swaps += u64::from(r == 0);
            }
            swaps
        })
    };
    let mut seen_kernels = 0;
    for i in 0..60 {
        let runtime = if i % 2 == 0 { "runc" } else { "crun" };
        let b = s.bundle_with(runtime, &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks.clone()));
        let seen = s.run_bundle(runtime, &b, false);
        seen.ok();
        // The probe touches a file in every kernel directory it sees: a
        // writable mount of the store would have put it in the source.
        // (The decoy, swapped in at /opt/gpuarch, is the container's own
        // and may well be writable.)
        let after: Vec<_> = sources.iter().map(|d| tree(d)).collect();
        assert!(
            after == before,
            "start {i} ({runtime}) wrote into the store: {}",
            seen.kernels
        );
        seen_kernels += usize::from(
            seen.kernels.contains("demo.cubin") && seen.kernels.contains("saxpy.cubin"),
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 1000, "the swapper ran only {swaps} times");
    eprintln!(
        "60 starts under {swaps} swaps: {seen_kernels} saw the kernels, none wrote into the store"
    );
}

/// The paths the hook writes or mounts in a rootfs.
const WRITTEN: [&str; 5] = [
    "opt",
    "opt/gpuarch",
    "run",
    "etc/profile.d",
    "etc/ld.so.conf.d",
];

/// A host directory holding one canary file; `check` asserts it holds
/// exactly that, unchanged.
fn host_dir(s: &Scene, name: &str) -> PathBuf {
    let d = s.path().join(format!("host-{}", name.replace('/', "-")));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("canary"), "host\n").unwrap();
    d
}

fn check(d: &Path) {
    let extra = host_extra(d);
    assert!(extra.is_empty(), "written on the host: {extra:?}");
    assert_eq!(std::fs::read_to_string(d.join("canary")).unwrap(), "host\n");
}

/// Each path the hook writes or mounts (/opt, /opt/gpuarch, /run,
/// /etc/profile.d, /etc/ld.so.conf.d) a symlink to a host directory: the
/// container starts, through the shim and with the createContainer hook
/// alone, and the host directory is as it was.
#[test]
fn each_path_the_hook_writes_may_lead_to_the_host() {
    need_containers!("runc", "gcc");
    for p in WRITTEN {
        let (s, _) = kernel_scene();
        let host = host_dir(&s, p);
        let at = s.rootfs().join(p);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        let _ = std::fs::remove_dir_all(&at);
        symlink(&host, &at).unwrap();

        s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=1"]).ok();
        check(&host);
        let hooks = json!({ "createContainer": s.hook_entry("create-container") });
        let b = s.bundle_with("runc", &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks));
        s.run_bundle("runc", &b, false).ok();
        check(&host);
    }
}

/// An image that points the loader's configuration at the host through
/// `/proc`: its `/etc/ld.so.conf` names host library directories as
/// `/proc/N/root/...` (N of the processes a hook may see at
/// createContainer), and its `/var/cache/ldconfig` is a link to a host
/// directory the same way. ldconfig follows whatever paths the image
/// names, so it must run where `/proc` leads nowhere: with runc, crun and
/// the shim, the container gets its loader cache (gpuarch's library is in
/// it) and the host directories hold exactly what they held, no soname
/// link, no aux-cache.
#[test]
fn the_images_loader_config_never_leads_ldconfig_to_the_host() {
    need_containers!("runc", "crun", "unshare", "gcc");
    let (s, _) = kernel_scene();
    let libs = host_dir(&s, "lib");
    // A real library whose soname differs from its file name: ldconfig
    // makes the soname link in every directory it scans.
    shared_library(
        s.path(),
        "int hostile(void) { return 1; }\n",
        "libhostile.so.1",
        &libs.join("libhostile.so.1.0"),
    );
    let aux = host_dir(&s, "aux");
    let conf: String = (1..=64)
        .map(|n| {
            format!(
                "/proc/{n}/root{}\n/proc/self/root{}\n",
                libs.display(),
                libs.display()
            )
        })
        .collect();
    std::fs::write(s.rootfs().join("etc/ld.so.conf"), conf).unwrap();
    std::fs::create_dir_all(s.rootfs().join("var/cache")).unwrap();
    symlink(
        format!("/proc/1/root{}", aux.display()),
        s.rootfs().join("var/cache/ldconfig"),
    )
    .unwrap();
    let before = (host_extra(&libs), host_extra(&aux));
    assert_eq!(before.0.len(), 1, "{before:?}");
    let check_libs = |what: &str| {
        let after = (host_extra(&libs), host_extra(&aux));
        assert_eq!(after, before, "{what}: written on the host");
    };
    let in_cache = |seen: &Seen, what: &str| {
        assert!(
            seen.ld_cache
                .contains("/opt/gpuarch/kernels/fa2/lib/libgpuarchdemo.so.1"),
            "{what}: loader cache {:?}\nstderr: {}\nlog: {}",
            seen.ld_cache,
            seen.stderr(),
            s.take_log()
        );
    };
    let seen = s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=1"]);
    in_cache(seen.ok(), "shim, runc");
    check_libs("shim, runc");
    for runtime in ["runc", "crun"] {
        let _ = std::fs::remove_file(s.rootfs().join("etc/ld.so.cache"));
        let hooks = json!({ "createContainer": s.hook_entry("create-container") });
        let b = s.bundle_with(runtime, &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks));
        let seen = s.run_bundle(runtime, &b, false);
        in_cache(seen.ok(), runtime);
        check_libs(runtime);
    }
}

/// Entries other than the canary under `d`: (path, is a directory).
fn host_extra(d: &Path) -> Vec<(PathBuf, bool)> {
    let mut out = Vec::new();
    let mut todo = vec![d.to_owned()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if p == d.join("canary") {
                continue;
            }
            let is_dir = e.file_type().unwrap().is_dir();
            if is_dir {
                todo.push(p.clone());
            }
            out.push((p, is_dir));
        }
    }
    out
}

/// runc before 1.1.14 creates a mount's missing destination directories by
/// path after checking them, so a swapped rootfs path makes it create empty
/// directories on the host (CVE-2024-45310).
fn runc_creates_through_swaps() -> Option<String> {
    let o = Command::new("runc").arg("--version").output().ok()?;
    let v = String::from_utf8_lossy(&o.stdout);
    let ver = v.lines().next()?.strip_prefix("runc version ")?.to_owned();
    let nums: Vec<u32> = ver
        .split(|c: char| !c.is_ascii_digit())
        .take(3)
        .map(|n| n.parse().unwrap_or(0))
        .collect();
    (nums.as_slice() < [1, 1, 14].as_slice()).then_some(ver)
}

/// The same paths (but /run, on which the bundle mounts a tmpfs) swapped
/// between a directory and a symlink to the host, thousands of times a
/// second, while containers start.
///
/// With the createContainer hook alone, gpuarch makes every write and mount
/// itself, through handles resolved in the rootfs: every container starts
/// and no host directory is touched. Through the shim, runc makes the
/// kernel mounts named in the config; it refuses a path that moved, and a
/// runc with CVE-2024-45310 creates the mount's empty directories through
/// the swapped path (the test says so and checks that nothing else, no
/// file of gpuarch's, reaches the host).
#[test]
fn paths_swapped_between_check_and_use_never_reach_the_host() {
    need_containers!("runc", "gcc");
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    let old_runc = runc_creates_through_swaps();
    for shim in [false, true] {
        let (s, _) = kernel_scene();
        let mut pairs = Vec::new();
        for p in ["opt/gpuarch", "etc/profile.d", "etc/ld.so.conf.d"] {
            let host = host_dir(&s, p);
            let at = s.rootfs().join(p);
            std::fs::create_dir_all(&at).unwrap();
            let other = s.rootfs().join(format!("{p}.swap"));
            symlink(&host, &other).unwrap();
            pairs.push((at, other, host));
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let stop = stop.clone();
            let pairs: Vec<_> = pairs
                .iter()
                .map(|(a, b, _)| (a.clone(), b.clone()))
                .collect();
            std::thread::spawn(move || {
                let mut swaps = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (a, b) in &pairs {
                        renameat2(AT_FDCWD, a, AT_FDCWD, b, RenameFlags::RENAME_EXCHANGE).unwrap();
                        swaps += 1;
                    }
                }
                swaps
            })
        };
        let t0 = std::time::Instant::now();
        let mut started = 0;
        let runs = 8;
        for _ in 0..runs {
            let seen = if shim {
                s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=1"])
            } else {
                let hooks = json!({ "createContainer": s.hook_entry("create-container") });
                let b = s.bundle_with("runc", &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks));
                s.run_bundle("runc", &b, false)
            };
            if seen.out.status.success() {
                started += 1;
            } else {
                let err = seen.stderr();
                assert!(shim, "the hook alone failed a start: {err}");
                assert!(err.contains("runc run failed"), "{err}");
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        let how = if shim {
            "through the shim"
        } else {
            "with the createContainer hook"
        };
        eprintln!(
            "{how}: {started} of {runs} containers started during {swaps} swaps in {:?}",
            t0.elapsed()
        );
        assert!(swaps > 1000, "the paths were hardly swapped: {swaps}");
        for (_, _, host) in &pairs {
            let extra = host_extra(host);
            match (&old_runc, shim) {
                (Some(v), true) if extra.iter().all(|(_, dir)| *dir) => {
                    if !extra.is_empty() {
                        eprintln!("runc {v} (CVE-2024-45310) created on the host: {extra:?}");
                    }
                    assert_eq!(
                        std::fs::read_to_string(host.join("canary")).unwrap(),
                        "host\n"
                    );
                }
                _ => check(host),
            }
        }
        if !shim {
            assert_eq!(started, runs, "{how}");
        }
    }
}
