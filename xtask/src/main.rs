//! `cargo run -p xtask -- assets DIR`: the generated files of the Debian
//! package, from the same clap definitions the programs parse with:
//!
//! - `DIR/man/<page>.<section>.gz`: one page per program and per gpuarchctl
//!   subcommand, with FILES, ENVIRONMENT and SEE ALSO sections;
//! - `DIR/completions/{bash,zsh,fish}/` for gpuarchctl and gpuarchd, named
//!   as each shell looks them up (`gpuarchctl`, `_gpuarchctl`, `gpuarchctl.fish`).
//!
//! Pages are gzipped without a timestamp, so the same sources give the same
//! bytes (lintian wants them compressed; reproducible builds want them equal).
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Command, CommandFactory};
use clap_complete::Shell;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["assets", dir] => assets(Path::new(dir)),
        _ => bail!("usage: cargo run -p xtask -- assets DIR"),
    }
}

/// One program: its command, man section and the hand-written sections.
struct Program {
    cmd: Command,
    section: &'static str,
    extra: &'static str,
}

fn programs() -> Vec<Program> {
    vec![
        Program {
            cmd: gpuarch_ctl::Cli::command(),
            section: "1",
            extra: CTL_EXTRA,
        },
        Program {
            cmd: gpuarch_daemon::Args::command(),
            section: "8",
            extra: DAEMON_EXTRA,
        },
        Program {
            cmd: gpuarch_hook::cli::hook_command(),
            section: "8",
            extra: HOOK_EXTRA,
        },
        Program {
            cmd: gpuarch_hook::cli::runtime_command(),
            section: "8",
            extra: RUNTIME_EXTRA,
        },
    ]
}

fn assets(dir: &Path) -> Result<()> {
    let man = dir.join("man");
    std::fs::create_dir_all(&man).with_context(|| format!("create {}", man.display()))?;
    let mut pages = 0;
    for p in programs() {
        let mut cmd = p.cmd;
        cmd.build();
        pages += write_pages(&man, &cmd, p.section, p.extra, "")?;
    }
    let mut completions = 0;
    for mut cmd in [gpuarch_ctl::Cli::command(), gpuarch_daemon::Args::command()] {
        let name = cmd.get_name().to_owned();
        // Named as each shell looks them up in the package's directories.
        for (shell, file) in [
            (Shell::Bash, name.clone()),
            (Shell::Zsh, format!("_{name}")),
            (Shell::Fish, format!("{name}.fish")),
        ] {
            let out = dir.join("completions").join(shell.to_string());
            std::fs::create_dir_all(&out)?;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, &name, &mut script);
            std::fs::write(out.join(&file), script)
                .with_context(|| format!("write {shell} completion of {name}"))?;
            completions += 1;
        }
    }
    println!(
        "{pages} man pages in {}, {completions} completion files in {}",
        man.display(),
        dir.join("completions").display()
    );
    Ok(())
}

/// The page of `cmd` and, recursively, of each visible subcommand
/// (`gpuarchctl-arch-check.1`). Returns how many were written.
fn write_pages(
    dir: &Path,
    cmd: &Command,
    section: &str,
    extra: &str,
    parent: &str,
) -> Result<usize> {
    let name = if parent.is_empty() {
        cmd.get_name().to_owned()
    } else {
        format!("{parent}-{}", cmd.get_name())
    };
    let page = cmd
        .clone()
        .name(name.clone())
        .bin_name(name.replace('-', " "));
    let man = clap_mangen::Man::new(page).section(section);
    let mut roff = Vec::new();
    man.render_title(&mut roff)?;
    man.render_name_section(&mut roff)?;
    man.render_synopsis_section(&mut roff)?;
    man.render_description_section(&mut roff)?;
    man.render_options_section(&mut roff)?;
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut roff)?;
    }
    if let Some(notes) = cmd.get_after_help() {
        roff.extend_from_slice(format!(".SH NOTES\n{}\n", escape(&notes.to_string())).as_bytes());
    }
    if parent.is_empty() {
        roff.extend_from_slice(extra.as_bytes());
    } else {
        let root = name.split('-').next().unwrap_or_default();
        roff.extend_from_slice(format!(".SH SEE ALSO\n\\fB{root}\\fR({section})\n").as_bytes());
    }
    if cmd.get_version().is_some() {
        man.render_version_section(&mut roff)?;
    }
    write_gz(&dir.join(format!("{name}.{section}.gz")), &roff)?;
    let mut n = 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        n += write_pages(dir, sub, section, extra, &name)?;
    }
    Ok(n)
}

