//! An image's files, as its author lays them out, read two ways that must
//! agree: as the hook reads a rootfs (`Root`, the kernel resolving every
//! path inside it) and as gpuarchd reads the image's layers on the NRI path
//! (`Layers`, which resolves links, `..`, whiteouts and opaque directories
//! itself). The same input builds three layer directories; the rootfs is
//! them mounted as overlayfs, as a runtime mounts an image (where the
//! fuzzer runs as root), else a tree modelled on what overlayfs shows. What
//! the two readers find of the image's Python (consumers, releases,
//! environments read and not read, notes) must be the same.
//!
//! Where the input has a `next` line, what follows it is a second image;
//! after a `derive` line, it is one more layer over the first image's
//! layers (the same directories), as an image built `FROM` another is.
//! Each way in then reads the first image through a cache directory twice
//! and the second once after it, as the starts after the first read: what
//! each finds must be what a read without the cache finds.
//!
//! The input is text, one entry a line (so the seed corpus is readable):
//!
//! ```text
//! env PATH=/opt/venv/bin:/usr/bin    the process's env
//! user 1000                          its uid (and gid)
//! layer 1                            later entries go to layer 1 (0 is the top)
//! d usr/lib/python3.12               a directory
//! f a/METADATA Version: 2.7.1\n      a file; \n, \t, \\ and \xNN escaped
//! l opt/venv/bin/python3 /usr/bin/python3.12     a link
//! w usr/lib/python3.12/site-packages/torch-2.7.1.dist-info   a whiteout
//! o usr/local/lib                    an opaque directory
//! next                               the second image's entries follow
//! derive                             or: the second image is a layer over the first
//! ```
//!
//! Whiteouts (`mknod`) and opaque directories (`trusted.*` xattrs) need
//! root; without it those entries are dropped from both views alike.
#![no_main]
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, symlink};
use std::path::{Path, PathBuf};

use gpuarch_container::image::{self, Layers};
use gpuarch_container::rootfs::Root;
use gpuarch_core::oci::ContainerView;
use libfuzzer_sys::fuzz_target;

/// Layers of an image the input builds; a derived image has one more.
const LAYERS: usize = 3;
const MAX_ENTRIES: usize = 96;
const MAX_DEPTH: usize = 12;
const MAX_NAME: usize = 64;
const MAX_FILE: usize = 8 << 10;

#[derive(Clone)]
enum Kind {
    Dir,
    File(Vec<u8>),
    Link(String),
    Whiteout,
    Opaque,
}

#[derive(Clone)]
struct Entry {
    layer: usize,
    path: Vec<String>,
    kind: Kind,
}

fn unescape(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            match b[i + 1] {
                b'n' => out.push(b'\n'),
                b't' => out.push(b'\t'),
                b'r' => out.push(b'\r'),
                b'\\' => out.push(b'\\'),
                b'x' if i + 3 < b.len() => {
                    match u8::from_str_radix(
                        std::str::from_utf8(&b[i + 2..i + 4]).unwrap_or(""),
                        16,
                    ) {
                        Ok(v) => out.push(v),
                        Err(_) => out.extend_from_slice(&b[i..i + 4]),
                    }
                    i += 4;
                    continue;
                }
                other => out.extend_from_slice(&[b'\\', other]),
            }
            i += 2;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// A path the image holds: plain names only (its layers' own names never
/// include `.`, `..` or an empty one).
fn path_of(s: &str) -> Option<Vec<String>> {
    let parts: Vec<String> = s
        .split('/')
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect();
    let plain = parts
        .iter()
        .all(|c| c != "." && c != ".." && !c.contains('\0') && c.len() <= MAX_NAME);
    (plain && !parts.is_empty() && parts.len() <= MAX_DEPTH).then_some(parts)
}

fn parse(text: &str) -> (ContainerView, Vec<Entry>, Option<Second>) {
    let mut view = ContainerView::default();
    let mut entries = Vec::new();
    let mut first: Option<Vec<Entry>> = None;
    let mut derive = false;
    let mut layer = 0;
    for line in text.lines() {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "env" => {
                if let Some((k, v)) = rest.split_once('=')
                    && view.env.len() < 16
                {
                    view.env.push((k.to_owned(), v.to_owned()));
                }
            }
            "user" => {
                if let Ok(u) = rest.trim().parse::<u32>() {
                    view.user = Some((u, u));
                }
            }
            "next" | "derive" if first.is_none() => {
                first = Some(std::mem::take(&mut entries));
                derive = word == "derive";
                layer = 0;
            }
            "layer" => {
                if let Ok(l) = rest.trim().parse::<usize>() {
                    layer = l.min(LAYERS - 1);
                }
            }
            "d" | "f" | "l" | "w" | "o" if entries.len() < MAX_ENTRIES => {
                let (p, arg) = rest.split_once(' ').unwrap_or((rest, ""));
                let Some(path) = path_of(p) else { continue };
                let kind = match word {
                    "d" => Kind::Dir,
                    "f" => {
                        let mut data = unescape(arg);
                        data.truncate(MAX_FILE);
                        Kind::File(data)
                    }
                    "l" if !arg.is_empty() && !arg.contains('\0') => Kind::Link(arg.to_owned()),
                    "w" => Kind::Whiteout,
                    "o" => Kind::Opaque,
                    _ => continue,
                };
                entries.push(Entry { layer, path, kind });
            }
            _ => {}
        }
    }
    // The top layer's entries first: what a higher layer holds decides
    // what of the lower ones shows.
    entries.sort_by_key(|e| e.layer);
    if !specials_possible() {
        for list in [&mut entries].into_iter().chain(first.as_mut()) {
            list.retain(|e| !matches!(e.kind, Kind::Whiteout | Kind::Opaque));
        }
    }
    match first {
        Some(mut a) => {
            a.sort_by_key(|e| e.layer);
            (view, a, Some(Second { entries, derive }))
        }
        None => (view, entries, None),
    }
}

