//! gpuarch-oci-floor: read a JSON document on stdin, parse it with the same
//! serde_json as gpuarch-hook (`arbitrary_precision`), write it back
//! encoded. What `gpuarch-hook precreate` cannot do with less; the ratio
//! of the hook to this is what gpuarch itself adds (scripts/bench-hook).

use std::io::{Read, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut bytes = Vec::new();
    if std::io::stdin().lock().read_to_end(&mut bytes).is_err() {
        return ExitCode::FAILURE;
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return ExitCode::FAILURE;
    };
    let Ok(out) = serde_json::to_vec(&value) else {
        return ExitCode::FAILURE;
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(&out).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}
