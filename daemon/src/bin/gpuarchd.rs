//! gpuarchd: parse arguments, run the daemon, report a fatal error in one line.

use std::process::ExitCode;

use clap::Parser;
use gpuarch_daemon::{Args, check_config, run};

fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.build_worker {
        return match gpuarch_kernels::worker::serve(
            std::io::stdin().lock(),
            std::io::stdout().lock(),
        ) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpuarchd --build-worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if args.audit_worker {
        // A file of the image truncated while mapped: named in the
        // worker's answer to gpuarchd, not a bare signal.
        gpuarch_kernels::file::exit_clearly_on_sigbus(c"gpuarchd --audit-worker", 1);
        return match gpuarch_audit::serve(std::io::stdin().lock(), std::io::stdout().lock()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpuarchd --audit-worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(path) = args.check_config.take() {
        return ExitCode::from(check_config(&args, path));
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuarchd: {}", gpuarch_core::one_line(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
