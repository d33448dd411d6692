//! Compute capabilities, build targets and the rules for what runs where.
//!
//! Syntax accepted by [`ArchList::parse`] (one list, entries separated by `;`
//! or whitespace):
//!
//! | token            | meaning                                              |
//! |------------------|------------------------------------------------------|
//! | `8.6`            | SASS for 8.6 (`sm_86`)                               |
//! | `8.6+PTX`        | SASS for 8.6 and PTX for 8.6 (`compute_86`)          |
//! | `9.0a`, `10.0f`  | arch-specific / family-specific SASS                 |
//! | `sm_86`, `sm_90a`| SASS, nvcc spelling                                  |
//! | `compute_86`     | PTX only, nvcc spelling                              |
//! | `Ampere`, ...    | PyTorch's named arches (`Ampere` = `8.0;8.6+PTX`)    |
//!
//! Capabilities given by a user must be ones NVIDIA has shipped (the table
//! [`KNOWN`]), as PyTorch requires; capabilities reported by a device are taken
//! as they come ([`ComputeCapability::new`]) so that a GPU newer than this
//! table still gets a Plan.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod cuda;
pub use cuda::CudaVersion;

/// Errors from parsing capabilities, targets, lists and versions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArchError {
    /// The token does not follow any accepted form.
    #[error("invalid architecture '{token}': {reason}")]
    Invalid { token: String, reason: String },
    /// The token is well formed but names no capability NVIDIA has shipped.
    #[error("unknown compute capability '{token}' (known: {known})")]
    Unknown { token: String, known: String },
    /// `a`/`f` on a capability that has no such variant (`7.5a`).
    #[error("invalid architecture '{token}': {cap} has no '{suffix}' variant")]
    NoSuchVariant {
        token: String,
        cap: ComputeCapability,
        suffix: char,
    },
    /// An empty entry, such as the middle of `7.5;;8.6` or a trailing `;`.
    #[error("empty entry at position {position} of architecture list '{list}'")]
    EmptyEntry { list: String, position: usize },
    /// The whole list is empty or blank.
    #[error("empty architecture list")]
    EmptyList,
    /// A CUDA version such as `12.4` could not be read.
    #[error("invalid CUDA version '{token}': expected MAJOR.MINOR such as 12.4")]
    CudaVersion { token: String },
}

fn invalid(token: &str, reason: impl Into<String>) -> ArchError {
    ArchError::Invalid {
        token: token.to_owned(),
        reason: reason.into(),
    }
}

/// A CUDA compute capability `major.minor`, as a device reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    pub major: u8,
    pub minor: u8,
}

/// Capabilities NVIDIA has shipped, with the architecture name PyTorch uses.
pub const KNOWN: &[(ComputeCapability, &str)] = &[
    (ComputeCapability::new(3, 5), "Kepler"),
    (ComputeCapability::new(3, 7), "Kepler"),
    (ComputeCapability::new(5, 0), "Maxwell"),
    (ComputeCapability::new(5, 2), "Maxwell"),
    (ComputeCapability::new(5, 3), "Maxwell"),
    (ComputeCapability::new(6, 0), "Pascal"),
    (ComputeCapability::new(6, 1), "Pascal"),
    (ComputeCapability::new(6, 2), "Pascal"),
    (ComputeCapability::new(7, 0), "Volta"),
    (ComputeCapability::new(7, 2), "Volta"),
    (ComputeCapability::new(7, 5), "Turing"),
    (ComputeCapability::new(8, 0), "Ampere"),
    (ComputeCapability::new(8, 6), "Ampere"),
    (ComputeCapability::new(8, 7), "Ampere"),
    (ComputeCapability::new(8, 9), "Ada"),
    (ComputeCapability::new(9, 0), "Hopper"),
    (ComputeCapability::new(10, 0), "Blackwell"),
    (ComputeCapability::new(10, 1), "Blackwell"),
    (ComputeCapability::new(10, 3), "Blackwell"),
    (ComputeCapability::new(11, 0), "Blackwell"),
    (ComputeCapability::new(12, 0), "Blackwell"),
    (ComputeCapability::new(12, 1), "Blackwell"),
];

