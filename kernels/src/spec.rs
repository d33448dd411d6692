//! Kernel packages: a directory with a `kernel.yaml` and its sources.
//!
//! ```yaml
//! name: rmsnorm                # [A-Za-z0-9._+-], what the container sees
//! version: "1.0.0"
//! description: RMS normalisation
//! sources: [rmsnorm.cu, common.cuh]   # the first is compiled; all are digested
//! exports: [rmsnorm_f16]      # entry points each build must contain
//! build:
//!   backend: nvrtc             # or: command
//!   options: [--std=c++17]     # nvrtc: extra compiler options
//!   ptx: false                 # nvrtc: also keep PTX for JIT on newer GPUs
//! variants:                    # in order of preference for each arch
//!   - name: bf16
//!     dtype: bfloat16
//!     capability: ">=8.0"      # optional: where this variant may be used
//!     requires: [bf16]         # optional: feature gates the GPU must pass
//!     defines: {T: __nv_bfloat16}
//!     exports: [rmsnorm_bf16]  # optional: replaces the package's exports
//!   - name: fp16
//!     dtype: float16
//! ```
//!
//! With `backend: command` the build section is `argv` (a template with
//! `${ARCH}` (`sm_86`), `${CAPABILITY}` (`8.6`), `${TORCH_CUDA_ARCH_LIST}`,
//! `${OUT}`, `${SRC}` and `${VARIANT}`), and optionally `env` (added to the
//! clean environment, same templating) and `timeout_s`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use gpuarch_core::arch::Target;
use gpuarch_core::config::valid_package_name as valid_name;
use gpuarch_core::features::Feature;
use gpuarch_core::requirement::{Requirement, RequirementError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The file that makes a directory a package.
pub const SPEC_FILE: &str = "kernel.yaml";
const MAX_SPEC_BYTES: u64 = 1 << 20;
const MAX_SOURCE_BYTES: u64 = 64 << 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackageSpec {
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub description: String,
    pub sources: Vec<String>,
    #[serde(default)]
    pub exports: Vec<String>,
    pub build: BuildSpec,
    pub variants: Vec<VariantSpec>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "backend", rename_all = "lowercase", deny_unknown_fields)]
pub enum BuildSpec {
    Nvrtc {
        #[serde(default)]
        options: Vec<String>,
        #[serde(default)]
        ptx: bool,
    },
    Command {
        argv: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
        #[serde(default)]
        timeout_s: Option<u64>,
    },
}