/// Text as a roff paragraph: a leading dot or quote would start a request,
/// a backslash an escape.
fn escape(text: &str) -> String {
    text.lines()
        .map(|l| {
            let l = l.replace('\\', "\\e");
            if l.starts_with(['.', '\'']) {
                format!("\\&{l}")
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n.br\n")
}

fn write_gz(path: &PathBuf, bytes: &[u8]) -> Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
    // mtime 0 and no file name in the header: the bytes depend on the text only.
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(f, flate2::Compression::best());
    gz.write_all(bytes)?;
    gz.finish()?.sync_all()?;
    Ok(())
}

const CTL_EXTRA: &str = r#".SH FILES
.TP
\fI/etc/gpuarch/config.yaml\fR
The config shared with gpuarchd and gpuarch-hook (plan, kernels).
.TP
\fI/run/gpuarch/inventory.json\fR
The inventory snapshot gpuarchd writes (the config's \fBdaemon.snapshot\fR
names another); read with \fB\-\-offline\fR.
.SH ENVIRONMENT
.TP
\fBDBUS_SYSTEM_BUS_ADDRESS\fR
The bus gpuarchd is asked on (default: the system bus).
.TP
\fBGPUARCH_CONFIG\fR, \fBGPUARCH_INVENTORY\fR, \fBGPUARCH_NVML_LIB\fR
Another config file, snapshot, or NVML library.
.SH EXIT STATUS
0 ok or yes; 1 no (\fBarch check\fR, \fBmatch\fR with no GPU, \fBinspect\fR
when a GPU runs none of the file, \fBprewarm\fR and \fBverify\fR when a
build is missing or corrupt, \fBdoctor\fR when a check fails); 2 error.
.SH SEE ALSO
\fBgpuarchd\fR(8), \fBgpuarch-hook\fR(8), \fBgpuarch-runtime\fR(8)
"#;

const DAEMON_EXTRA: &str = r#".SH FILES
.TP
\fI/etc/gpuarch/config.yaml\fR
The config; watched, and re-read on SIGHUP.
.TP
\fI/run/gpuarch/inventory.json\fR
The inventory snapshot the hook reads (the config's \fBdaemon.snapshot\fR
names another).
.TP
\fI/var/cache/gpuarch\fR
The content-addressed store of kernel builds.
.TP
\fI/var/lib/gpuarch/kernels\fR
Published kernel packages, one \fImanifest.json\fR each, mounted into containers.
.TP
\fI/usr/share/gpuarch/kernels.d\fR, \fI/etc/gpuarch/kernels.d\fR
Kernel packages (\fIkernel.yaml\fR and sources).
.SH SIGNALS
SIGHUP re-reads the config and the GPUs; SIGTERM and SIGINT stop.
.SH SEE ALSO
\fBgpuarchctl\fR(1), \fBgpuarch-hook\fR(8), \fBsystemd.service\fR(5)
"#;

const HOOK_EXTRA: &str = r#".SH FILES
.TP
\fI/usr/share/containers/oci/hooks.d/gpuarch-hook.json\fR
The podman precreate hook.
.TP
\fI/usr/share/gpuarch/oci-hooks.d/gpuarch-create-container.json\fR
The createContainer hook, for engines without precreate (CRI-O, or any
engine that reads a hooks directory).
.TP
\fI/run/gpuarch/env\fR, \fI/etc/profile.d/gpuarch.sh\fR
Written inside the container by the createContainer stage.
.SH SEE ALSO
\fBgpuarchd\fR(8), \fBgpuarch-runtime\fR(8), \fBoci-hooks\fR(5)
"#;

const RUNTIME_EXTRA: &str = r#".SH FILES
.TP
\fI/etc/gpuarch/config.yaml\fR
\fBruntime.path\fR names the runtime behind the shim.
.SH SEE ALSO
\fBgpuarch-hook\fR(8), \fBrunc\fR(8), \fBcrun\fR(1)
"#;
