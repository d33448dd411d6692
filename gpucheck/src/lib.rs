//! What only a real GPU can show about gpuarch, for `scripts/gpu-check`.
//!
//! - [`driver`]: the CUDA driver through cudarc (loaded at run time, so this
//!   builds and answers "no CUDA driver" on a machine without one);
//! - [`numerics`]: seeded inputs, CPU references and the tolerances the
//!   store's kernels are held to;
//! - [`kernels`]: build every variant of every package for the GPU's arch
//!   through the real store, load each cubin and check its kernels;
//! - [`bus`]: `Plan` calls per second to a running gpuarchd;
//! - [`sandbox`]: the unit's `MemoryDenyWriteExecute` and seccomp filter,
//!   applied to a command, to try NVML and NVRTC under them.
//!
//! Every check is a [`Check`]: one line for people, one JSON object for the
//! report.

pub mod bus;
pub mod driver;
pub mod kernels;
pub mod numerics;
pub mod sandbox;

use serde_json::{Value, json};

/// One check's outcome.
#[derive(Debug, Clone)]
pub struct Check {
    /// `kernels`, `load`, `nvml`...
    pub part: &'static str,
    pub name: String,
    pub ok: bool,
    pub detail: String,
    /// Figures behind the verdict (errors, timings), for the report.
    pub data: Value,
}

impl Check {
    pub fn new(part: &'static str, name: impl Into<String>, ok: bool, detail: String) -> Self {
        Self {
            part,
            name: name.into(),
            ok,
            detail,
            data: Value::Null,
        }
    }

    pub fn with(mut self, data: Value) -> Self {
        self.data = data;
        self
    }

    /// `PASS kernels rmsnorm/bf16 sm_90: ...`
    pub fn line(&self) -> String {
        let verdict = if self.ok { "PASS" } else { "FAIL" };
        format!("{verdict} {} {}: {}", self.part, self.name, self.detail)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "part": self.part,
            "name": self.name,
            "ok": self.ok,
            "detail": self.detail,
            "data": self.data,
        })
    }
}