/// The second image of an input: another one, or (`derive`) the first's
/// layers under one more, as an image built `FROM` another shares its
/// base's layers.
struct Second {
    entries: Vec<Entry>,
    derive: bool,
}

/// Makes `path` under `base` as `kind`; its parents as directories where
/// absent, never through a link or anything else that is not one (so
/// nothing is ever made outside `base`). False where it could not be made
/// as asked.
fn make(base: &Path, path: &[String], kind: &Kind) -> bool {
    let mut at = base.to_path_buf();
    for name in &path[..path.len() - 1] {
        at.push(name);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => return false,
            Err(_) => {
                if std::fs::create_dir(&at).is_err() {
                    return false;
                }
            }
        }
    }
    at.push(&path[path.len() - 1]);
    match kind {
        Kind::Dir | Kind::Opaque => {
            let made = match std::fs::symlink_metadata(&at) {
                Ok(m) => m.file_type().is_dir(),
                Err(_) => std::fs::create_dir(&at).is_ok(),
            };
            made && (!matches!(kind, Kind::Opaque) || set_opaque(&at))
        }
        Kind::File(data) => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&at)
            .and_then(|mut f| std::io::Write::write_all(&mut f, data))
            .is_ok(),
        Kind::Link(target) => symlink(target, &at).is_ok(),
        Kind::Whiteout => nix::sys::stat::mknod(
            &at,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o644),
            0,
        )
        .is_ok(),
    }
}

/// Whether this process can make whiteouts and opaque directories (root).
/// Where it cannot, such entries are dropped before anything is built: a
/// half-made one (its parent directories made, the entry not) would be in
/// the layers and not in the modelled tree.
fn specials_possible() -> bool {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAN.get_or_init(|| {
        let s = Scratch::new();
        let probe = [String::from("probe")];
        make(&s.0, &probe, &Kind::Whiteout) && {
            let dir = [String::from("dir")];
            make(&s.0, &dir, &Kind::Opaque)
        }
    })
}

fn set_opaque(dir: &Path) -> bool {
    let Ok(path) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: both names are NUL-terminated, the value is one live byte.
    let r = unsafe {
        nix::libc::lsetxattr(
            path.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            b"y".as_ptr().cast(),
            1,
            0,
        )
    };
    r == 0
}

