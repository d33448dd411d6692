//! Where an image's Python would import from: the site directories of the
//! interpreters its process finds, found as Python itself finds them, and
//! of the places Python is usually installed.
//!
//! From the container's process (its env and user):
//! - each `python3` and `python` on its `PATH`: a venv where `pyvenv.cfg`
//!   is beside its `bin` (and the base's too where the venv includes the
//!   system site), else the prefix its link chain ends in (`bin/..`);
//! - `VIRTUAL_ENV` and `CONDA_PREFIX`, as prefixes;
//! - each directory of `PYTHONPATH`;
//! - the user site: `PYTHONUSERBASE`, else `~/.local` of `HOME`, else of
//!   the home `/etc/passwd` gives the process's uid.
//!
//! Then the usual prefixes (`/usr`, `/usr/local`, conda's base and its
//! `envs/*`, `/opt/venv`, `/venv`, uv's `/app/.venv`) and `/root/.local`.
//! A prefix's sites are `lib/python3*/{site,dist}-packages` and the same
//! under `lib64` (RHEL); Debian's `/usr/lib/python3/dist-packages` too.
//!
//! Every path is resolved inside the rootfs ([`Root`]). An interpreter
//! whose environment cannot be found or read is recorded as unread: then
//! no consumer's absence is proven (`Software::unread`).

use std::path::{Component, Path};

use gpuarch_core::oci::ContainerView;
use nix::errno::Errno;

use super::tree::Tree;
use super::{Budget, Stop};

/// Most entries of `PATH` and of `PYTHONPATH` looked at.
const MAX_PATH_ENTRIES: usize = 32;
/// Most site directories read.
pub const MAX_SITES: usize = 64;
/// Most users of `/etc/passwd` whose user sites are read, where the
/// process's user is not known.
const MAX_USERS: usize = 32;
/// Most links followed from an interpreter's name to its file.
const MAX_LINKS: usize = 16;
/// Most bytes of `pyvenv.cfg` and of `/etc/passwd` read.
const MAX_SMALL_FILE: usize = 64 << 10;
/// The `PATH` a process gets where its env sets none (runc's, Docker's).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Prefixes Python is usually installed at, beside what the process names.
const USUAL_PREFIXES: [&str; 8] = [
    "usr",
    "usr/local",
    "opt/conda",
    "opt/miniconda3",
    "opt/miniforge3",
    "opt/venv",
    "venv",
    "app/.venv",
];
/// Conda installations whose `envs/*` are environments.
const CONDA_BASES: [&str; 3] = ["opt/conda", "opt/miniconda3", "opt/miniforge3"];

/// A site directory found: its path inside the image and a handle on it.
pub struct Site<D> {
    pub rel: String,
    pub dir: D,
}

/// What [`discover`] found.
pub struct Found<D> {
    pub sites: Vec<Site<D>>,
    /// Environments an interpreter would import from that were not read,
    /// and why.
    pub unread: Vec<String>,
}

/// A prefix to look for sites under, and the interpreter that made it
/// required (one whose sites must be found, or the read is incomplete).
struct Prefix {
    rel: String,
    by: Option<String>,
}

/// `path` made relative to the image's `/`, `..` taken lexically (the
/// result is only ever opened inside the rootfs). None for a relative
/// path, which names nothing the image fixes.
pub fn rel_of(path: &Path) -> Option<String> {
    if !path.is_absolute() {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_str()?),
            Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    Some(parts.join("/"))
}

pub(super) fn parent(rel: &str) -> &str {
    rel.rsplit_once('/').map_or("", |(p, _)| p)
}

/// A path of the image as a note shows it: quoted, control characters
/// escaped, at most 160 characters.
fn shown(rel: &str) -> String {
    let s: String = format!("/{rel}").chars().take(160).collect();
    format!("{s:?}")
}

/// The file an interpreter's name leads to, following its links inside the
/// image (relative ones from the link's directory).
fn resolve<T: Tree>(root: &T, rel: &str) -> String {
    let mut at = rel.to_owned();
    for _ in 0..MAX_LINKS {
        let Ok(target) = root.read_link(&at) else {
            break;
        };
        let next = if target.is_absolute() {
            rel_of(&target)
        } else {
            rel_of(&Path::new("/").join(parent(&at)).join(&target))
        };
        match next {
            Some(n) => at = n,
            None => break,
        }
    }
    at
}

