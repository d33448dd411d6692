//! Doctor's checks of files below `--root`: that what gpuarch runs as root
//! is root's alone, the kernel and JIT caches, the NFD labels file and the
//! kernel registry.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::node::snapshot_path;
use crate::check::{Check, fail, ok, skip, under, warn};
use crate::cli::Cli;

/// What gpuarch runs or loads as root besides its config: kernel packages
/// (a `command` build runs as root), the OCI runtime the shim execs, the
/// CUDA directories NVRTC and build tools come from. Each must be root's
/// and written by nobody else ([`gpuarch_inventory::trust`]).
pub(super) fn trust(config: &gpuarch_core::config::Config, root: &Path) -> Check {
    use gpuarch_inventory::trust;
    let mut problems: Vec<(String, String)> = Vec::new();
    let mut judge = |what: &str, p: &Path| {
        if let Err(u) = trust::check(p) {
            problems.push((format!("{what}: {u}"), u.fix));
        }
    };
    let package_dirs: Vec<PathBuf> = config
        .kernels
        .package_dirs
        .iter()
        .map(|d| under(root, d))
        .filter(|d| d.exists())
        .collect();
    for d in &package_dirs {
        judge("kernels.package_dirs", d);
    }
    if let Some(r) = &config.runtime.path {
        judge("runtime.path", &under(root, r));
    }
    for d in &config.kernels.cuda_dirs {
        let d = under(root, d);
        if d.exists() {
            judge("kernels.cuda_dirs", &d);
        }
    }
    let (_, errors) = gpuarch_kernels::spec::discover(&package_dirs);
    for e in errors
        .iter()
        .filter(|e| e.reason.contains("is not trusted"))
    {
        let fix = e
            .reason
            .rsplit_once("(fix: ")
            .map_or_else(String::new, |(_, f)| f.trim_end_matches(')').to_owned());
        problems.push((format!("kernel package: {e}"), fix));
    }
    if problems.is_empty() {
        return ok(
            "trust",
            "the kernel packages, runtime and CUDA directories in use are root's and writable by no one else",
        );
    }
    let (details, fixes): (Vec<String>, Vec<String>) = problems.into_iter().unzip();
    fail("trust", details.join("; "), fixes.join("; "))
}

/// Below this much free space a build or an import fails (ENOSPC).
const LEAST_FREE: u64 = 256 << 20;

/// Bytes of the regular files under `dir` (not following links, staying
/// on its filesystem).
fn bytes_under(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return 0;
    };
    let mut total = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() && m.dev() == top.dev() {
                todo.push(e.path());
            } else if m.is_file() {
                total += m.blocks() * 512;
            }
        }
    }
    total
}

/// Free space against what the store may still take: under
/// [`LEAST_FREE`] builds and imports fail; under what `kernels.max_bytes`
/// still allows the store, eviction (which works to that limit) cannot
/// keep them from failing.
fn free_space(dir: &Path, free: u64, max_bytes: u64) -> Check {
    const NAME: &str = "kernel cache";
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    if free < LEAST_FREE {
        return fail(
            NAME,
            format!(
                "{} is writable, but only {:.2} GiB is free: builds and imports fail (ENOSPC)",
                dir.display(),
                gib(free)
            ),
            "free space on that filesystem, or point kernels.cache_dir at one with room",
        );
    }
    let used = bytes_under(dir);
    let room = max_bytes.saturating_sub(used);
    if free < room {
        return warn(
            NAME,
            format!(
                "{} is writable, {:.1} GiB free, but the store may grow {:.1} GiB more (kernels.max_bytes {:.1} GiB, {:.1} GiB used): builds and imports will fail before eviction frees room",
                dir.display(),
                gib(free),
                gib(room),
                gib(max_bytes),
                gib(used)
            ),
            format!(
                "lower kernels.max_bytes to at most {} (used + free), or free space",
                used + free
            ),
        );
    }
    ok(
        NAME,
        format!(
            "{} is writable, {:.1} GiB free; the store may grow {:.1} GiB more (kernels.max_bytes)",
            dir.display(),
            gib(free),
            gib(room)
        ),
    )
}

pub(super) fn cache(dir: &Path, max_bytes: u64) -> Check {
    const NAME: &str = "kernel cache";
    use nix::sys::statvfs::{FsFlags, statvfs};
    use nix::unistd::{AccessFlags, access};
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return fail(
                NAME,
                format!("{} is not a directory", dir.display()),
                format!("move it away; gpuarchd recreates {}", dir.display()),
            );
        }
        Err(e) => {
            return fail(
                NAME,
                format!("{}: {e}", dir.display()),
                "systemctl restart gpuarchd (its unit creates the cache directory)",
            );
        }
    }
    let vfs = match statvfs(dir) {
        Ok(v) => v,
        Err(e) => {
            return fail(
                NAME,
                format!("{}: statvfs: {e}", dir.display()),
                "check the filesystem it is on",
            );
        }
    };
    if vfs.flags().contains(FsFlags::ST_RDONLY) {
        return fail(
            NAME,
            format!("{} is on a read-only filesystem", dir.display()),
            "mount it read-write, or point kernels.cache_dir at a writable directory",
        );
    }
    if let Err(e) = access(dir, AccessFlags::W_OK) {
        let who = nix::unistd::geteuid();
        return fail(
            NAME,
            format!("{} is not writable by uid {who}: {e}", dir.display()),
            if who.is_root() {
                "chown root: and chmod u+w it".to_owned()
            } else {
                "run gpuarchctl doctor as root (gpuarchd writes the cache as root)".to_owned()
            },
        );
    }
    let free = vfs.blocks_available() as u64 * vfs.fragment_size() as u64;
    free_space(dir, free, max_bytes)
}

