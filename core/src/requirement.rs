//! Requirements a scheduler asks about ("which GPUs here run bf16 on Ampere
//! or newer?"): comma-joined terms, all of which a GPU must meet.
//!
//! ```text
//! arch>=8.0,feature=bf16       arch<9.0      arch=8.6      feature=flash_attention_3
//! ```
//!
//! A term is `arch OP CAP` with OP one of `>=`, `>`, `<=`, `<`, `=`, `!=` and
//! CAP as a device reports it (`8.6`) or in nvcc spelling (`sm_86`); or
//! `feature=NAME` with a name from [`crate::features::GATES`]. Spaces around
//! terms and operators are ignored. An empty requirement is met by every GPU.

use std::fmt;
use std::str::FromStr;

use crate::arch::{ComputeCapability, Target};
use crate::features::Feature;
use crate::snapshot::{Device, Snapshot};

/// A comparison of a device's compute capability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Ge,
    Gt,
    Le,
    Lt,
    Eq,
    Ne,
}

impl Op {
    /// Longest spellings first, so `>=` is not read as `>` then `=8.0`.
    const SPELLINGS: [(&'static str, Op); 6] = [
        (">=", Op::Ge),
        ("<=", Op::Le),
        ("!=", Op::Ne),
        (">", Op::Gt),
        ("<", Op::Lt),
        ("=", Op::Eq),
    ];

    fn holds(self, have: ComputeCapability, want: ComputeCapability) -> bool {
        match self {
            Op::Ge => have >= want,
            Op::Gt => have > want,
            Op::Le => have <= want,
            Op::Lt => have < want,
            Op::Eq => have == want,
            Op::Ne => have != want,
        }
    }

    fn as_str(self) -> &'static str {
        Self::SPELLINGS
            .iter()
            .find(|(_, o)| *o == self)
            .map_or("=", |(s, _)| s)
    }
}

/// One term of a requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Term {
    Arch(Op, ComputeCapability),
    Feature(Feature),
}

impl Term {
    pub fn admits(self, cap: ComputeCapability) -> bool {
        match self {
            Term::Arch(op, want) => op.holds(cap, want),
            Term::Feature(f) => f.supported_on(cap),
        }
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Term::Arch(op, cap) => write!(f, "arch{}{cap}", op.as_str()),
            Term::Feature(feat) => write!(f, "feature={feat}"),
        }
    }
}

/// A requirement that could not be read; it names the term at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad requirement term {term:?}: {reason}")]
pub struct RequirementError {
    pub term: String,
    pub reason: String,
}

/// Longest requirement [`match_uuids`] takes.
pub const MAX_REQUIREMENT: usize = 4096;

/// Why [`match_uuids`] could not answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MatchError {
    #[error("a requirement of {0} bytes; at most {MAX_REQUIREMENT}")]
    TooLong(usize),
    #[error(transparent)]
    Bad(#[from] RequirementError),
}

/// UUIDs of the GPUs of `inv` meeting `requirement`, in index order: what
/// gpuarchd's `Match` answers and `gpuarchctl match --offline` prints.
pub fn match_uuids(requirement: &str, inv: &Snapshot) -> Result<Vec<String>, MatchError> {
    if requirement.len() > MAX_REQUIREMENT {
        return Err(MatchError::TooLong(requirement.len()));
    }
    let r: Requirement = requirement.parse()?;
    Ok(r.matching(inv).map(|d| d.uuid.clone()).collect())
}

/// All the terms of one requirement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requirement(Vec<Term>);

impl Requirement {
    pub fn terms(&self) -> &[Term] {
        &self.0
    }

    /// Does a device of this capability meet every term?
    pub fn admits(&self, cap: ComputeCapability) -> bool {
        self.0.iter().all(|t| t.admits(cap))
    }

