//! Where CRI-O keeps its containers/storage, as CRI-O itself takes it, so
//! that gpuarchd reads the store CRI-O writes without being told twice:
//!
//! 1. containers/storage's defaults (`/var/lib/containers/storage`,
//!    `/run/containers/storage`);
//! 2. `storage.conf` (`nri.storage_conf`; the default path absent,
//!    `/usr/share/containers/storage.conf`): `[storage]` `graphroot`,
//!    `runroot` and `imagestore`, `[storage.options]`
//!    `additionalimagestores`;
//! 3. `crio.conf` (`nri.crio_config`), then each `*.conf` of its `.d`
//!    directory in name order, later files winning: `[crio]` `root`,
//!    `runroot`, `imagestore`, and the image stores of `storage_option`
//!    (`overlay.imagestore=PATH`, `overlay.additionalimagestore=PATH`);
//!
//! An `imagestore` (images kept apart from the root) is looked in as an
//! additional image store is: the image's layers and their `l/` links
//! are there, the container's layer in the root.
//! 4. gpuarch's own `nri.storage_root` and `nri.storage_runroot` where set,
//!    and `nri.storage_image_stores` added.
//!
//! The files are root's: each is opened only if regular (a FIFO never
//! blocks), read up to [`crate::MAX_CONFIG`] ([`crate::read_toml`]), and
//! at most [`MAX_DROP_INS`] drop-ins are read. A file that cannot be read
//! or parsed, or a path that is not absolute, is skipped and said in
//! [`CrioStorage::problems`]; what the other files say still counts.

use std::path::{Path, PathBuf};

use gpuarch_core::config::{
    DEFAULT_STORAGE_CONF, DEFAULT_STORAGE_ROOT, DEFAULT_STORAGE_RUNROOT, NriConfig,
};

/// Most drop-ins of `crio.conf.d` read.
pub const MAX_DROP_INS: usize = 64;
/// Most entries of `crio.conf.d` looked at.
const MAX_ENTRIES: usize = 4096;
/// Where containers/storage's packaged config is, read where the
/// default `storage.conf` is absent.
pub const PACKAGED_STORAGE_CONF: &str = "/usr/share/containers/storage.conf";

/// A setting and where it came from (a file's path, `nri.storage_root`,
/// or `the default`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting<T> {
    pub value: T,
    pub from: String,
}

/// CRI-O's containers/storage as gpuarchd reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrioStorage {
    pub root: Setting<PathBuf>,
    pub runroot: Setting<PathBuf>,
    /// The additional image stores, gpuarch's own first.
    pub image_stores: Vec<PathBuf>,
    /// The files that could not be taken, and why.
    pub problems: Vec<String>,
}

impl CrioStorage {
    /// What `nri` and the files it names say.
    pub fn of(nri: &NriConfig) -> Self {
        let mut s = Self {
            root: setting(DEFAULT_STORAGE_ROOT.into(), "the default"),
            runroot: setting(DEFAULT_STORAGE_RUNROOT.into(), "the default"),
            image_stores: nri.storage_image_stores.clone(),
            problems: Vec::new(),
        };
        let storage_conf =
            if nri.storage_conf == Path::new(DEFAULT_STORAGE_CONF) && !nri.storage_conf.exists() {
                PathBuf::from(PACKAGED_STORAGE_CONF)
            } else {
                nri.storage_conf.clone()
            };
        if let Some(doc) = s.read(&storage_conf) {
            s.take_storage_conf(&doc, &storage_conf);
        }
        for f in crio_files(&nri.crio_config, &mut s.problems) {
            if let Some(doc) = s.read(&f) {
                s.take_crio_conf(&doc, &f);
            }
        }
        if let Some(r) = &nri.storage_root {
            s.root = setting(r.clone(), "nri.storage_root");
        }
        if let Some(r) = &nri.storage_runroot {
            s.runroot = setting(r.clone(), "nri.storage_runroot");
        }
        let mut seen = std::collections::HashSet::new();
        s.image_stores.retain(|p| seen.insert(p.clone()));
        s
    }

    /// The TOML document of `path`; None, the reason kept, where it cannot
    /// be had, and silently where there is no such file.
    fn read(&mut self, path: &Path) -> Option<toml::Table> {
        crate::read_toml(path).unwrap_or_else(|e| {
            self.problems.push(e);
            None
        })
    }

