//! containerd's config as containerd itself merges it, for the drop-in that
//! wires gpuarch as a CRI runtime handler and for `doctor`.
//!
//! containerd reads `config.toml`, then each file its `imports` name (globs
//! allowed), in order. containerd 1.x (config version 2) merges imports one
//! plugin section at a time: a drop-in that declares anything under the CRI
//! plugin replaces the admin's whole CRI section, and once the section has a
//! `runtimes` table the built-in `runc` entry is gone, so CRI refuses to load
//! (`no corresponding runtime configured in containerd.runtimes for
//! containerd default_runtime_name = "runc"`). containerd 2.x (version 3)
//! merges keys deeply. The drop-in written here therefore carries, for 1.x,
//! the admin's whole CRI section with `runc` kept and gpuarch added (so it
//! must be written again when that section changes; `doctor` says when),
//! and, for 2.x, only the two runtimes.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, bail};
use toml::{Table, Value};

/// The runtime handler pods name in their RuntimeClass.
pub const HANDLER: &str = "gpuarch";
/// Where the drop-in goes; containerd 2.x's default config imports it.
pub const DROPIN: &str = "/etc/containerd/conf.d/gpuarch.toml";
const RUNC_V2: &str = "io.containerd.runc.v2";

/// The CRI plugin's id in a config of `version`.
fn cri_id(version: i64) -> Result<&'static str> {
    match version {
        2 => Ok("io.containerd.grpc.v1.cri"),
        3 => Ok("io.containerd.cri.v1.runtime"),
        1 => bail!(
            "config version 1 (no `version =` line): convert it with `containerd config migrate` first"
        ),
        v => bail!("config version {v} is not one containerd 1.6 to 2.x reads"),
    }
}

/// Root's own file, read as gpuarchd reads CRI-O's: bounded, and a FIFO
/// never blocks doctor.
fn read(path: &Path) -> Result<Table> {
    gpuarch_fs::read_toml(path)
        .map_err(|e| anyhow!(e))?
        .ok_or_else(|| anyhow!("{}: no such file", path.display()))
}