    /// The GPUs of `inv` that meet it, in index order.
    pub fn matching<'a>(&'a self, inv: &'a Snapshot) -> impl Iterator<Item = &'a Device> + 'a {
        inv.devices
            .iter()
            .filter(|d| self.admits(d.compute_capability))
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

fn parse_term(raw: &str) -> Result<Term, RequirementError> {
    let term = raw.trim();
    let err = |reason: String| RequirementError {
        term: term.to_owned(),
        reason,
    };
    if term.is_empty() {
        return Err(err(
            "empty term (two commas in a row, or a trailing comma)".to_owned()
        ));
    }
    if let Some(rest) = term.strip_prefix("feature") {
        let name = rest
            .trim_start()
            .strip_prefix('=')
            .ok_or_else(|| err("expected feature=NAME".to_owned()))?;
        let f = Feature::from_str(name.trim()).map_err(|e| err(e.to_string()))?;
        return Ok(Term::Feature(f));
    }
    if let Some(rest) = term.strip_prefix("arch") {
        let rest = rest.trim_start();
        let (op, value) = Op::SPELLINGS
            .iter()
            .find_map(|(s, op)| rest.strip_prefix(s).map(|v| (*op, v.trim())))
            .ok_or_else(|| {
                err(
                    "expected arch>=X.Y, arch>X.Y, arch<=X.Y, arch<X.Y, arch=X.Y or arch!=X.Y"
                        .to_owned(),
                )
            })?;
        let cap = parse_cap(value).map_err(|e| err(e.to_string()))?;
        return Ok(Term::Arch(op, cap));
    }
    Err(err(
        "expected arch<op>X.Y or feature=NAME (e.g. arch>=8.0,feature=bf16)".to_owned(),
    ))
}

/// `8.6` or `sm_86`; suffixes (`9.0a`) and PTX forms name build targets,
/// not devices, and are refused.
fn parse_cap(value: &str) -> Result<ComputeCapability, BadCapability> {
    if value.is_empty() {
        return Err(BadCapability::Missing);
    }
    if let Ok(c) = ComputeCapability::parse_reported(value) {
        return Ok(c);
    }
    match Target::parse(value) {
        Ok(t) if t.to_string() == format!("sm_{}", t.cap.digits()) => Ok(t.cap),
        Ok(t) => Err(BadCapability::BuildTarget(t)),
        Err(e) => Err(BadCapability::Arch(e)),
    }
}

/// Why an `arch` term's value is not a device capability.
#[derive(Debug, thiserror::Error)]
enum BadCapability {
    #[error("no compute capability after the operator")]
    Missing,
    #[error("{0} is a build target; give a device capability such as {cap}", cap = .0.cap)]
    BuildTarget(Target),
    #[error("{0}")]
    Arch(crate::arch::ArchError),
}

impl FromStr for Requirement {
    type Err = RequirementError;

    fn from_str(s: &str) -> Result<Self, RequirementError> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        s.split(',')
            .map(parse_term)
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::tests::host;

    fn cc(major: u8, minor: u8) -> ComputeCapability {
        ComputeCapability::new(major, minor)
    }

    #[test]
    fn terms_parse_and_print_back() {
        let r: Requirement = " arch >= 8.0 , feature=bf16,arch<sm_90 ,arch!=8.6"
            .parse()
            .unwrap();
        assert_eq!(
            r.terms(),
            [
                Term::Arch(Op::Ge, cc(8, 0)),
                Term::Feature(Feature::Bf16),
                Term::Arch(Op::Lt, cc(9, 0)),
                Term::Arch(Op::Ne, cc(8, 6)),
            ]
        );
        assert_eq!(r.to_string(), "arch>=8.0,feature=bf16,arch<9.0,arch!=8.6");
        assert_eq!(r.to_string().parse::<Requirement>().unwrap(), r);
    }

    #[test]
    fn every_operator_compares_as_written() {
        let table = [
            ("arch>=8.6", [false, true, true]),
            ("arch>8.6", [false, false, true]),
            ("arch<=8.6", [true, true, false]),
            ("arch<8.6", [true, false, false]),
            ("arch=8.6", [false, true, false]),
            ("arch!=8.6", [true, false, true]),
        ];
        for (req, want) in table {
            let r: Requirement = req.parse().unwrap();
            let got = [cc(7, 5), cc(8, 6), cc(9, 0)].map(|c| r.admits(c));
            assert_eq!(got, want, "{req}");
        }
    }

    #[test]
    fn features_follow_the_gate_table() {
        let r: Requirement = "feature=flash_attention_3".parse().unwrap();
        assert!(r.admits(cc(9, 0)) && !r.admits(cc(10, 0)) && !r.admits(cc(8, 9)));
        let r: Requirement = "feature=fp8".parse().unwrap();
        assert!(r.admits(cc(8, 9)) && !r.admits(cc(8, 6)));
    }

    #[test]
    fn empty_is_everything_and_matching_keeps_index_order() {
        let inv = host();
        let all: Requirement = "".parse().unwrap();
        assert_eq!(all.matching(&inv).count(), inv.devices.len());
        let r: Requirement = "feature=bf16".parse().unwrap();
        let got: Vec<u32> = r.matching(&inv).map(|d| d.index).collect();
        let want: Vec<u32> = inv
            .devices
            .iter()
            .filter(|d| d.compute_capability >= cc(8, 0))
            .map(|d| d.index)
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn bad_terms_are_named() {
        let cases = [
            (
                "arch>=8.0,feature=bf17",
                "feature=bf17",
                "unknown feature 'bf17'",
            ),
            ("arch>=8.0,,feature=bf16", "", "empty term"),
            ("arch>=8.0,", "", "empty term"),
            ("arch~8.0", "arch~8.0", "expected arch>=X.Y"),
            ("arch>=", "arch>=", "no compute capability"),
            ("arch>=eight", "arch>=eight", "eight"),
            ("arch=9.0a", "arch=9.0a", "is a build target"),
            ("arch=compute_80", "arch=compute_80", "is a build target"),
            ("feature:bf16", "feature:bf16", "expected feature=NAME"),
            (
                "memory>=16G",
                "memory>=16G",
                "expected arch<op>X.Y or feature=NAME",
            ),
        ];
        for (req, term, reason) in cases {
            let e = req.parse::<Requirement>().unwrap_err();
            assert_eq!(e.term, term, "{req}: {e}");
            assert!(e.reason.contains(reason), "{req}: {e}");
            assert!(e.to_string().contains(&format!("{term:?}")), "{e}");
        }
    }
}