/// PyTorch's named arches for `TORCH_CUDA_ARCH_LIST`, in its matching order
/// (combined names first). Each expands to a list in this module's syntax.
pub const NAMED: &[(&str, &str)] = &[
    ("Kepler+Tesla", "3.7"),
    ("Kepler", "3.5+PTX"),
    ("Maxwell+Tegra", "5.3"),
    ("Maxwell", "5.0;5.2+PTX"),
    ("Pascal", "6.0;6.1+PTX"),
    ("Volta+Tegra", "7.2"),
    ("Volta", "7.0+PTX"),
    ("Turing", "7.5+PTX"),
    ("Ampere+Tegra", "8.7"),
    ("Ampere", "8.0;8.6+PTX"),
    ("Ada", "8.9+PTX"),
    ("Hopper", "9.0+PTX"),
    ("Blackwell+Tegra", "11.0"),
    ("Blackwell", "10.0;10.3;12.0;12.1+PTX"),
];

impl ComputeCapability {
    pub const fn new(major: u8, minor: u8) -> Self {
        Self { major, minor }
    }

    /// Parse `MAJOR.MINOR` as a device reports it: any major of one or two
    /// digits, a single-digit minor. Unknown capabilities are accepted.
    pub fn parse_reported(s: &str) -> Result<Self, ArchError> {
        let (major, minor) = s
            .split_once('.')
            .ok_or_else(|| invalid(s, "expected MAJOR.MINOR such as 8.6"))?;
        let major = parse_major(s, major)?;
        let minor = parse_minor(s, minor)?;
        Ok(Self::new(major, minor))
    }

    /// Parse `MAJOR.MINOR` given by a user; the capability must be in [`KNOWN`].
    pub fn parse_known(s: &str) -> Result<Self, ArchError> {
        Self::parse_reported(s)?.known(s)
    }

    fn known(self, token: &str) -> Result<Self, ArchError> {
        if self.is_known() {
            Ok(self)
        } else {
            Err(ArchError::Unknown {
                token: token.to_owned(),
                known: KNOWN
                    .iter()
                    .map(|(c, _)| c.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
            })
        }
    }

    pub fn is_known(self) -> bool {
        KNOWN.iter().any(|(c, _)| *c == self)
    }

    /// The architecture's name (Turing, Ampere, ...), if known.
    pub fn arch_name(self) -> Option<&'static str> {
        KNOWN.iter().find(|(c, _)| *c == self).map(|(_, n)| *n)
    }

    /// The digits of the nvcc spelling: `86` for 8.6, `100` for 10.0.
    pub fn digits(self) -> String {
        format!("{}{}", self.major, self.minor)
    }

    /// Whether this capability has an arch-specific (`a`) variant: 9.0 and later.
    pub fn has_arch_specific(self) -> bool {
        self >= Self::new(9, 0)
    }

    /// Whether this capability has a family-specific (`f`) variant: 10.0 and later.
    pub fn has_family_specific(self) -> bool {
        self >= Self::new(10, 0)
    }

    /// Whether this is an integrated (Tegra) chip's architecture: Jetson
    /// TX1, TX2, Xavier, Orin and Thor (10.1 to a CUDA 12 driver, 11.0 to
    /// a CUDA 13 one).
    pub fn is_tegra(self) -> bool {
        TEGRA.contains(&(self.major, self.minor))
    }

