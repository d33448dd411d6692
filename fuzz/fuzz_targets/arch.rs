//! Capability and arch-list strings: every parser of the architecture model,
//! and the compatibility check on what parses.
#![no_main]
use libfuzzer_sys::fuzz_target;

use gpuarch_core::arch::{ArchList, ComputeCapability, CudaVersion, Target};
use gpuarch_core::requirement::Requirement;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let cap = s.parse::<ComputeCapability>();
    let _ = ComputeCapability::parse_known(s);
    let _ = ComputeCapability::parse_reported(s);
    let _ = s.parse::<CudaVersion>();
    let _ = s.parse::<Requirement>();
    if let Ok(t) = s.parse::<Target>() {
        // Printing and parsing again gives the same target.
        assert_eq!(t.to_string().parse::<Target>().ok(), Some(t), "{s:?}");
    }
    if let Ok(list) = s.parse::<ArchList>() {
        for on in ["7.5", "8.6", "9.0"] {
            let on: ComputeCapability = on.parse().expect("known");
            let _ = list.runs_on(on, "13.0".parse().ok());
        }
        if let Ok(c) = cap {
            let _ = list.runs_on(c, None);
        }
    }
});
