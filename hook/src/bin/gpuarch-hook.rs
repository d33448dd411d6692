//! gpuarch-hook: the OCI hook. `precreate` reads the proposed config on stdin
//! and writes it, with the Plan applied, on stdout.
//!
//! Fail open: on any error the config goes out unchanged and the reason goes
//! to stderr; with `strict: true` in the config the hook exits 1 instead, and
//! the engine fails the container's start with that reason.

use std::io::Write;
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: gpuarch-hook precreate < config.json > config.json");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("precreate") if args.len() == 1 => precreate(),
        Some("--version") => {
            println!("gpuarch-hook {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        _ => usage(),
    }
}

fn precreate() -> ExitCode {
    let input = match gpuarch_core::oci::read_bounded(std::io::stdin().lock()) {
        Ok(b) => b,
        Err(e) => {
            // Nothing whole to pass through: the engine must not get half a config.
            eprintln!("gpuarch-hook: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A config that cannot be read leaves strict off: fail open.
    let (cfg, cfg_err) = match gpuarch_inventory::read_config() {
        Ok(c) => (c, None),
        Err(e) => (Default::default(), Some(e.to_string())),
    };
    let result = match cfg_err {
        Some(e) => Err(e),
        None => gpuarch_inventory::read_inventory(None, None)
            .map_err(|e| e.to_string())
            .and_then(|(inv, _)| {
                gpuarch_hook::precreate(&input, &inv, &cfg).map_err(|e| e.to_string())
            }),
    };
    let out = match result {
        Ok((out, plan)) => {
            for n in &plan.notes {
                eprintln!("gpuarch-hook: {n}");
            }
            out
        }
        Err(e) if cfg.strict => {
            eprintln!("gpuarch-hook: {e} (strict: refusing to start the container)");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("gpuarch-hook: {e}; the container starts unchanged");
            input
        }
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(&out).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuarch-hook: cannot write the config: {e}");
            ExitCode::FAILURE
        }
    }
}