    /// Whether SASS built for `self` (generic or family-specific) runs on
    /// a GPU of `device`: the same major with a minor at least its own,
    /// and never across desktop and Tegra but on its very own capability.
    /// The CUDA C++ Programming Guide ("Binary Compatibility"): binary
    /// compatibility is supported only for the desktop, not for Tegra, nor
    /// between desktop and Tegra; so sm_86 does not run on an Orin (8.7),
    /// nor sm_100 on a Thor reporting 10.1.
    pub fn sass_runs_on(self, device: Self) -> bool {
        self == device
            || (self.major == device.major
                && self.minor <= device.minor
                && !self.is_tegra()
                && !device.is_tegra())
    }
}

/// The integrated (Tegra) chips' architectures, as (major, minor).
const TEGRA: &[(u8, u8)] = &[(5, 3), (6, 2), (7, 2), (8, 7), (10, 1), (11, 0)];

fn parse_major(token: &str, s: &str) -> Result<u8, ArchError> {
    if s.is_empty() || s.len() > 2 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(
            token,
            format!("major version '{s}' is not a number of one or two digits"),
        ));
    }
    match s.parse::<u8>() {
        Ok(0) | Err(_) => Err(invalid(token, "major version must be at least 1")),
        Ok(v) => Ok(v),
    }
}

fn parse_minor(token: &str, s: &str) -> Result<u8, ArchError> {
    match s.as_bytes() {
        [d] if d.is_ascii_digit() => Ok(d - b'0'),
        _ => Err(invalid(
            token,
            format!("minor version '{s}' is not a single digit"),
        )),
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for ComputeCapability {
    type Err = ArchError;
    /// Same as [`ComputeCapability::parse_known`].
    fn from_str(s: &str) -> Result<Self, ArchError> {
        Self::parse_known(s)
    }
}

impl Serialize for ComputeCapability {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ComputeCapability {
    /// Snapshots carry what devices report, so unknown capabilities are kept.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse_reported(&s).map_err(serde::de::Error::custom)
    }
}

/// Which devices a target is specialised for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Specificity {
    /// `sm_86`: the usual rules.
    Generic,
    /// `sm_90a`: exactly this capability.
    ArchSpecific,
    /// `sm_100f`: this family (same major, minor at least this one).
    FamilySpecific,
}

impl Specificity {
    fn suffix(self) -> &'static str {
        match self {
            Self::Generic => "",
            Self::ArchSpecific => "a",
            Self::FamilySpecific => "f",
        }
    }
}

/// Machine code (SASS, in a cubin) or virtual code (PTX, JIT-compiled).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CodeKind {
    Sass,
    Ptx,
}

/// One build target: `sm_86`, `sm_90a`, `compute_100f`, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Target {
    pub cap: ComputeCapability,
    pub spec: Specificity,
    pub kind: CodeKind,
}

impl Target {
    pub const fn sass(cap: ComputeCapability) -> Self {
        Self {
            cap,
            spec: Specificity::Generic,
            kind: CodeKind::Sass,
        }
    }

    pub const fn ptx(cap: ComputeCapability) -> Self {
        Self {
            cap,
            spec: Specificity::Generic,
            kind: CodeKind::Ptx,
        }
    }

    /// Parse one target in nvcc spelling (`sm_90a`, `compute_86`) or as a
    /// capability (`8.6`, `9.0a`: SASS). `+PTX` and names are list syntax;
    /// see [`ArchList::parse`].
    pub fn parse(token: &str) -> Result<Self, ArchError> {
        let t = token.trim();
        if let Some(rest) = t.strip_prefix("sm_") {
            return Self::from_digits(token, rest, CodeKind::Sass);
        }
        if let Some(rest) = t.strip_prefix("compute_") {
            return Self::from_digits(token, rest, CodeKind::Ptx);
        }
        let (body, spec) = split_suffix(t);
        let cap = ComputeCapability::parse_known(body).map_err(|e| retoken(e, token))?;
        Self::checked(token, cap, spec, CodeKind::Sass)
    }