/// The JIT caches, when on: their directory is root's and no one else's
/// (the hook refuses it otherwise), and gpuarchd's unit may write there
/// (ProtectSystem=strict leaves it only /var/cache/gpuarch, unless a
/// drop-in adds `ReadWritePaths=`).
pub(super) fn jit(cfg: &gpuarch_core::config::JitCacheConfig, root: &Path) -> Check {
    const NAME: &str = "JIT caches";
    if !cfg.enable {
        return skip(NAME, "off (jit_cache.enable)");
    }
    let dir = under(root, &cfg.dir);
    if dir.exists()
        && let Err(u) = gpuarch_inventory::trust::check(&dir)
    {
        let fix = u.fix.clone();
        return fail(NAME, format!("jit_cache.dir: {u}"), fix);
    }
    if !cfg.dir.starts_with("/var/cache/gpuarch") {
        let dropins = under(root, Path::new(DROPINS));
        if !writable_by_unit(root, &cfg.dir) {
            return fail(
                NAME,
                format!(
                    "{} is outside /var/cache/gpuarch, where gpuarchd's unit cannot write: it cannot remove caches there",
                    cfg.dir.display()
                ),
                format!(
                    "add ReadWritePaths={} in {}/jit.conf, then systemctl daemon-reload and restart gpuarchd",
                    cfg.dir.display(),
                    dropins.display()
                ),
            );
        }
    }
    ok(
        NAME,
        format!(
            "on, scope {}, in {} (up to {:.1} GiB)",
            cfg.scope,
            cfg.dir.display(),
            cfg.max_bytes as f64 / f64::from(1u32 << 30)
        ),
    )
}

const DROPINS: &str = "/etc/systemd/system/gpuarchd.service.d";

/// Whether a drop-in of gpuarchd's unit names `dir` in `ReadWritePaths=`
/// (ProtectSystem=strict leaves the unit nothing else outside its own
/// directories).
fn writable_by_unit(root: &Path, dir: &Path) -> bool {
    dropin_has(root, |l| {
        l.trim_start().starts_with("ReadWritePaths=")
            && l.split(['=', ' '])
                .any(|w| Path::new(w.trim_start_matches('-')) == dir)
    })
}

/// Whether a line of gpuarchd's drop-ins below `root` is `pred`'s.
fn dropin_has(root: &Path, pred: impl Fn(&str) -> bool) -> bool {
    std::fs::read_dir(under(root, Path::new(DROPINS)))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            gpuarch_fs::read_config(&e.path())
                .is_ok_and(|t| t.is_some_and(|t| t.lines().any(&pred)))
        })
}

/// The Node Feature Discovery file, when exported: its directory exists
/// and gpuarchd's unit may write there, and it holds the labels of the
/// inventory gpuarchd serves now.
pub(super) fn nfd(cli: &Cli, cfg: &gpuarch_core::config::Config, root: &Path) -> Check {
    const NAME: &str = "NFD labels";
    let export = &cfg.export;
    if !export.nfd {
        return skip(NAME, "off (export.nfd)");
    }
    let file = under(root, &export.nfd_file);
    let parent = export.nfd_file.parent().unwrap_or(Path::new("/"));
    let default_dir = Path::new(gpuarch_core::config::DEFAULT_NFD_FILE).parent();
    if !under(root, parent).is_dir() {
        return fail(
            NAME,
            format!("{} does not exist", parent.display()),
            "deploy NFD's worker (it mounts that directory from the host) or mkdir it, then systemctl restart gpuarchd",
        );
    }
    if Some(parent) != default_dir && !writable_by_unit(root, parent) {
        return fail(
            NAME,
            format!(
                "{} is outside the directories gpuarchd's unit may write",
                parent.display()
            ),
            format!(
                "add ReadWritePaths={} in {DROPINS}/nfd.conf, then systemctl daemon-reload and restart gpuarchd",
                parent.display()
            ),
        );
    }
    let text = match gpuarch_fs::read_config(&file)
        .and_then(|t| t.ok_or_else(|| "no such file".to_owned()))
    {
        Ok(t) => t,
        Err(e) => {
            return fail(
                NAME,
                format!("{}: {e}", export.nfd_file.display()),
                "journalctl -u gpuarchd says why it was not written (a directory made after gpuarchd started needs a restart)",
            );
        }
    };
    if !text.starts_with(gpuarch_core::nfd::HEADER) {
        return fail(
            NAME,
            format!("{} was not written by gpuarchd", export.nfd_file.display()),
            "move that file away, or point export.nfd_file elsewhere",
        );
    }
    let snap_path = snapshot_path(cli, root, &cfg.daemon);
    let lines = text.lines().filter(|l| !l.starts_with('#')).count();
    match gpuarch_inventory::read_snapshot(&snap_path) {
        Ok(snap) if gpuarch_core::nfd::render(&gpuarch_core::nfd::labels(&snap)) != text => fail(
            NAME,
            format!(
                "{} does not match the inventory in {}",
                export.nfd_file.display(),
                snap_path.display()
            ),
            "journalctl -u gpuarchd says why it was not rewritten",
        ),
        _ => ok(
            NAME,
            format!("{lines} labels in {}", export.nfd_file.display()),
        ),
    }
}