/// `home` of a venv's `pyvenv.cfg`, where it includes the system site.
fn venv_base<T: Tree>(root: &T, venv: &str) -> Option<Option<String>> {
    let text = root
        .read_regular(&format!("{venv}/pyvenv.cfg"), MAX_SMALL_FILE)
        .ok()?;
    let text = String::from_utf8_lossy(&text);
    let get = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        })
    };
    let system = get("include-system-site-packages").is_some_and(|v| v == "true");
    Some(
        get("home")
            .filter(|_| system)
            .and_then(|h| rel_of(Path::new(&h)))
            .map(|bin| parent(&bin).to_owned()),
    )
}

/// The home directory of `uid` in the image's `/etc/passwd`.
fn passwd_home<T: Tree>(root: &T, uid: Option<u32>) -> Option<String> {
    passwd(root, |u| u == uid).into_iter().next()
}

/// The home directories of every user in the image's `/etc/passwd`, once
/// each, at most [`MAX_USERS`].
fn passwd_homes<T: Tree>(root: &T) -> Vec<String> {
    let mut homes = passwd(root, |_| true);
    let mut seen = std::collections::HashSet::new();
    homes.retain(|h| seen.insert(h.clone()));
    homes.truncate(MAX_USERS);
    homes
}

/// The homes of the users of `/etc/passwd` whose uid `pick` takes.
fn passwd<T: Tree>(root: &T, pick: impl Fn(Option<u32>) -> bool) -> Vec<String> {
    let Ok(text) = root.read_regular("etc/passwd", MAX_SMALL_FILE) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&text);
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 7 && pick(f[2].parse::<u32>().ok()))
                .then(|| rel_of(Path::new(f[5])))
                .flatten()
        })
        .collect()
}

/// Subdirectory names of `rel` that start with `prefix`, sorted.
fn subdirs<T: Tree>(
    root: &T,
    rel: &str,
    prefix: &str,
    budget: &mut Budget,
) -> Result<Vec<String>, Stop> {
    subdirs_once(root, rel, prefix, budget, None).map(|(names, _)| names)
}

/// [`subdirs`], taken from `listed` where it already holds the directory
/// (by identity: on a merged-/usr image `/lib` is `/usr/lib`, and both
/// prefixes `/` and `/usr` would list it), else listed and kept there.
/// Whether it was taken from `listed`: then its sites are those already
/// found through the other path.
fn subdirs_once<T: Tree>(
    root: &T,
    rel: &str,
    prefix: &str,
    budget: &mut Budget,
    listed: Option<&mut Listed>,
) -> Result<(Vec<String>, bool), Stop> {
    let Ok(dir) = root.dir(rel) else {
        return Ok((Vec::new(), false));
    };
    // Device and inode of each layer's directory.
    let id: Vec<(i64, i64)> = root.identity(&dir).iter().map(|i| (i[0], i[1])).collect();
    let listed = listed.filter(|_| !id.is_empty());
    if let Some(names) = listed.as_ref().and_then(|l| l.get(&id)) {
        return Ok((names.clone(), true));
    }
    let mut out = Vec::new();
    root.names(&dir, budget, &mut |n, _| {
        if n.starts_with(prefix) && out.len() < MAX_SITES {
            out.push(n.to_owned());
        }
    })?;
    out.sort();
    if let Some(listed) = listed {
        listed.insert(id, out.clone());
    }
    Ok((out, false))
}

/// Whether directory `rel` is there, each of its ancestors looked up
/// first, once (`seen` keeps the answers): on an image with no `/opt`, one
/// lookup answers for every prefix under it, here and in a later start's
/// check of what discovery depended on.
fn present<T: Tree>(root: &T, rel: &str, seen: &mut Seen) -> bool {
    let mut at = String::new();
    for part in rel.split('/') {
        if !at.is_empty() {
            at.push('/');
        }
        at.push_str(part);
        let here = match seen.get(&at) {
            Some(&h) => h,
            None => {
                let h = root.dir(&at).is_ok();
                seen.insert(at.clone(), h);
                h
            }
        };
        if !here {
            return false;
        }
    }
    true
}