    fn from_digits(token: &str, rest: &str, kind: CodeKind) -> Result<Self, ArchError> {
        let (digits, spec) = split_suffix(rest);
        if digits.is_empty() {
            // From the kind, not by slicing `token`: `rest` is a slice of the
            // trimmed token, and trailing whitespace such as U+0085 made the
            // lengths disagree (found by fuzz target `arch`).
            let prefix = match kind {
                CodeKind::Sass => "sm_",
                CodeKind::Ptx => "compute_",
            };
            return Err(invalid(token, format!("missing digits after '{prefix}'")));
        }
        if !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 3 || digits.len() < 2 {
            return Err(invalid(
                token,
                format!("'{digits}' is not two or three digits such as 86 or 100"),
            ));
        }
        let (major, minor) = digits.split_at(digits.len() - 1);
        let cap = ComputeCapability::new(parse_major(token, major)?, parse_minor(token, minor)?)
            .known(token)?;
        Self::checked(token, cap, spec, kind)
    }

    fn checked(
        token: &str,
        cap: ComputeCapability,
        spec: Specificity,
        kind: CodeKind,
    ) -> Result<Self, ArchError> {
        let ok = match spec {
            Specificity::Generic => true,
            Specificity::ArchSpecific => cap.has_arch_specific(),
            Specificity::FamilySpecific => cap.has_family_specific(),
        };
        if !ok {
            return Err(ArchError::NoSuchVariant {
                token: token.to_owned(),
                cap,
                suffix: spec.suffix().chars().next().unwrap_or('?'),
            });
        }
        Ok(Self { cap, spec, kind })
    }

    /// Can code built for this target run on a device of capability `device`?
    ///
    /// `driver_cuda` is the CUDA version the driver supports (from NVML) and
    /// `ptx_toolkit` the toolkit that produced the PTX; both only matter for
    /// PTX, and an unknown one is stated in the verdict rather than guessed.
    pub fn check(
        &self,
        device: ComputeCapability,
        driver_cuda: Option<CudaVersion>,
        ptx_toolkit: Option<CudaVersion>,
    ) -> Verdict {
        let t = self.cap;
        // Across desktop and Tegra, SASS runs nowhere but on its own
        // capability ([`ComputeCapability::sass_runs_on`]).
        let tegra = |rule: String| {
            if device.major == t.major && device.minor >= t.minor && !t.sass_runs_on(device) {
                let which = if device.is_tegra() { device } else { t };
                format!(
                    "{rule}, but never across desktop and Tegra ({which} is an integrated Tegra GPU's)"
                )
            } else {
                rule
            }
        };
        let (fits, rule) = match self.spec {
            Specificity::ArchSpecific => (
                device == t,
                format!("'{}' targets run only on exactly {t}", self.spec.suffix()),
            ),
            Specificity::FamilySpecific => (
                t.sass_runs_on(device),
                tegra(format!(
                    "'f' targets run on the same family: {}.x with minor >= {}",
                    t.major, t.minor
                )),
            ),
            Specificity::Generic => match self.kind {
                CodeKind::Sass => (
                    t.sass_runs_on(device),
                    tegra(format!(
                        "SASS runs on the same major with a minor at least its own: {}.x with minor >= {}",
                        t.major, t.minor
                    )),
                ),
                CodeKind::Ptx => (
                    device >= t,
                    format!("PTX JIT-compiles on any capability >= {t}"),
                ),
            },
        };
        if !fits {
            return Verdict {
                runs: false,
                jit: self.kind == CodeKind::Ptx,
                reason: format!("{self} does not run on {device}: {rule}"),
            };
        }
        if self.kind == CodeKind::Sass {
            return Verdict {
                runs: true,
                jit: false,
                reason: format!("{self} runs on {device}: {rule}"),
            };
        }
        match (driver_cuda, ptx_toolkit) {
            (Some(d), Some(p)) if d < p => Verdict {
                runs: false,
                jit: true,
                reason: format!(
                    "{self} cannot be JIT-compiled on {device}: the PTX is from CUDA {p} and the driver supports only CUDA {d}"
                ),
            },
            (Some(d), Some(p)) => Verdict {
                runs: true,
                jit: true,
                reason: format!(
                    "{self} is JIT-compiled on {device}: {rule}, and the driver's CUDA {d} >= the PTX's CUDA {p}"
                ),
            },
            _ => Verdict {
                runs: true,
                jit: true,
                reason: format!(
                    "{self} is JIT-compiled on {device}: {rule}, provided the driver's CUDA version is at least the toolkit's that produced the PTX (not given)"
                ),
            },
        }
    }
}