/// The layers, and (where `model`) the tree overlayfs would show for them.
fn build(dir: &Path, entries: &[Entry], model: bool) -> (Vec<PathBuf>, Option<PathBuf>) {
    let n = entries
        .iter()
        .map(|e| e.layer + 1)
        .max()
        .unwrap_or(0)
        .max(LAYERS);
    let layers: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("layer{i}"))).collect();
    let merged = dir.join("merged");
    for d in layers.iter().chain(model.then_some(&merged)) {
        std::fs::create_dir(d).expect("scratch directory");
    }
    // Paths a whiteout or an opaque directory of layer W hides in the
    // layers below W (the path itself and all under it).
    let mut hidden: Vec<(usize, &[String])> = Vec::new();
    for e in entries {
        if !make(&layers[e.layer], &e.path, &e.kind) || !model {
            continue;
        }
        let below = |(w, p): &(usize, &[String])| *w < e.layer && e.path.starts_with(p);
        if hidden.iter().any(below) {
            continue;
        }
        match e.kind {
            Kind::Whiteout => {
                // Its directory shows, though it holds nothing else.
                let parent = &e.path[..e.path.len() - 1];
                if parent.is_empty() || make(&merged, parent, &Kind::Dir) {
                    hidden.push((e.layer, &e.path));
                }
            }
            Kind::Opaque => {
                if make(&merged, &e.path, &Kind::Dir) {
                    hidden.push((e.layer, &e.path));
                }
            }
            _ => {
                make(&merged, &e.path, &e.kind);
            }
        }
    }
    (layers, model.then_some(merged))
}

/// What a read finds, and its notes.
type Read = (gpuarch_core::software::Software, Vec<String>);

/// Whether a read stopped at its deadline (the two readers make different
/// system calls, so one may and the other not).
fn timed_out(read: &Read) -> bool {
    read.1
        .iter()
        .chain(&read.0.unread)
        .any(|n| n.contains(" ms") || n.contains("ETIMEDOUT") || n.contains("timed out"))
}

/// Whether this process can mount overlayfs, in a mount namespace of its
/// own (root): then the rootfs read is of a real overlay mount of the
/// layers, as a runtime mounts an image, and not of the tree modelled here.
fn overlay_possible() -> bool {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAN.get_or_init(|| {
        use nix::mount::{MsFlags, mount};
        let private = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).is_ok()
            && mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .is_ok();
        let can = private && {
            let s = Scratch::new();
            let (layers, _) = build(&s.0, &[], false);
            let merged = s.0.join("overlay");
            std::fs::create_dir(&merged).is_ok() && mount_overlay(&layers, &merged).is_some()
        };
        eprintln!(
            "image_read: the rootfs read is of {}",
            if can {
                "a real overlayfs mount of the layers"
            } else {
                "a tree modelled on overlayfs (no overlay mount here)"
            }
        );
        can
    })
}

/// The layers mounted read-only at `at`, as overlayfs merges them (the
/// top one first); unmounted when dropped.
fn mount_overlay(layers: &[PathBuf], at: &Path) -> Option<Unmount> {
    let lower: Vec<String> = layers.iter().map(|l| l.display().to_string()).collect();
    nix::mount::mount(
        Some("overlay"),
        at,
        Some("overlay"),
        nix::mount::MsFlags::MS_RDONLY,
        Some(format!("lowerdir={}", lower.join(":")).as_str()),
    )
    .ok()
    .map(|()| Unmount(at.to_path_buf()))
}

struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// An image built from entries in `dir`: its layers, and its rootfs (an
/// overlayfs mount of them, or the modelled tree), unmounted when dropped.
struct Image {
    layers: Vec<PathBuf>,
    rootfs: PathBuf,
    _mounted: Option<Unmount>,
}

impl Image {
    fn new(dir: &Path, entries: &[Entry]) -> Self {
        std::fs::create_dir(dir).expect("scratch directory");
        let overlay = overlay_possible();
        let (layers, model) = build(dir, entries, !overlay);
        Self::of(dir, layers, model)
    }

    /// `base`'s layers under one more made of `entries` (their `layer`
    /// lines ignored). The rootfs modelled where no overlay can be
    /// mounted is made anew, of all the entries: only the layers then
    /// share the base's directories.
    fn derived(dir: &Path, base: &Image, base_entries: &[Entry], entries: &[Entry]) -> Self {
        std::fs::create_dir(dir).expect("scratch directory");
        let top = dir.join("top");
        std::fs::create_dir(&top).expect("scratch directory");
        for e in entries {
            make(&top, &e.path, &e.kind);
        }
        let layers: Vec<PathBuf> = std::iter::once(top)
            .chain(base.layers.iter().cloned())
            .collect();
        let model = (!overlay_possible()).then(|| {
            let all: Vec<Entry> = entries
                .iter()
                .map(|e| Entry {
                    layer: 0,
                    ..e.clone()
                })
                .chain(base_entries.iter().map(|e| Entry {
                    layer: e.layer + 1,
                    ..e.clone()
                }))
                .collect();
            let model = dir.join("model");
            std::fs::create_dir(&model).expect("scratch directory");
            build(&model, &all, true).1.expect("asked for")
        });
        Self::of(dir, layers, model)
    }