/// `pattern`'s matches, sorted: a `*` or `?` only in the last component,
/// as containerd's imports are written.
fn glob(pattern: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (pattern.parent(), pattern.file_name()) else {
        return Vec::new();
    };
    let name = name.to_string_lossy();
    if !name.contains(['*', '?']) {
        return if pattern.exists() {
            vec![pattern.to_owned()]
        } else {
            Vec::new()
        };
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| wildcard(&name, &e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

fn wildcard(p: &str, s: &str) -> bool {
    match (p.chars().next(), s.chars().next()) {
        (None, None) => true,
        (Some('*'), _) => {
            wildcard(&p[1..], s)
                || (!s.is_empty() && wildcard(p, &s[s.chars().next().map_or(1, char::len_utf8)..]))
        }
        (Some('?'), Some(c)) => wildcard(&p[1..], &s[c.len_utf8()..]),
        (Some(a), Some(b)) if a == b => wildcard(&p[a.len_utf8()..], &s[b.len_utf8()..]),
        _ => false,
    }
}

fn same(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// `p` as containerd resolves it from `main`, on a host at `root`.
/// containerd 1.x resolves a relative glob from its working directory
/// (`/` under systemd), not from the config's directory as 2.x does.
fn resolve(root: &Path, main: &Path, doc: &Table, p: &str) -> PathBuf {
    match Path::new(p).strip_prefix("/") {
        Ok(rel) => root.join(rel),
        Err(_) if version(doc) == 2 && p.contains(['*', '?']) => root.join(p),
        Err(_) => main.parent().unwrap_or(root).join(p),
    }
}

fn version(doc: &Table) -> i64 {
    doc.get("version").and_then(Value::as_integer).unwrap_or(1)
}

/// The files containerd reads for `main`, in order, less `skip`.
fn imports(root: &Path, main: &Path, doc: &Table, skip: Option<&Path>) -> Vec<PathBuf> {
    doc.get("imports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .flat_map(|p| glob(&resolve(root, main, doc, p)))
        .filter(|p| !same(p, main) && !skip.is_some_and(|s| same(p, s)))
        .collect()
}

/// Does one of `main`'s imports read `file`?
fn imported(root: &Path, main: &Path, doc: &Table, file: &Path) -> bool {
    doc.get("imports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|p| {
            let pat = resolve(root, main, doc, p);
            pat == file
                || (pat.parent() == file.parent()
                    && wildcard(
                        &pat.file_name().unwrap_or_default().to_string_lossy(),
                        &file.file_name().unwrap_or_default().to_string_lossy(),
                    ))
        })
}

fn deep_merge(to: &mut Table, from: &Table) {
    for (k, v) in from {
        match (to.get_mut(k), v) {
            (Some(Value::Table(t)), Value::Table(f)) => deep_merge(t, f),
            _ => {
                to.insert(k.clone(), v.clone());
            }
        }
    }
}

/// containerd's view of its config: the version, and the CRI plugin's
/// section after every import (`skip` left out), as that version merges.
#[derive(Debug)]
pub struct Effective {
    pub version: i64,
    pub cri: Table,
    main: Table,
    /// The host's `/`, where the handlers' programs are looked at.
    root: std::path::PathBuf,
}

/// [`Effective`] for the containerd reading `main` on a host whose `/` is
/// `root`, without the file `skip` (the drop-in being written).
pub fn effective(root: &Path, main: &Path, skip: Option<&Path>) -> Result<Effective> {
    let doc = read(main)?;
    let version = version(&doc);
    let id = cri_id(version)?;
    let section = |d: &Table| {
        d.get("plugins")
            .and_then(|p| p.get(id))
            .and_then(Value::as_table)
            .cloned()
    };
    let mut cri = section(&doc).unwrap_or_default();
    for f in imports(root, main, &doc, skip) {
        let d = read(&f)?;
        if let Some(s) = section(&d) {
            if version == 2 {
                cri = s; // 1.x: the import's section replaces the whole
            } else {
                deep_merge(&mut cri, &s);
            }
        }
    }
    Ok(Effective {
        version,
        cri,
        main: doc,
        root: root.to_owned(),
    })
}

impl Effective {
    /// Does this config, read from `main` on the host at `root`, import
    /// `file`?
    pub fn reads_file(&self, root: &Path, main: &Path, file: &Path) -> bool {
        imported(root, main, &self.main, file)
    }

    fn runtimes(&self) -> Option<&Table> {
        self.cri
            .get("containerd")
            .and_then(|c| c.get("runtimes"))
            .and_then(Value::as_table)
    }

    pub fn default_runtime(&self) -> String {
        self.cri
            .get("containerd")
            .and_then(|c| c.get("default_runtime_name"))
            .and_then(Value::as_str)
            .unwrap_or("runc")
            .to_owned()
    }

    /// Why CRI would not load, if it would not: its default runtime must be
    /// declared (runc is built in only while no `runtimes` table exists,
    /// in 1.x).
    pub fn cri_problem(&self) -> Option<String> {
        let name = self.default_runtime();
        match self.runtimes() {
            None if name == "runc" => None,
            Some(r) if r.contains_key(&name) => None,
            Some(_) if name == "runc" && self.version == 3 => None,
            _ => Some(format!(
                "CRI will not load: default_runtime_name = \"{name}\" has no containerd.runtimes.{name} entry (declaring any runtimes table drops the built-in runc)"
            )),
        }
    }

    /// The BinaryName of handler `name`, if it has one.
    pub fn handler_binary(&self, name: &str) -> Option<String> {
        self.runtimes()?
            .get(name)?
            .get("options")?
            .get("BinaryName")?
            .as_str()
            .map(str::to_owned)
    }

    /// The handlers whose BinaryName is a gpuarch-runtime.
    pub fn gpuarch_handlers(&self) -> Vec<String> {
        self.runtimes()
            .into_iter()
            .flatten()
            .filter(|(_, r)| {
                r.get("options")
                    .and_then(|o| o.get("BinaryName"))
                    .and_then(Value::as_str)
                    .is_some_and(|b| super::is_gpuarch_runtime(&self.root, b))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// The drop-in for `main`'s containerd, and what the admin must still do.
#[derive(Debug)]
pub struct DropIn {
    pub text: String,
    pub notes: Vec<String>,
    /// The `imports` entry `main` still needs for containerd to read the
    /// drop-in at all (its path as containerd sees it), if any.
    pub import: Option<String>,
}

/// The drop-in that adds `handler`, running `runtime`, beside runc, for
/// the containerd reading `main` on a host whose `/` is `root`, to be
/// written at `output`.
pub fn containerd_dropin(
    root: &Path,
    main: &Path,
    runtime: &Path,
    handler: &str,
    output: &Path,
) -> Result<DropIn> {
    let eff = effective(root, main, Some(output))?;
    let id = cri_id(eff.version)?;
    let mut notes = Vec::new();
    let runtimes = eff.runtimes().cloned().unwrap_or_default();
    let runc = runtimes.get("runc").and_then(Value::as_table).cloned();
    let runc_declared = runc.is_some();
    let runc = runc.unwrap_or_else(|| {
        let mut t = Table::new();
        t.insert("runtime_type".into(), Value::from(RUNC_V2));
        t
    });
    // gpuarch runs as runc does (its cgroup driver above all: kubelet's
    // systemd driver needs SystemdCgroup = true here too), through the shim.
    let mut ours = runc.clone();
    if ours.get("runtime_type").and_then(Value::as_str) != Some(RUNC_V2) {
        notes.push(format!(
            "runc's runtime_type is not {RUNC_V2}: {handler} uses {RUNC_V2}, which BinaryName needs"
        ));
        ours.insert("runtime_type".into(), Value::from(RUNC_V2));
    }
    let mut options = ours
        .get("options")
        .and_then(Value::as_table)
        .cloned()
        .unwrap_or_default();
    if let Some(bin) = options.get("BinaryName").and_then(Value::as_str) {
        notes.push(format!(
            "runc runs {bin}: set `runtime: {{path: {bin}}}` in /etc/gpuarch/config.yaml so gpuarch-runtime runs it too"
        ));
    }
    options.insert(
        "BinaryName".into(),
        Value::from(runtime.display().to_string()),
    );
    ours.insert("options".into(), Value::Table(options));

    let cri = if eff.version == 2 {
        let mut cri = eff.cri.clone();
        let ctd = cri
            .entry("containerd")
            .or_insert_with(|| Value::Table(Table::new()));
        let Value::Table(ctd) = ctd else {
            bail!(
                "{}: plugins.\"{id}\".containerd is not a table",
                main.display()
            );
        };
        let rt = ctd
            .entry("runtimes")
            .or_insert_with(|| Value::Table(Table::new()));
        let Value::Table(rt) = rt else {
            bail!("{}: containerd.runtimes is not a table", main.display());
        };
        rt.insert("runc".into(), Value::Table(runc));
        rt.insert(handler.into(), Value::Table(ours));
        cri
    } else {
        let mut rt = Table::new();
        if !runc_declared {
            rt.insert("runc".into(), Value::Table(runc));
        }
        rt.insert(handler.into(), Value::Table(ours));
        let mut ctd = Table::new();
        ctd.insert("runtimes".into(), Value::Table(rt));
        let mut cri = Table::new();
        cri.insert("containerd".into(), Value::Table(ctd));
        cri
    };
    let mut plugins = Table::new();
    plugins.insert(id.into(), Value::Table(cri));
    let mut doc = Table::new();
    doc.insert("version".into(), Value::from(eff.version));
    doc.insert("plugins".into(), Value::Table(plugins));

    if eff.version == 2
        && let Some(rel) = eff
            .main
            .get("imports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find(|p| !p.starts_with('/') && p.contains(['*', '?']))
    {
        notes.push(format!(
            "import \"{rel}\": containerd 1.x finds a relative glob from its working directory, not from the config's: write it absolute"
        ));
    }
    let import = (!imported(root, main, &eff.main, output)).then(|| import_for(root, output));
    let how = if eff.version == 2 {
        format!(
            "# containerd 1.x replaces a plugin's whole section with an import's, so this\n\
             # is {}'s CRI section, with runc kept and {handler} added.\n\
             # Written again by the same command after that section changes\n\
             # (`gpuarchctl doctor` says when).\n",
            main.display()
        )
    } else {
        "# containerd 2.x merges imports key by key: only the runtimes are here.\n".to_owned()
    };
    let text = format!(
        "# The gpuarch runtime handler \"{handler}\" for containerd's CRI (Kubernetes\n\
         # RuntimeClass handler: {handler}). Written by:\n\
         #   gpuarchctl engine containerd --config {} --write {}\n{how}{}",
        main.display(),
        output.display(),
        toml::to_string(&doc)?
    );
    Ok(DropIn {
        text,
        notes,
        import,
    })
}

/// The `imports` entry that reads the drop-in at `path` (on the host at
/// `root`): a glob matching it, because containerd refuses to start when a
/// plain path it imports is missing, and the drop-in may be removed later;
/// one narrow enough (`gpuarch*.toml`) not to pull in the admin's other
/// files beside it.
fn import_for(root: &Path, path: &Path) -> String {
    let seen = match path.strip_prefix(root) {
        Ok(rel) if root != Path::new("/") => Path::new("/").join(rel),
        _ => path.to_owned(),
    };
    let name = match (seen.file_stem(), seen.extension()) {
        (Some(stem), Some(ext)) => format!("{}*.{}", stem.display(), ext.display()),
        _ => format!("{}*", seen.file_name().unwrap_or_default().display()),
    };
    seen.with_file_name(name).display().to_string()
}

/// `text`, a containerd config, with `entry` added to its `imports`:
/// appended to the array, or a new top-level key (TOML puts it before the
/// first table). Everything else, comments and layout included, stays.
pub fn add_import(text: &str, entry: &str) -> Result<String> {
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| anyhow!("not TOML: {}", e.message()))?;
    match doc.get_mut("imports") {
        None => {
            let mut list = toml_edit::Array::new();
            list.push(entry);
            let key = toml_edit::Key::new("imports").with_leaf_decor(toml_edit::Decor::new(
                "# Added by `gpuarchctl engine containerd --write`: containerd reads\n\
                 # gpuarch's runtime handler from this file.\n",
                " ",
            ));
            doc.insert_formatted(&key, toml_edit::value(list));
        }
        Some(item) => {
            let Some(list) = item.as_array_mut() else {
                bail!("its `imports` is not a list of paths");
            };
            if !list.iter().any(|v| v.as_str() == Some(entry)) {
                list.push(entry);
            }
        }
    }
    Ok(doc.to_string())
}

/// The edit an admin makes by hand so that `main` imports `entry`.
pub fn import_by_hand(main: &Path, entry: &str) -> String {
    let has = read(main)
        .map(|d| d.contains_key("imports"))
        .unwrap_or(false);
    if has {
        format!(
            "add \"{entry}\" to the `imports = [...]` list in {}",
            main.display()
        )
    } else {
        format!(
            "add this line to {} above its first [table]:\n    imports = [\"{entry}\"]",
            main.display()
        )
    }
}

/// For a 1.x drop-in at `dropin`: has the CRI section it copied changed
/// since it was written (so the drop-in now hides the change)?
pub fn stale(root: &Path, main: &Path, dropin: &Path) -> Result<bool> {
    let now = effective(root, main, Some(dropin))?;
    if now.version != 2 {
        return Ok(false);
    }
    let written = effective(root, dropin, None)?;
    let strip = |cri: &Table| {
        let mut c = cri.clone();
        if let Some(Value::Table(ctd)) = c.get_mut("containerd")
            && let Some(Value::Table(rt)) = ctd.get_mut("runtimes")
        {
            rt.retain(|_, r| {
                r.get("options")
                    .and_then(|o| o.get("BinaryName"))
                    .and_then(Value::as_str)
                    .is_none_or(|b| !super::is_gpuarch_runtime(root, b))
            });
            rt.remove("runc");
            if rt.is_empty() {
                ctd.remove("runtimes");
            }
        }
        if c.get("containerd")
            .and_then(Value::as_table)
            .is_some_and(Table::is_empty)
        {
            c.remove("containerd");
        }
        c
    };
    Ok(strip(&now.cri) != strip(&written.cri))
}

/// containerd, wired by a CRI runtime handler in a drop-in it imports.
#[derive(Debug)]
pub struct Containerd;

impl super::Engine for Containerd {
    fn name(&self) -> &'static str {
        "containerd"
    }

    fn program(&self) -> &'static str {
        "containerd"
    }

    fn wiring(&self, root: &Path) -> Vec<crate::check::Check> {
        vec![wiring(root)]
    }
}

/// The CRI plugin loads and a handler runs gpuarch-runtime, read as
/// containerd merges its config; a drop-in containerd does not read, or an
/// out-of-date one, is named with its fix.
fn wiring(root: &Path) -> crate::check::Check {
    use super::EXAMPLES;
    use crate::check::{fail, ok, under};
    const NAME: &str = "containerd";
    let file = under(root, Path::new("/etc/containerd/config.toml"));
    let fix = format!(
        "gpuarchctl engine containerd --write (a drop-in at {}), systemctl restart containerd, and give pods runtimeClassName: gpuarch ({EXAMPLES}/containerd/runtimeclass.yaml)",
        DROPIN
    );
    // Docker's containerd (docker.io pulls it in) with no kubelet to use
    // its CRI: nothing of gpuarch's to wire, and nothing wrong.
    let kubelet = [
        "/usr/bin/kubelet",
        "/usr/local/bin/kubelet",
        "/var/lib/kubelet",
    ]
    .iter()
    .find(|p| under(root, Path::new(p)).exists());
    let no_cri_user = |why: String| {
        crate::check::skip(
            NAME,
            format!(
                "{why}, and no kubelet here uses its CRI (Docker's own containerd needs no handler); \
                 for Kubernetes: {fix}"
            ),
        )
    };
    if !file.exists() {
        if kubelet.is_none() {
            return no_cri_user(format!("{} does not exist", file.display()));
        }
        return fail(NAME, format!("{} does not exist", file.display()), fix);
    }
    let eff = match effective(root, &file, None) {
        Ok(e) => e,
        Err(e) => return fail(NAME, format!("{e:#}"), "correct the file"),
    };
    if let Some(problem) = eff.cri_problem() {
        return fail(NAME, problem, fix);
    }
    let handlers = eff.gpuarch_handlers();
    let dropin = under(root, Path::new(DROPIN));
    if handlers.is_empty() && dropin.exists() && !eff.reads_file(root, &file, &dropin) {
        return fail(
            NAME,
            format!(
                "{} does not import {}, so containerd never reads gpuarch's handler",
                file.display(),
                dropin.display()
            ),
            "gpuarchctl engine containerd --write (it adds the imports entry, keeping a backup), then systemctl restart containerd",
        );
    }
    if handlers.is_empty() {
        let why = format!(
            "{}: no CRI runtime handler runs gpuarch-runtime",
            file.display()
        );
        if kubelet.is_none() {
            return no_cri_user(why);
        }
        return fail(NAME, why, fix);
    }
    if dropin.exists() && stale(root, &file, &dropin).unwrap_or(false) {
        return fail(
            NAME,
            format!(
                "{} holds an older copy of {}'s CRI section, and containerd 1.x reads only the copy",
                dropin.display(),
                file.display()
            ),
            fix,
        );
    }
    ok(
        NAME,
        format!(
            "CRI loads; runtime handler {} runs gpuarch-runtime",
            handlers.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests;