/// The one of `targets` that serves a GPU of capability `cap` best: the
/// highest SASS that runs there; else, when `ptx` may serve, the highest
/// PTX the driver can JIT-compile. The rule of the hook's choice of build
/// and of `gpuarchctl inspect`'s verdict alike.
pub fn best_target(
    targets: impl IntoIterator<Item = Target>,
    cap: ComputeCapability,
    driver_cuda: Option<CudaVersion>,
    ptx: bool,
) -> Option<Target> {
    targets
        .into_iter()
        .filter(|t| (t.kind == CodeKind::Sass || ptx) && t.check(cap, driver_cuda, None).runs)
        .max_by_key(|t| (t.kind == CodeKind::Sass, *t))
}

/// How a binary's code gets onto one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Machine code for it is there.
    Sass(Target),
    /// Only PTX fits: the driver JIT-compiles it at load.
    Jit(Target),
    /// Nothing in the binary runs there: why.
    No(String),
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Sass(t) => write!(f, "runs from SASS {t}"),
            Placement::Jit(t) => write!(f, "runs by PTX JIT from {t}"),
            Placement::No(why) => write!(f, "will not run: {why}"),
        }
    }
}

/// Where code carrying `targets` runs on a GPU of capability `cap`: the
/// best SASS (the highest that fits), else PTX the driver can JIT, else
/// why not. `gpuarchctl inspect`'s and the image audit's verdict.
pub fn placement(
    targets: impl IntoIterator<Item = Target>,
    cap: ComputeCapability,
    driver_cuda: Option<CudaVersion>,
) -> Placement {
    let targets: Vec<Target> = targets.into_iter().collect();
    match best_target(targets.iter().copied(), cap, driver_cuda, true) {
        Some(t) if t.kind == CodeKind::Sass => return Placement::Sass(t),
        Some(t) => return Placement::Jit(t),
        None => {}
    }
    if targets.is_empty() {
        return Placement::No("the binary carries no GPU code".into());
    }
    let carried: BTreeSet<String> = targets.iter().map(|t| t.to_string()).collect();
    let reasons: BTreeSet<String> = targets
        .iter()
        .map(|t| t.check(cap, driver_cuda, None).reason)
        .collect();
    Placement::No(format!(
        "it carries only {} and {cap} runs none of it ({})",
        carried.into_iter().collect::<Vec<_>>().join(", "),
        reasons.into_iter().collect::<Vec<_>>().join("; ")
    ))
}

fn split_suffix(s: &str) -> (&str, Specificity) {
    if let Some(b) = s.strip_suffix('a') {
        (b, Specificity::ArchSpecific)
    } else if let Some(b) = s.strip_suffix('f') {
        (b, Specificity::FamilySpecific)
    } else {
        (s, Specificity::Generic)
    }
}

/// Report an error against the whole token rather than the part that failed.
fn retoken(e: ArchError, token: &str) -> ArchError {
    match e {
        ArchError::Invalid { reason, .. } => invalid(token, reason),
        ArchError::Unknown { known, .. } => ArchError::Unknown {
            token: token.to_owned(),
            known,
        },
        other => other,
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = match self.kind {
            CodeKind::Sass => "sm_",
            CodeKind::Ptx => "compute_",
        };
        write!(f, "{prefix}{}{}", self.cap.digits(), self.spec.suffix())
    }
}