    /// The image of `layers`: its rootfs `model`, else them mounted.
    fn of(dir: &Path, layers: Vec<PathBuf>, model: Option<PathBuf>) -> Self {
        let (rootfs, mounted) = match model {
            Some(m) => (m, None),
            None => {
                let at = dir.join("overlay");
                std::fs::create_dir(&at).expect("scratch directory");
                let m = mount_overlay(&layers, &at).expect("the layers mount as overlayfs");
                (at, Some(m))
            }
        };
        Self {
            layers,
            rootfs,
            _mounted: mounted,
        }
    }

    fn root(&self) -> Root {
        Root::open(&self.rootfs).expect("the rootfs opens")
    }

    fn layers(&self) -> Layers {
        Layers::open(&self.layers).expect("the layers open")
    }
}

/// A read's notes but those of the cache itself (a directory this run
/// could not write to).
fn without_cache_notes(mut read: Read) -> Read {
    read.1.retain(|n| !n.contains("cached"));
    read
}

fn differ(what: &str, a: &Read, b: &Read, image: &Image) -> ! {
    let listing: BTreeMap<String, String> = walkdir(&image.rootfs);
    panic!("{what}\nfirst: {a:#?}\nsecond: {b:#?}\nthe image: {listing:#?}");
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (view, entries, then) = parse(text);
    let scratch = Scratch::new();
    let a = Image::new(&scratch.0.join("a"), &entries);

    // The hook's read of the rootfs and gpuarchd's of the layers.
    let root = a.root();
    let mut by_root = image::read(&root, &view, None);
    let mut by_layers = image::read_layers(&a.layers(), &view, None);
    if timed_out(&by_root) || timed_out(&by_layers) {
        return;
    }
    // The key names the directories read, which are other inodes in the
    // layers than in the rootfs.
    by_root.0.image_key = None;
    by_layers.0.image_key = None;
    if by_root != by_layers {
        differ(
            "the rootfs and its layers were read differently",
            &by_root,
            &by_layers,
            &a,
        );
    }

    // Through the cache, as every start after the first reads: what the
    // image holds is found as a read without it finds it, for the same
    // image and for another one read after it.
    let Some(then) = then else { return };
    let b = if then.derive {
        Image::derived(&scratch.0.join("b"), &a, &entries, &then.entries)
    } else {
        Image::new(&scratch.0.join("b"), &then.entries)
    };
    for (cache, rootfs) in [("cache-root", true), ("cache-layers", false)] {
        let cache = scratch.0.join(cache);
        std::fs::create_dir(&cache).expect("scratch directory");
        let read = |image: &Image, cache: Option<&Path>| {
            without_cache_notes(if rootfs {
                image::read(&image.root(), &view, cache)
            } else {
                image::read_layers(&image.layers(), &view, cache)
            })
        };
        let fresh_a = read(&a, None);
        let first = read(&a, Some(&cache));
        let again = read(&a, Some(&cache));
        let fresh_b = read(&b, None);
        let after = read(&b, Some(&cache));
        if [&fresh_a, &first, &again, &fresh_b, &after]
            .into_iter()
            .any(timed_out)
        {
            return;
        }
        if first != fresh_a || again != fresh_a {
            differ(
                "an image read through the cache differs from one read without it",
                &fresh_a,
                if first != fresh_a { &first } else { &again },
                &a,
            );
        }
        if after != fresh_b {
            differ(
                "an image read through the cache after another differs from one read without it",
                &fresh_b,
                &after,
                &b,
            );
        }
    }
});

/// A directory of this run's own, removed with what it holds (links are
/// removed, not followed).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("gpuarch-fuzz-image.{}.{n}", std::process::id()));
        std::fs::create_dir(&dir).expect("scratch directory");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The merged tree, for the report of a difference.
fn walkdir(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap_or(&p).display().to_string();
            let what = match std::fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_symlink() => {
                    format!(
                        "-> {}",
                        std::fs::read_link(&p)
                            .map(|t| t.display().to_string())
                            .unwrap_or_default()
                    )
                }
                Ok(m) if m.is_dir() => {
                    stack.push(p.clone());
                    "dir".to_owned()
                }
                Ok(m) => format!("{} bytes", m.len()),
                Err(e) => e.to_string(),
            };
            out.insert(rel, what);
        }
    }
    out
}
