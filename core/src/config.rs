//! The parts of `/etc/gpuarch/config.yaml` that planning obeys. The file is
//! shared by the daemon and the hook; sections for them are added by the
//! issues that build them. Unknown keys are errors, so a typo never passes as
//! a default.
//!
//! ```yaml
//! strict: false          # default: fail open (containers start unchanged on error)
//! env:
//!   override: false      # default: a variable the container sets is left alone
//!   disable: []          # default: inject every variable; e.g. [GPUARCH_FP8]
//! ```

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::plan::EnvVar;

/// The whole config file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Fail the container's start with the reason when planning fails,
    /// instead of starting it unchanged. Default `false`.
    pub strict: bool,
    pub env: EnvConfig,
}

/// How the Plan's variables are injected.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvConfig {
    /// Replace values the container already sets. Default `false`.
    #[serde(rename = "override")]
    pub override_existing: bool,
    /// Variables never to inject. Default: none.
    pub disable: BTreeSet<EnvVar>,
}

/// A config that could not be read, with where in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{reason}", location.map(|(l, c)| format!("line {l}, column {c}: ")).unwrap_or_default())]
pub struct ConfigError {
    /// 1-based line and column, when known.
    pub location: Option<(usize, usize)>,
    pub reason: String,
}

impl Config {
    /// Parse the YAML text of a config file. An empty file (or one of only
    /// comments) is the default config.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let err = |e: serde_yaml::Error| ConfigError {
            location: e.location().map(|l| (l.line(), l.column())),
            reason: e.to_string(),
        };
        let value: serde_yaml::Value = serde_yaml::from_str(text).map_err(err)?;
        if value.is_null() {
            return Ok(Self::default());
        }
        serde_yaml::from_str(text).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_a_full_file() {
        assert_eq!(Config::from_yaml("").unwrap(), Config::default());
        assert_eq!(Config::from_yaml("# nothing\n").unwrap(), Config::default());
        let c =
            Config::from_yaml("strict: true\nenv:\n  override: true\n  disable: [GPUARCH_FP8]\n")
                .unwrap();
        assert!(c.strict && c.env.override_existing);
        assert_eq!(c.env.disable, [EnvVar::Fp8].into());
    }

    #[test]
    fn mistakes_name_the_line_and_the_key() {
        let e = Config::from_yaml("strict: false\nenv:\n  overide: true\n").unwrap_err();
        assert_eq!(e.location.map(|l| l.0), Some(3), "{e}");
        assert!(e.to_string().contains("overide"), "{e}");

        let e = Config::from_yaml("env:\n  disable: [GPUARCH_FP9]\n").unwrap_err();
        assert_eq!(e.location.map(|l| l.0), Some(2), "{e}");
        assert!(
            e.to_string().contains("unknown variable 'GPUARCH_FP9'"),
            "{e}"
        );

        let e = Config::from_yaml("strict: [\n").unwrap_err();
        assert!(e.location.is_some(), "{e}");

        let e = Config::from_yaml("strict: maybe\n").unwrap_err();
        assert!(e.to_string().starts_with("line 1"), "{e}");
    }
}
