//! A kernel package's `manifest.json` under `kernels.mount_root`.
//!
//! Two shapes, told apart by `schema`:
//! - without it, a package an admin laid out by hand: the SASS/PTX
//!   `targets` its files carry, and optionally the `libraries` directories
//!   holding shared libraries, a `version` and a `description`;
//! - with `schema: 2`, a package gpuarchd published from its store: every
//!   served build (arch, variant, the store entry's directory and files),
//!   and what is unavailable or pending, per arch.
//!
//! gpuarchd writes [`Published`]; the hook reads either with [`read`]. A
//! schema it does not know, a field it does not know, or a missing field is
//! an error naming it: the hook then skips the package with that note.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The schema gpuarchd writes and the hook reads.
pub const SCHEMA: u32 = 2;

/// A package published by gpuarchd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Published {
    /// Always [`SCHEMA`].
    pub schema: u32,
    pub package: String,
    pub version: String,
    pub description: String,
    /// The arch of each build, in the order of `builds`.
    pub targets: Vec<String>,
    pub builds: Vec<Build>,
    /// Variants that cannot be built for an arch, and why.
    pub unavailable: Vec<Unavailable>,
    /// Arches with no build yet, and why.
    pub pending: Vec<Pending>,
    /// Files an admin imported (`gpuarchctl kernels import`), not builds:
    /// each `builds` entry is one target a file carries (`variant` is the
    /// file's name), PTX included; nothing is requested when a GPU has no
    /// build.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub imported: bool,
    /// Imported with `--ldconfig`: one file serves all of a container's
    /// GPUs, and its directory goes into the container's loader cache.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ldconfig: bool,
}

/// One served build: a verified entry of the kernel store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Build {
    /// `sm_86`.
    pub arch: String,
    pub variant: String,
    /// The variant's dtype, if the package has dtype variants.
    pub dtype: Option<String>,
    /// The store key.
    pub key: String,
    /// The store entry's directory (absolute).
    pub dir: PathBuf,
    /// The entry's files, by name.
    pub files: Vec<String>,
    /// The compiler that built it.
    pub toolkit: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unavailable {
    pub arch: String,
    pub variant: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pending {
    pub arch: String,
    pub reason: String,
}

/// A package laid out by hand: no `schema`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandMade {
    /// Its name; the directory's name is what counts.
    #[serde(default)]
    pub package: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// The targets its files carry: `sm_75`, `compute_80`, ...
    pub targets: Vec<String>,
    /// Directories of the package holding shared libraries (`lib`).
    #[serde(default)]
    pub libraries: Vec<String>,
}

/// A view's directory name under `kernels.view_dir`: the lowercase hex of
/// the sha256 of what it holds. The hook names views so; gpuarchd sweeps
/// only directories named so.
pub fn view_name(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `name` is a view's name ([`view_name`]'s form).
pub fn is_view_name(name: &str) -> bool {
    name.len() == 64
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// What a container sees at `/opt/gpuarch/kernels/<package>/manifest.json`
/// of a published package: which build serves each of its GPUs. The hook
/// writes it into the container's view; gpuarchd reads the `key`s of a
/// mounted view to keep those builds from eviction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct View {
    pub package: String,
    pub version: String,
    /// One per GPU of the container, in CUDA order.
    pub gpus: Vec<ViewGpu>,
    /// The builds in the view, one directory each.
    pub builds: Vec<ViewBuild>,
    /// Directories of the package (its builds' `dir`s) in the container's
    /// loader cache: an import made with `--ldconfig`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub libraries: Vec<String>,
}

/// One GPU of the container and what serves it. (`serves` is flattened,
/// which serde cannot combine with refusing unknown fields.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewGpu {
    /// Its CUDA index inside the container.
    pub index: usize,
    pub uuid: String,
    /// Its NVML index on the host.
    pub host_index: u32,
    pub compute_capability: String,
    #[serde(flatten)]
    pub serves: Serves,
}

/// The build that serves a GPU, or why none does yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Serves {
    Build {
        arch: String,
        variant: String,
        dtype: Option<String>,
        /// The build's directory in the view.
        dir: String,
        /// Its files, relative to the view (`sm_86/saxpy.cubin`).
        files: Vec<String>,
    },
    Missing {
        missing: String,
    },
}

/// One build in a view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewBuild {
    /// Its directory in the view (the arch: `sm_86`).
    pub dir: String,
    pub arch: String,
    pub variant: String,
    pub dtype: Option<String>,
    pub files: Vec<String>,
    /// The store entry it is (the store's key).
    pub key: String,
}

