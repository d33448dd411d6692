//! A package's `manifest.json` as the hook reads it: either shape
//! ([`gpuarch_wire::manifest`]), at most 1 MiB, every target parsed and
//! every path and name checked before anything is mounted.

use std::path::{Path, PathBuf};

use gpuarch_core::arch::Target;
use gpuarch_core::config::valid_package_name as valid_name;
use gpuarch_wire::manifest as wire;

pub(super) const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// What the hook reads of a package's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageManifest {
    pub targets: Vec<Target>,
    pub libraries: Vec<String>,
    /// Builds in the kernel store, when gpuarchd published the package.
    pub builds: Option<Vec<PublishedBuild>>,
    pub version: String,
    /// Files an admin imported: served by whatever runs (PTX too), never
    /// requested.
    pub imported: bool,
    /// One imported file for all the container's GPUs, in its loader cache.
    pub ldconfig: bool,
}

/// One build of a published package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedBuild {
    pub arch: Target,
    pub variant: String,
    pub dtype: Option<String>,
    pub dir: PathBuf,
    pub files: Vec<String>,
    /// The store entry's key.
    pub key: String,
    /// Its directory in the container's view: the arch of a build, the
    /// file name of an import (one file carries several archs).
    pub view: String,
}

/// Why a package's manifest could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PackageManifestError {
    #[error(transparent)]
    Read(#[from] crate::context::ReadError),
    #[error(transparent)]
    Format(#[from] wire::ManifestError),
    #[error("target {target:?}: {error}")]
    Target {
        target: String,
        error: gpuarch_core::arch::ArchError,
    },
    #[error("build dir {0} is not absolute")]
    RelativeDir(PathBuf),
    #[error("library directory {0:?} is not a relative path inside the package")]
    Library(String),
}

fn target(t: &str) -> Result<Target, PackageManifestError> {
    Target::parse(t).map_err(|error| PackageManifestError::Target {
        target: t.to_owned(),
        error,
    })
}

fn read_build(b: wire::Build, imported: bool) -> Result<PublishedBuild, PackageManifestError> {
    if !b.dir.is_absolute() {
        return Err(PackageManifestError::RelativeDir(b.dir));
    }
    let arch = target(&b.arch)?;
    let view = if imported {
        if !valid_name(&b.variant) {
            return Err(PackageManifestError::Library(b.variant));
        }
        b.variant.clone()
    } else {
        arch.to_string()
    };
    Ok(PublishedBuild {
        view,
        arch,
        variant: b.variant,
        dtype: b.dtype,
        dir: b.dir,
        files: b.files.into_iter().filter(|f| valid_name(f)).collect(),
        key: b.key,
    })
}

/// A library directory must stay inside its package: relative, plain names.
fn valid_subdir(d: &str) -> bool {
    !d.is_empty() && d.len() <= 256 && d.split('/').all(valid_name)
}

/// Read `manifest.json` (at most 1 MiB), either shape
/// ([`gpuarch_wire::manifest`]).
pub fn read_manifest(manifest: &Path) -> Result<PackageManifest, PackageManifestError> {
    let f = std::fs::File::open(manifest).map_err(crate::context::ReadError::from)?;
    let bytes = crate::context::read_at_most(f, MAX_MANIFEST_BYTES)?;
    match wire::read(&bytes)? {
        wire::Manifest::HandMade(h) => Ok(PackageManifest {
            targets: h
                .targets
                .iter()
                .map(|t| target(t))
                .collect::<Result<_, _>>()?,
            libraries: h
                .libraries
                .into_iter()
                .map(|d| {
                    if valid_subdir(&d) {
                        Ok(d)
                    } else {
                        Err(PackageManifestError::Library(d))
                    }
                })
                .collect::<Result<_, _>>()?,
            builds: None,
            version: h.version.unwrap_or_default(),
            imported: false,
            ldconfig: false,
        }),
        wire::Manifest::Published(p) => Ok(PackageManifest {
            targets: p
                .targets
                .iter()
                .map(|t| target(t))
                .collect::<Result<_, _>>()?,
            libraries: Vec::new(),
            builds: Some(
                p.builds
                    .into_iter()
                    .map(|b| read_build(b, p.imported))
                    .collect::<Result<_, _>>()?,
            ),
            version: p.version,
            imported: p.imported,
            ldconfig: p.ldconfig,
        }),
    }
}
