//! Feature gates: which compute capability each feature needs. One table,
//! [`GATES`]; the Plan, `Match` requirements and the CLI all read it.

use std::fmt;
use std::str::FromStr;

use crate::arch::ComputeCapability;

/// A capability-gated feature that software in a container picks at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feature {
    Bf16,
    Tf32,
    Fp8,
    FlashAttention2,
    FlashAttention3,
    FlashInfer,
}

/// What a feature asks of a device's capability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    AtLeast(ComputeCapability),
    Exactly(ComputeCapability),
}

impl Gate {
    pub fn admits(self, cap: ComputeCapability) -> bool {
        match self {
            Gate::AtLeast(min) => cap >= min,
            Gate::Exactly(only) => cap == only,
        }
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gate::AtLeast(c) => write!(f, ">= {c}"),
            Gate::Exactly(c) => write!(f, "exactly {c}"),
        }
    }
}

/// The gates: (feature, its name in requirements and output, the gate).
pub const GATES: [(Feature, &str, Gate); 6] = [
    (
        Feature::Bf16,
        "bf16",
        Gate::AtLeast(ComputeCapability::new(8, 0)),
    ),
    (
        Feature::Tf32,
        "tf32",
        Gate::AtLeast(ComputeCapability::new(8, 0)),
    ),
    (
        Feature::Fp8,
        "fp8",
        Gate::AtLeast(ComputeCapability::new(8, 9)),
    ),
    (
        Feature::FlashAttention2,
        "flash_attention_2",
        Gate::AtLeast(ComputeCapability::new(8, 0)),
    ),
    (
        Feature::FlashAttention3,
        "flash_attention_3",
        Gate::Exactly(ComputeCapability::new(9, 0)),
    ),
    (
        Feature::FlashInfer,
        "flashinfer",
        Gate::AtLeast(ComputeCapability::new(7, 5)),
    ),
];

impl Feature {
    pub const ALL: [Feature; 6] = [
        Feature::Bf16,
        Feature::Tf32,
        Feature::Fp8,
        Feature::FlashAttention2,
        Feature::FlashAttention3,
        Feature::FlashInfer,
    ];

    fn row(self) -> &'static (Feature, &'static str, Gate) {
        // GATES lists every variant; the test below keeps it that way.
        GATES
            .iter()
            .find(|(f, _, _)| *f == self)
            .unwrap_or(&GATES[0])
    }

    pub fn name(self) -> &'static str {
        self.row().1
    }

    pub fn gate(self) -> Gate {
        self.row().2
    }

    /// Does a device of capability `cap` have this feature?
    pub fn supported_on(self, cap: ComputeCapability) -> bool {
        self.gate().admits(cap)
    }

    /// Do all these devices have it? False for no devices: nothing to run on.
    pub fn supported_on_all(self, caps: &[ComputeCapability]) -> bool {
        !caps.is_empty() && caps.iter().all(|c| self.supported_on(*c))
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown feature name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown feature '{0}' (known: bf16, tf32, fp8, flash_attention_2, flash_attention_3, flashinfer)"
)]
pub struct UnknownFeature(pub String);

impl FromStr for Feature {
    type Err = UnknownFeature;
    fn from_str(s: &str) -> Result<Self, UnknownFeature> {
        GATES
            .iter()
            .find(|(_, n, _)| n.eq_ignore_ascii_case(s.trim()))
            .map(|(f, _, _)| *f)
            .ok_or_else(|| UnknownFeature(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(major: u8, minor: u8) -> ComputeCapability {
        ComputeCapability::new(major, minor)
    }

    #[test]
    fn every_feature_has_exactly_one_row_and_its_name_parses_back() {
        for f in Feature::ALL {
            assert_eq!(GATES.iter().filter(|(g, _, _)| *g == f).count(), 1, "{f:?}");
            assert_eq!(f.name().parse::<Feature>(), Ok(f));
        }
        assert!("flash_attention_4".parse::<Feature>().is_err());
    }

    #[test]
    fn gates_match_the_design() {
        let rows: &[(Feature, &[(ComputeCapability, bool)])] = &[
            (
                Feature::Bf16,
                &[(cc(7, 5), false), (cc(8, 0), true), (cc(12, 0), true)],
            ),
            (Feature::Tf32, &[(cc(7, 5), false), (cc(8, 6), true)]),
            (
                Feature::Fp8,
                &[(cc(8, 6), false), (cc(8, 9), true), (cc(9, 0), true)],
            ),
            (
                Feature::FlashAttention2,
                &[(cc(7, 5), false), (cc(8, 0), true)],
            ),
            (
                Feature::FlashAttention3,
                &[(cc(8, 9), false), (cc(9, 0), true), (cc(10, 0), false)],
            ),
            (Feature::FlashInfer, &[(cc(7, 0), false), (cc(7, 5), true)]),
        ];
        for (f, cases) in rows {
            for (cap, want) in *cases {
                assert_eq!(f.supported_on(*cap), *want, "{f} on {cap}");
            }
        }
    }

    #[test]
    fn all_of_a_mixed_set_must_qualify() {
        assert!(!Feature::Bf16.supported_on_all(&[cc(7, 5), cc(8, 6)]));
        assert!(Feature::Bf16.supported_on_all(&[cc(8, 0), cc(9, 0)]));
        assert!(!Feature::Bf16.supported_on_all(&[]));
    }
}