/// The registry tier, when configured: gpuarchd's unit may reach the
/// network (it has none without a drop-in), and the registry answers a TCP
/// connection from here.
pub(super) fn registry(cfg: &gpuarch_core::config::KernelsConfig, root: &Path) -> Check {
    const NAME: &str = "registry";
    let Some(r) = &cfg.remote else {
        return skip(NAME, "off (kernels.remote)");
    };
    let opened = dropin_has(root, |l| {
        l.split_whitespace().collect::<String>() == "PrivateNetwork=no"
    });
    if !opened {
        return fail(
            NAME,
            format!(
                "gpuarchd's unit has no network (PrivateNetwork=yes): {} is out of its reach, so every build runs here",
                r.repository
            ),
            format!(
                "add [Service] PrivateNetwork=no, RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 and IPAddressAllow=<the registry's address> in {DROPINS}/registry.conf, then systemctl daemon-reload and restart gpuarchd"
            ),
        );
    }
    let (host, port) = r.host_and_port();
    let addr = format!("{host}:{port}");
    use std::net::ToSocketAddrs;
    let reached = addr.to_socket_addrs().map(|mut a| {
        a.any(|sa| std::net::TcpStream::connect_timeout(&sa, Duration::from_secs(2)).is_ok())
    });
    match reached {
        Ok(true) => ok(
            NAME,
            format!(
                "{} answers; push {}",
                r.repository,
                if r.push { "on" } else { "off" }
            ),
        ),
        Ok(false) => fail(
            NAME,
            format!("{addr} does not accept a connection: builds run here until it does"),
            "check the registry and the route to it",
        ),
        Err(e) => fail(
            NAME,
            format!("{addr}: {e}"),
            "check the registry's name in kernels.remote.repository",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;

    #[test]
    fn the_jit_check_names_an_untrusted_or_unwritable_directory() {
        use gpuarch_core::config::JitCacheConfig;
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let off = JitCacheConfig::default();
        assert_eq!(jit(&off, root.path()).status, Status::Skip);
        let on = JitCacheConfig {
            enable: true,
            ..off
        };
        assert_eq!(jit(&on, root.path()).status, Status::Ok);
        let dir = under(root.path(), &on.dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let c = jit(&on, root.path());
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("is not trusted"), "{}", c.detail);
        let srv = JitCacheConfig {
            dir: PathBuf::from("/srv/jit"),
            ..on
        };
        let c = jit(&srv, root.path());
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.unwrap().contains("ReadWritePaths=/srv/jit"));
        let dropins = under(
            root.path(),
            Path::new("/etc/systemd/system/gpuarchd.service.d"),
        );
        std::fs::create_dir_all(&dropins).unwrap();
        std::fs::write(
            dropins.join("jit.conf"),
            "[Service]\nReadWritePaths=/srv/jit\n",
        )
        .unwrap();
        assert_eq!(jit(&srv, root.path()).status, Status::Ok);
    }

    #[test]
    fn the_registry_check_wants_a_network_and_an_answer() {
        use gpuarch_core::config::{KernelsConfig, RemoteConfig};
        let root = tempfile::tempdir().unwrap();
        let off = KernelsConfig::default();
        assert_eq!(registry(&off, root.path()).status, Status::Skip);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let on = |port: u16| KernelsConfig {
            remote: Some(RemoteConfig {
                repository: format!("127.0.0.1:{port}/gpuarch/kernels"),
                push: true,
                credentials: None,
                plain_http: true,
                ca_file: None,
                pull_timeout_ms: 1000,
            }),
            ..KernelsConfig::default()
        };
        let c = registry(&on(port), root.path());
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.unwrap().contains("PrivateNetwork=no"));
        let dropins = under(root.path(), Path::new(DROPINS));
        std::fs::create_dir_all(&dropins).unwrap();
        std::fs::write(
            dropins.join("registry.conf"),
            "[Service]\nPrivateNetwork=no\n",
        )
        .unwrap();
        let c = registry(&on(port), root.path());
        assert_eq!(c.status, Status::Ok, "{}", c.detail);
        drop(listener);
        let c = registry(&on(port), root.path());
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.contains("does not accept a connection"),
            "{}",
            c.detail
        );
    }
}