/// Directories looked for by [`present`], and whether each is there.
type Seen = std::collections::HashMap<String, bool>;

/// Directories listed, by identity, and the names kept of each.
type Listed = std::collections::HashMap<Vec<(i64, i64)>, Vec<String>>;

/// The interpreters on `PATH` and the prefixes they make required.
fn interpreters<T: Tree>(root: &T, view: &ContainerView, prefixes: &mut Vec<Prefix>) {
    let path = view.env_get("PATH").unwrap_or(DEFAULT_PATH);
    for dir in path.split(':').take(MAX_PATH_ENTRIES) {
        let Some(dir) = rel_of(Path::new(dir)) else {
            continue;
        };
        let Ok(handle) = root.dir(&dir) else {
            continue;
        };
        // A link is taken as it is: a venv's may lead to its base's
        // interpreter in a layer not read here.
        let exes: Vec<String> = ["python3", "python"]
            .into_iter()
            .filter(|name| root.has_entry(&handle, name))
            .map(|name| format!("{dir}/{name}"))
            .collect();
        let Some(first) = exes.first() else {
            continue;
        };
        // A venv is its directory's, whichever name runs it.
        let lexical = parent(&dir).to_owned();
        if let Some(base) = venv_base(root, &lexical) {
            let by = Some(shown(first));
            prefixes.push(Prefix {
                rel: lexical,
                by: by.clone(),
            });
            if let Some(base) = base {
                prefixes.push(Prefix { rel: base, by });
            }
            continue;
        }
        for exe in &exes {
            let real = resolve(root, exe);
            prefixes.push(Prefix {
                rel: parent(parent(&real)).to_owned(),
                by: Some(shown(exe)),
            });
        }
    }
}

/// `prefixes` with each path once, in first-seen order; one that an
/// interpreter made required stays required.
fn once_each(prefixes: Vec<Prefix>) -> Vec<Prefix> {
    let mut out: Vec<Prefix> = Vec::with_capacity(prefixes.len());
    for p in prefixes {
        match out.iter_mut().find(|q| q.rel == p.rel) {
            Some(q) => {
                if q.by.is_none() {
                    q.by = p.by;
                }
            }
            None => out.push(p),
        }
    }
    out
}

/// The user sites' bases: `PYTHONUSERBASE`, else `HOME/.local`, else
/// `.local` of the home `/etc/passwd` gives the process's user (`/` where
/// it gives none, as runc then sets `HOME`). Where the user is not known
/// (gpuarchd's NRI path, where the runtime does not say it), those of every
/// user in `/etc/passwd`, and `/`'s: each one the process could be.
fn user_bases<T: Tree>(root: &T, view: &ContainerView) -> Vec<String> {
    if let Some(b) = view.env_get("PYTHONUSERBASE") {
        return rel_of(Path::new(b)).into_iter().collect();
    }
    let homes: Vec<String> = match (view.env_get("HOME"), view.user) {
        (Some(h), _) => rel_of(Path::new(h)).into_iter().collect(),
        (None, Some((uid, _))) => vec![passwd_home(root, Some(uid)).unwrap_or_default()],
        (None, None) => {
            let mut all = passwd_homes(root);
            all.push(String::new());
            all
        }
    };
    homes
        .into_iter()
        .map(|h| {
            if h.is_empty() {
                ".local".to_owned()
            } else {
                format!("{h}/.local")
            }
        })
        .collect()
}

