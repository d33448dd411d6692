//! gpuarchd: parse arguments, run the daemon, report a fatal error in one line.

use std::process::ExitCode;

use clap::Parser;
use gpuarch_daemon::{Args, check_config, ctl, run};

fn main() -> ExitCode {
    let mut args = Args::parse();
    if let Some(path) = args.check_config.take() {
        return ExitCode::from(check_config(&args, path));
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuarchd: {}", ctl::one_line(&e));
            ExitCode::FAILURE
        }
    }
}