impl FromStr for Target {
    type Err = ArchError;
    fn from_str(s: &str) -> Result<Self, ArchError> {
        Self::parse(s)
    }
}

/// The answer to "does code for target X run on capability Y?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub runs: bool,
    /// True when the target is PTX, so running means JIT compilation.
    pub jit: bool,
    /// One sentence naming the rule that decided.
    pub reason: String,
}

/// A set of targets, sorted and distinct: what `TORCH_CUDA_ARCH_LIST` means.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ArchList(BTreeSet<Target>);

impl ArchList {
    pub fn new(targets: impl IntoIterator<Item = Target>) -> Self {
        Self(targets.into_iter().collect())
    }

    /// Parse a list: entries separated by `;` or whitespace. See the module docs.
    pub fn parse(list: &str) -> Result<Self, ArchError> {
        if list.trim().is_empty() {
            return Err(ArchError::EmptyList);
        }
        let mut out = BTreeSet::new();
        let mut position = 0;
        for entry in list.split(';') {
            if entry.trim().is_empty() {
                position += 1;
                return Err(ArchError::EmptyEntry {
                    list: list.to_owned(),
                    position,
                });
            }
            for token in entry.split_whitespace() {
                position += 1;
                parse_token(token, &mut out)?;
            }
        }
        Ok(Self(out))
    }

    pub fn targets(&self) -> impl Iterator<Item = &Target> {
        self.0.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Does any target of the list run on `device`? (A fatbin with these
    /// targets loads if one of them fits.)
    pub fn runs_on(&self, device: ComputeCapability, driver_cuda: Option<CudaVersion>) -> bool {
        self.0
            .iter()
            .any(|t| t.check(device, driver_cuda, None).runs)
    }
}

fn parse_token(token: &str, out: &mut BTreeSet<Target>) -> Result<(), ArchError> {
    if let Some((_, expansion)) = NAMED.iter().find(|(n, _)| n.eq_ignore_ascii_case(token)) {
        for t in expansion.split(';') {
            parse_token(t, out)?;
        }
        return Ok(());
    }
    let (body, ptx) = match token.strip_suffix("+PTX") {
        Some(b) => (b, true),
        None => (token, false),
    };
    if body.starts_with("sm_") || body.starts_with("compute_") {
        if ptx {
            return Err(invalid(
                token,
                "'+PTX' goes after a capability such as 8.6, not after an nvcc name",
            ));
        }
        out.insert(Target::parse(body).map_err(|e| retoken(e, token))?);
        return Ok(());
    }
    let sass = Target::parse(body).map_err(|e| retoken(e, token))?;
    out.insert(sass);
    if ptx {
        out.insert(Target {
            kind: CodeKind::Ptx,
            ..sass
        });
    }
    Ok(())
}

impl fmt::Display for ArchList {
    /// The canonical spelling: `7.5;8.6+PTX;9.0a;compute_100`. SASS and PTX of
    /// the same capability fold into `X.Y+PTX`; PTX alone prints as `compute_XY`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for t in &self.0 {
            let sass = Target {
                kind: CodeKind::Sass,
                ..*t
            };
            if t.kind == CodeKind::Ptx && self.0.contains(&sass) {
                continue; // printed with its SASS as +PTX
            }
            if !first {
                f.write_str(";")?;
            }
            first = false;
            match t.kind {
                CodeKind::Sass => {
                    write!(f, "{}{}", t.cap, t.spec.suffix())?;
                    let ptx = Target {
                        kind: CodeKind::Ptx,
                        ..*t
                    };
                    if self.0.contains(&ptx) {
                        f.write_str("+PTX")?;
                    }
                }
                CodeKind::Ptx => write!(f, "{t}")?,
            }
        }
        Ok(())
    }
}

impl FromStr for ArchList {
    type Err = ArchError;
    fn from_str(s: &str) -> Result<Self, ArchError> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests;