/// The site directories of the image's Python environments for the process
/// of `view`, under the budget.
pub fn discover<T: Tree>(
    root: &T,
    view: &ContainerView,
    budget: &mut Budget,
) -> Result<Found<T::Dir>, Stop> {
    let mut found = Found {
        sites: Vec::new(),
        unread: Vec::new(),
    };
    let mut prefixes = Vec::new();
    interpreters(root, view, &mut prefixes);
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(rel) = view.env_get(var).and_then(|v| rel_of(Path::new(v))) {
            prefixes.push(Prefix { rel, by: None });
        }
    }
    prefixes.extend(USUAL_PREFIXES.iter().map(|p| Prefix {
        rel: (*p).to_owned(),
        by: None,
    }));
    let mut seen = Seen::new();
    for base in CONDA_BASES {
        if !present(root, base, &mut seen) {
            continue;
        }
        for env in subdirs(root, &format!("{base}/envs"), "", budget)? {
            prefixes.push(Prefix {
                rel: format!("{base}/envs/{env}"),
                by: None,
            });
        }
    }
    let mut sites: Vec<String> = Vec::new();
    // Directories given as they are: PYTHONPATH's, then the user sites.
    let mut direct: Vec<String> = Vec::new();
    if let Some(pp) = view.env_get("PYTHONPATH") {
        for entry in pp.split(':').take(MAX_PATH_ENTRIES) {
            let Some(rel) = rel_of(Path::new(entry)) else {
                continue;
            };
            match root.is_dir(&rel) {
                Ok(true) => direct.push(rel),
                Ok(false) => found.unread.push(format!(
                    "PYTHONPATH's {}: not a directory (a zip is not read)",
                    shown(&rel)
                )),
                Err(_) => {}
            }
        }
    }
    let mut bases = vec!["root/.local".to_owned()];
    bases.extend(user_bases(root, view));
    bases.dedup();
    for base in bases {
        if !present(root, &base, &mut seen) {
            continue;
        }
        for lib in ["lib", "lib64"] {
            for py in subdirs(root, &format!("{base}/{lib}"), "python3", budget)? {
                direct.push(format!("{base}/{lib}/{py}/site-packages"));
            }
        }
    }
    // `/usr/bin/python3` and `/bin/python3` both lead to `/usr`, also a
    // usual prefix: its `lib` is listed once. So is a `lib` two prefixes
    // share (merged /usr: `/lib` is `/usr/lib`): its sites are the same
    // directories, named once, through the first.
    let mut listed = Listed::new();
    for p in &once_each(prefixes) {
        let mut any = false;
        // One an interpreter was found in is there; any other is looked
        // for from the top down.
        let there = p.by.is_some() || p.rel.is_empty() || present(root, &p.rel, &mut seen);
        for lib in ["lib", "lib64"].into_iter().filter(|_| there) {
            let at = if p.rel.is_empty() {
                lib.to_owned()
            } else {
                format!("{}/{lib}", p.rel)
            };
            let (pys, again) = subdirs_once(root, &at, "python3", budget, Some(&mut listed))?;
            for py in pys {
                any = true;
                if again {
                    continue;
                }
                for site in ["site-packages", "dist-packages"] {
                    sites.push(format!("{at}/{py}/{site}"));
                }
            }
        }
        if p.rel == "usr" {
            any = true;
            sites.push("usr/lib/python3/dist-packages".to_owned());
        }
        if let Some(by) = &p.by
            && !any
        {
            found
                .unread
                .push(format!("{by}: no lib/python3.* under {}", shown(&p.rel)));
        }
    }
    sites.extend(direct);
    // Once each, however many names lead there (`python3` beside
    // `python3.12`, a symlinked `lib`, a venv's `lib64 -> lib`).
    let mut seen = std::collections::HashSet::new();
    let mut named = std::collections::HashSet::new();
    for rel in sites {
        if !named.insert(rel.clone()) {
            continue;
        }
        if found.sites.len() >= MAX_SITES {
            found
                .unread
                .push(format!("over {MAX_SITES} site directories"));
            break;
        }
        let dir = match root.dir(&rel) {
            Ok(d) => d,
            Err(Errno::ENOENT | Errno::ENOTDIR) => continue,
            Err(e) => {
                found.unread.push(format!("{}: {e}", shown(&rel)));
                continue;
            }
        };
        let same: Vec<(i64, i64)> = root.identity(&dir).iter().map(|i| (i[0], i[1])).collect();
        if seen.insert(same) {
            found.sites.push(Site { rel, dir });
        }
    }
    found.unread.sort();
    found.unread.dedup();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_taken_inside_the_image() {
        assert_eq!(rel_of(Path::new("/a/b/../c")).as_deref(), Some("a/c"));
        assert_eq!(rel_of(Path::new("/../../etc")).as_deref(), Some("etc"));
        assert_eq!(rel_of(Path::new("/")).as_deref(), Some(""));
        assert_eq!(rel_of(Path::new("rel/x")), None);
        assert_eq!(parent("a/b/c"), "a/b");
        assert_eq!(parent("a"), "");
    }
}
