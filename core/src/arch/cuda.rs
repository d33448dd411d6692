//! CUDA versions, as NVML reports the driver's and a toolkit names its
//! own.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ArchError;

/// A CUDA version such as 12.4, as NVML reports the driver's or a toolkit has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion {
    pub major: u16,
    pub minor: u16,
}

impl CudaVersion {
    pub const fn new(major: u16, minor: u16) -> Self {
        Self { major, minor }
    }

    /// From NVML's integer form: 12040 is 12.4.
    pub fn from_nvml(v: i32) -> Option<Self> {
        let v = u32::try_from(v).ok()?;
        Some(Self::new(
            u16::try_from(v / 1000).ok()?,
            u16::try_from((v % 1000) / 10).ok()?,
        ))
    }

    pub fn parse(s: &str) -> Result<Self, ArchError> {
        let err = || ArchError::CudaVersion {
            token: s.to_owned(),
        };
        let (a, b) = s.trim().split_once('.').ok_or_else(err)?;
        let num = |x: &str| {
            if x.is_empty() || x.len() > 3 || !x.bytes().all(|c| c.is_ascii_digit()) {
                Err(err())
            } else {
                x.parse::<u16>().map_err(|_| err())
            }
        };
        Ok(Self::new(num(a)?, num(b)?))
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for CudaVersion {
    type Err = ArchError;
    fn from_str(s: &str) -> Result<Self, ArchError> {
        Self::parse(s)
    }
}

impl Serialize for CudaVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CudaVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // YAML reads `12.8` as a number: take its text either way.
        let v = serde_yaml::Value::deserialize(d)?;
        let s = match &v {
            serde_yaml::Value::String(s) => s.clone(),
            serde_yaml::Value::Number(n) => n.to_string(),
            _ => return Err(serde::de::Error::custom("a CUDA version such as \"12.8\"")),
        };
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}