    fn take_storage_conf(&mut self, doc: &toml::Table, path: &Path) {
        let Some(storage) = doc.get("storage").and_then(toml::Value::as_table) else {
            return;
        };
        let from = path.display().to_string();
        self.take_roots(storage, "graphroot", &from);
        let stores = storage
            .get("options")
            .and_then(|o| o.get("additionalimagestores"))
            .and_then(toml::Value::as_array);
        for v in stores.into_iter().flatten() {
            if let Some(p) = self.absolute(v.as_str(), "additionalimagestores", &from) {
                self.image_stores.push(p);
            }
        }
    }

    /// The root (`root_key`), `runroot` and `imagestore` of `table`. Images
    /// kept apart from the root are found there as an additional image
    /// store's are.
    fn take_roots(&mut self, table: &toml::Table, root_key: &str, from: &str) {
        if let Some(p) = self.path(table, root_key, from) {
            self.root = setting(p, from);
        }
        if let Some(p) = self.path(table, "runroot", from) {
            self.runroot = setting(p, from);
        }
        if let Some(p) = self.path(table, "imagestore", from) {
            self.image_stores.push(p);
        }
    }

    fn take_crio_conf(&mut self, doc: &toml::Table, path: &Path) {
        let Some(crio) = doc.get("crio").and_then(toml::Value::as_table) else {
            return;
        };
        let from = path.display().to_string();
        self.take_roots(crio, "root", &from);
        let options = crio.get("storage_option").and_then(toml::Value::as_array);
        for o in options
            .into_iter()
            .flatten()
            .filter_map(toml::Value::as_str)
        {
            // `DRIVER.imagestore=PATH`, as containers/storage's drivers
            // take an additional image store.
            let Some((key, value)) = o.split_once('=') else {
                continue;
            };
            let key = key.trim();
            let name = key.rsplit('.').next().unwrap_or(key);
            let store = ["imagestore", "additionalimagestore"]
                .iter()
                .any(|n| name.eq_ignore_ascii_case(n));
            if store && let Some(p) = self.absolute(Some(value.trim()), key, &from) {
                self.image_stores.push(p);
            }
        }
    }

    /// `table[key]` as an absolute path; an empty string is unset.
    fn path(&mut self, table: &toml::Table, key: &str, from: &str) -> Option<PathBuf> {
        let v = table.get(key)?;
        let Some(s) = v.as_str() else {
            self.problems
                .push(format!("{from}: {key} is not a string; not taken"));
            return None;
        };
        self.absolute(Some(s), key, from)
    }

    fn absolute(&mut self, s: Option<&str>, key: &str, from: &str) -> Option<PathBuf> {
        let s = s.filter(|s| !s.is_empty())?;
        if Path::new(s).is_absolute() {
            Some(PathBuf::from(s))
        } else {
            self.problems.push(format!(
                "{from}: {key} {s:.200?} is not an absolute path; not taken"
            ));
            None
        }
    }
}

fn setting(value: PathBuf, from: &str) -> Setting<PathBuf> {
    Setting {
        value,
        from: from.to_owned(),
    }
}

/// `crio.conf`, then its drop-ins (`*.conf` of `<crio.conf>.d`) in name
/// order, as CRI-O reads them, later files winning; at most
/// [`MAX_DROP_INS`] of them, the rest said in `problems`.
pub fn crio_files(crio_conf: &Path, problems: &mut Vec<String>) -> Vec<PathBuf> {
    let mut files = vec![crio_conf.to_owned()];
    let mut dir = crio_conf.as_os_str().to_owned();
    dir.push(".d");
    let dir = PathBuf::from(dir);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return files;
    };
    // Every name is sorted before the first are taken; a directory of
    // more than MAX_ENTRIES is cut in the order the kernel lists it.
    let mut more: Vec<PathBuf> = entries
        .flatten()
        .take(MAX_ENTRIES)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "conf"))
        .collect();
    more.sort();
    if more.len() > MAX_DROP_INS {
        problems.push(format!(
            "{}: over {MAX_DROP_INS} drop-ins; those after {} not read",
            dir.display(),
            more[MAX_DROP_INS - 1].display()
        ));
        more.truncate(MAX_DROP_INS);
    }
    files.extend(more);
    files
}

#[cfg(test)]
mod tests;