/// Either shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Manifest {
    HandMade(HandMade),
    Published(Published),
}

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON, or a field missing, unknown or of the wrong type (serde's
    /// message names it).
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(
        "schema {found}: this gpuarch reads schema {SCHEMA} (is gpuarchd newer than the hook?)"
    )]
    Schema { found: serde_json::Value },
}

/// Read a manifest's bytes.
pub fn read(bytes: &[u8]) -> Result<Manifest, ManifestError> {
    let v: serde_json::Value = serde_json::from_slice(bytes)?;
    match v.get("schema") {
        None => Ok(Manifest::HandMade(serde_json::from_value(v)?)),
        Some(s) if s.as_u64() == Some(u64::from(SCHEMA)) => {
            Ok(Manifest::Published(serde_json::from_value(v)?))
        }
        Some(s) => Err(ManifestError::Schema { found: s.clone() }),
    }
}

#[cfg(test)]
mod tests {
    /// The view manifest as the container reads it, kept in
    /// python/tests/fixtures/ for the Python helper's tests: a change of
    /// the format fails here until that file (and the helper) follow.
    /// `GPUARCH_UPDATE_GOLDEN=1` rewrites it.
    #[test]
    fn the_python_helpers_fixture_is_the_view_format() {
        let view = View {
            package: "rmsnorm".into(),
            version: "1.0".into(),
            gpus: vec![
                ViewGpu {
                    index: 0,
                    uuid: "GPU-aaaa".into(),
                    host_index: 0,
                    compute_capability: "7.5".into(),
                    serves: Serves::Build {
                        arch: "sm_75".into(),
                        variant: "fp16".into(),
                        dtype: Some("float16".into()),
                        dir: "sm_75".into(),
                        files: vec!["sm_75/rmsnorm.cubin".into()],
                    },
                },
                ViewGpu {
                    index: 1,
                    uuid: "GPU-bbbb".into(),
                    host_index: 1,
                    compute_capability: "8.6".into(),
                    serves: Serves::Missing {
                        missing: "no build runs on GPU 1 (NVIDIA GeForce RTX 3090, 8.6) yet".into(),
                    },
                },
            ],
            builds: vec![ViewBuild {
                dir: "sm_75".into(),
                arch: "sm_75".into(),
                variant: "fp16".into(),
                dtype: Some("float16".into()),
                files: vec!["rmsnorm.cubin".into()],
                key: "ab".repeat(32),
            }],
            libraries: vec![],
        };
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../python/tests/fixtures/rmsnorm/manifest.json");
        let want = serde_json::to_string_pretty(&view).unwrap() + "\n";
        if std::env::var("GPUARCH_UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            have,
            want,
            "{} differs (GPUARCH_UPDATE_GOLDEN=1 rewrites it)",
            path.display()
        );
    }

    use super::*;

    fn published() -> Published {
        Published {
            schema: SCHEMA,
            package: "saxpy".into(),
            version: "1".into(),
            description: "y = a*x + y".into(),
            targets: vec!["sm_86".into()],
            builds: vec![Build {
                arch: "sm_86".into(),
                variant: "f32".into(),
                dtype: None,
                key: "ab".into(),
                dir: "/var/cache/gpuarch/objects/ab/ab".into(),
                files: vec!["saxpy.cubin".into()],
                toolkit: "nvrtc 13.0".into(),
            }],
            unavailable: vec![],
            pending: vec![Pending {
                arch: "sm_75".into(),
                reason: "queued".into(),
            }],
            imported: false,
            ldconfig: false,
        }
    }

    #[test]
    fn what_gpuarchd_writes_the_hook_reads_back() {
        let text = serde_json::to_vec_pretty(&published()).unwrap();
        assert_eq!(read(&text).unwrap(), Manifest::Published(published()));
    }

    #[test]
    fn a_hand_made_package_needs_only_its_targets() {
        let m = read(br#"{"targets": ["sm_75"], "libraries": ["lib"]}"#).unwrap();
        let Manifest::HandMade(h) = m else {
            panic!("{m:?}")
        };
        assert_eq!(h.targets, ["sm_75"]);
        assert_eq!(h.libraries, ["lib"]);
    }

    #[test]
    fn unknown_missing_and_future_fields_are_named() {
        let e = read(br#"{"targets": ["sm_75"], "libs": ["lib"]}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `libs`"), "{e}");
        let mut v = serde_json::to_value(published()).unwrap();
        v["builds"][0].as_object_mut().unwrap().remove("dir");
        let e = read(&serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert!(e.to_string().contains("missing field `dir`"), "{e}");
        v["schema"] = 3.into();
        let e = read(&serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("schema 3: this gpuarch reads schema 2"),
            "{e}"
        );
        assert!(read(b"{").is_err());
    }
}