impl BuildSpec {
    pub fn backend(&self) -> &'static str {
        match self {
            Self::Nvrtc { .. } => "nvrtc",
            Self::Command { .. } => "command",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantSpec {
    pub name: String,
    #[serde(default)]
    pub dtype: Option<String>,
    /// A requirement on the capability, in `gpuarchctl match` grammar
    /// without the key: `">=8.0"`, `">=7.5,<9.0"`.
    #[serde(default)]
    pub capability: Option<String>,
    #[serde(default)]
    pub requires: Vec<String>,
    #[serde(default)]
    pub defines: BTreeMap<String, String>,
    #[serde(default)]
    pub exports: Option<Vec<String>>,
}

/// A package read from disk: its spec, where it is, and its sources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Package {
    pub spec: PackageSpec,
    pub dir: PathBuf,
    /// `(name, bytes)` of each source, in the spec's order.
    pub sources: Vec<(String, Vec<u8>)>,
    /// sha256 (hex) of each source, in the spec's order.
    pub digests: Vec<String>,
    /// Parsed capability ranges, one per variant.
    ranges: Vec<Option<Requirement>>,
}

/// Why a package could not be read: the file, and where in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub reason: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ": line {l}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for SpecError {}

pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Read at most `limit` bytes of `path`, a regular file opened and
/// checked once ([`gpuarch_fs::trust::open`]): what is read is what was
/// checked.
fn read_trusted(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let f = gpuarch_fs::trust::open(path).map_err(|e| match e {
        gpuarch_fs::trust::OpenError::Io { error, .. } => error,
        e => std::io::Error::other(e),
    })?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut buf = Vec::new();
    f.take(limit + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > limit {
        return Err(std::io::Error::other(format!("larger than {limit} bytes")));
    }
    Ok(buf)
}

impl Package {
    /// Read `dir/kernel.yaml` and the sources it names.
    /// A package whose files another user owns or could write is refused
    /// (its `command` build would run as root): see
    /// [`gpuarch_fs::trust`].
    pub fn load(dir: &Path) -> Result<Self, SpecError> {
        let file = dir.join(SPEC_FILE);
        let text = read_trusted(&file, MAX_SPEC_BYTES).map_err(|e| SpecError {
            file,
            line: None,
            reason: e.to_string(),
        })?;
        Self::parse(dir, text, |s| read_trusted(&dir.join(s), MAX_SOURCE_BYTES))
    }

    /// A package from the bytes of its `kernel.yaml` (at most
    /// `MAX_SPEC_BYTES`, as read by [`Package::load`]), reading each source
    /// it names with `read_source`. Errors name `dir/kernel.yaml` and a line.
    pub fn parse(
        dir: &Path,
        text: Vec<u8>,
        read_source: impl Fn(&str) -> std::io::Result<Vec<u8>>,
    ) -> Result<Self, SpecError> {
        let file = dir.join(SPEC_FILE);
        let err = |line, reason: String| SpecError {
            file: file.clone(),
            line,
            reason,
        };
        let text = String::from_utf8(text).map_err(|_| err(None, "not UTF-8".into()))?;
        let spec: PackageSpec = serde_yaml::from_str(&text)
            .map_err(|e| err(e.location().map(|l| l.line()), e.to_string()))?;
        let line_of = |needle: &str| text.lines().position(|l| l.contains(needle)).map(|i| i + 1);
        if !valid_name(&spec.name) {
            return Err(err(
                line_of("name:"),
                format!(
                    "name {:?} is not a valid package name ([A-Za-z0-9._+-], not starting with '.')",
                    spec.name
                ),
            ));
        }
        if spec.sources.is_empty() {
            return Err(err(line_of("sources"), "sources is empty".into()));
        }
        if spec.variants.is_empty() {
            return Err(err(line_of("variants"), "variants is empty".into()));
        }
        if let BuildSpec::Command {
            argv, timeout_s, ..
        } = &spec.build
        {
            if argv.is_empty() {
                return Err(err(line_of("argv"), "argv is empty".into()));
            }
            if timeout_s.is_some_and(|t| t == 0 || t > 86_400) {
                return Err(err(
                    line_of("timeout_s"),
                    "timeout_s must be 1 to 86400".into(),
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut ranges = Vec::new();
        for v in &spec.variants {
            let at = line_of(&format!("name: {}", v.name));
            if !valid_name(&v.name) || !seen.insert(v.name.clone()) {
                return Err(err(
                    at,
                    format!("variant name {:?} is invalid or repeated", v.name),
                ));
            }
            for r in &v.requires {
                r.parse::<Feature>()
                    .map_err(|e| err(at, format!("variant {}: {e}", v.name)))?;
            }
            for k in v.defines.keys() {
                if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                    return Err(err(
                        at,
                        format!("variant {}: define {k:?} is not a C identifier", v.name),
                    ));
                }
            }
            ranges.push(match &v.capability {
                None => None,
                Some(c) => {
                    Some(capability_range(c).map_err(|e| {
                        err(at, format!("variant {}: capability {c:?}: {e}", v.name))
                    })?)
                }
            });
        }
        let mut sources = Vec::new();
        let mut digests = Vec::new();
        for s in &spec.sources {
            if !valid_name(s) {
                return Err(err(
                    line_of(s),
                    format!("source {s:?} must be a file name inside the package"),
                ));
            }
            let bytes = read_source(s).map_err(|e| err(line_of(s), format!("source {s}: {e}")))?;
            digests.push(sha256_hex(&bytes));
            sources.push((s.clone(), bytes));
        }
        Ok(Self {
            spec,
            dir: dir.to_owned(),
            sources,
            digests,
            ranges,
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Whether variant `i` may serve `arch`, or why not.
    pub fn admits(&self, i: usize, arch: Target) -> Result<(), NotAdmitted> {
        let v = &self.spec.variants[i];
        if let Some(Some(r)) = self.ranges.get(i)
            && !r.admits(arch.cap)
        {
            return Err(NotAdmitted::Capability {
                variant: v.name.clone(),
                range: v.capability.clone().unwrap_or_default(),
            });
        }
        for f in &v.requires {
            if let Ok(f) = f.parse::<Feature>()
                && !f.supported_on(arch.cap)
            {
                return Err(NotAdmitted::Feature {
                    variant: v.name.clone(),
                    feature: f,
                    arch,
                });
            }
        }
        Ok(())
    }

    /// The entry points variant `i` must export.
    pub fn exports(&self, i: usize) -> &[String] {
        self.spec.variants[i]
            .exports
            .as_deref()
            .unwrap_or(&self.spec.exports)
    }
}

/// A capability range such as `>=8.0` or `>=7.5,<9.0`: `gpuarchctl
/// match` terms without the `arch` key.
fn capability_range(s: &str) -> Result<Requirement, RequirementError> {
    let terms: Vec<String> = s.split(',').map(|t| format!("arch{}", t.trim())).collect();
    terms.join(",").parse::<Requirement>()
}

/// Why a variant may not serve an arch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAdmitted {
    #[error("variant {variant} is for capability {range}")]
    Capability { variant: String, range: String },
    #[error("variant {variant} requires {feature} (capability {}), which {arch} lacks", feature.gate())]
    Feature {
        variant: String,
        feature: Feature,
        arch: Target,
    },
}

/// Every package in `dirs` (later directories replace earlier ones of the
/// same name), and an error for each that could not be read.
pub fn discover(dirs: &[PathBuf]) -> (BTreeMap<String, Package>, Vec<SpecError>) {
    let mut found = BTreeMap::new();
    let mut errors = Vec::new();
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(d) else {
            continue;
        };
        let mut subdirs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join(SPEC_FILE).is_file())
            .collect();
        subdirs.sort();
        for p in subdirs {
            match Package::load(&p) {
                Ok(pkg) => {
                    found.insert(pkg.name().to_owned(), pkg);
                }
                Err(e) => errors.push(e),
            }
        }
    }
    (found, errors)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn write(dir: &Path, name: &str, yaml: &str) {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(SPEC_FILE), yaml).unwrap();
        std::fs::write(d.join("k.cu"), "extern \"C\" __global__ void k() {}\n").unwrap();
    }

    #[test]
    fn a_bad_package_is_reported_with_file_and_line_and_spares_the_rest() {
        let tmp = tempfile::tempdir().unwrap();
        let good = "name: good\nversion: '1'\nsources: [k.cu]\nbuild: {backend: nvrtc}\nvariants:\n  - name: a\n    capability: '>=8.0'\n    requires: [bf16]\n";
        write(tmp.path(), "good", good);
        write(
            tmp.path(),
            "typo",
            "name: typo\nversion: '1'\nsources: [k.cu]\nbuild: {backend: nvrtc}\nvariants:\n  - name: a\n    dtyp: float16\n",
        );
        write(
            tmp.path(),
            "escape",
            "name: escape\nversion: '1'\nsources: [../../etc/passwd]\nbuild: {backend: nvrtc}\nvariants: [{name: a}]\n",
        );
        write(
            tmp.path(),
            "gate",
            "name: gate\nversion: '1'\nsources: [k.cu]\nbuild: {backend: nvrtc}\nvariants:\n  - name: a\n    requires: [bf17]\n",
        );
        let (found, errors) = discover(&[tmp.path().to_owned()]);
        assert_eq!(found.keys().collect::<Vec<_>>(), ["good"]);
        let msgs: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert!(
            msgs[0].contains("escape/kernel.yaml: line 3")
                && msgs[0].contains("must be a file name inside the package"),
            "{}",
            msgs[0]
        );
        assert!(
            msgs[1].contains("gate/kernel.yaml: line 6") && msgs[1].contains("bf17"),
            "{}",
            msgs[1]
        );
        assert!(
            msgs[2].contains("typo/kernel.yaml: line 7")
                && msgs[2].contains("unknown field `dtyp`"),
            "{}",
            msgs[2]
        );
        let g = &found["good"];
        let sm75 = Target::parse("sm_75").unwrap();
        assert!(
            g.admits(0, sm75)
                .unwrap_err()
                .to_string()
                .contains("is for capability >=8.0")
        );
        assert!(g.admits(0, Target::parse("sm_86").unwrap()).is_ok());
    }
}
