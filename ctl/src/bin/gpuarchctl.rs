//! gpuarchctl: parse arguments, run, print errors in one line.

use std::process::ExitCode;

use clap::Parser;
use gpuarch_ctl::{self as ctl, Cli};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // inspect and audit map the files they read: one rewritten meanwhile
    // is named, not a "Bus error".
    gpuarch_kernels::file::exit_clearly_on_sigbus(c"gpuarchctl", ctl::EXIT_ERROR);
    match ctl::run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("gpuarchctl: {}", ctl::one_line(&e));
            ExitCode::from(ctl::EXIT_ERROR)
        }
    }
}
