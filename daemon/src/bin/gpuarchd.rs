//! gpuarchd: parse arguments, run the daemon, report a fatal error in one line.

use std::process::ExitCode;

use clap::Parser;
use gpuarch_daemon::{Args, check_config, run};

fn main() -> ExitCode {
    let mut args = Args::parse();
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
