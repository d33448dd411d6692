//! NVRTC out of the daemon: each compilation, and the one probe of which
//! NVRTC is there, runs in a short-lived worker process that the builder
//! starts, bounds and reaps. gpuarchd itself never loads NVRTC: its memory
//! goes back when a build ends, a compiler that hangs is killed at
//! `build_timeout_s`, and one that grows past the memory cap, or crashes,
//! fails that build with its reason and nothing else.
//!
//! The worker is gpuarchd's own program (`gpuarchd --build-worker`). It
//! reads one [`Request`] as JSON on its standard input, answers one
//! [`Response`] on its standard output, and exits. It writes a build's
//! files itself, into the staging directory the store made for it.

use std::io::{self, Read, Write};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuarch_core::arch::Target;
use serde::{Deserialize, Serialize};

use crate::command::kill_group;
use crate::error::BuildError;
use crate::toolchain::Nvrtc;

/// The most a request (sources and headers) or an answer may be.
const MAX_MESSAGE: u64 = 64 << 20;
/// What is kept of a worker's standard error for a failure's reason.
const MAX_STDERR: u64 = 16 << 10;

/// What a worker is asked.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Which NVRTC and headers `cuda_dirs` give.
    Probe { cuda_dirs: Vec<PathBuf> },
    /// Compile `main` (with `headers`) with `options` for each target,
    /// each into its file (created, never replaced).
    Compile {
        cuda_dirs: Vec<PathBuf>,
        main: (String, Vec<u8>),
        headers: Vec<(String, Vec<u8>)>,
        options: Vec<String>,
        outputs: Vec<(String, PathBuf)>,
    },
}

/// What NVRTC a worker found: what a build's key names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    pub library: PathBuf,
    pub version: String,
    pub headers_digest: String,
}

impl Probe {
    pub fn of(n: &Nvrtc) -> Self {
        Self {
            library: n.library.clone(),
            version: n.version.clone(),
            headers_digest: n.headers_digest.clone(),
        }
    }
}

/// A worker's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case", deny_unknown_fields)]
pub enum Response {
    /// The probe, or the NVRTC a compilation ran with.
    Done { nvrtc: Probe },
    /// A build error: `rejected` as [`BuildError::Rejected`].
    Failed { rejected: bool, error: String },
}

impl From<BuildError> for Response {
    fn from(e: BuildError) -> Self {
        match e {
            BuildError::Rejected(error) => Response::Failed {
                rejected: true,
                error,
            },
            BuildError::Tool(error) => Response::Failed {
                rejected: false,
                error,
            },
        }
    }
}

/// The worker's side: answer the request on `input` on `output`.
pub fn serve(input: impl Read, mut output: impl Write) -> io::Result<()> {
    let mut text = Vec::new();
    input.take(MAX_MESSAGE + 1).read_to_end(&mut text)?;
    let answer = if text.len() as u64 > MAX_MESSAGE {
        Response::from(BuildError::Tool("the request is too large".into()))
    } else {
        match serde_json::from_slice::<Request>(&text) {
            Ok(r) => answer(r).unwrap_or_else(Response::from),
            Err(e) => Response::from(BuildError::Tool(format!("not a build request: {e}"))),
        }
    };
    serde_json::to_writer(&mut output, &answer)?;
    output.flush()
}

fn answer(r: Request) -> Result<Response, BuildError> {
    match r {
        Request::Probe { cuda_dirs } => Ok(Response::Done {
            nvrtc: Probe::of(&Nvrtc::load(&cuda_dirs)?),
        }),
        Request::Compile {
            cuda_dirs,
            main,
            headers,
            options,
            outputs,
        } => {
            let nvrtc = Nvrtc::load(&cuda_dirs)?;
            for (target, file) in &outputs {
                let t = Target::parse(target)
                    .map_err(|e| BuildError::Rejected(format!("target {target}: {e}")))?;
                let c = nvrtc.compile((&main.0, &main.1), &headers, t, &options)?;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(file)?;
                f.write_all(&c.code)?;
            }
            Ok(Response::Done {
                nvrtc: Probe::of(&nvrtc),
            })
        }
    }
}

/// How the builder starts a worker, and its bounds.
#[derive(Clone, Debug)]
pub struct Worker {
    /// The program and its arguments: `/proc/self/exe --build-worker`.
    pub argv: Vec<String>,
    /// The worker's address space (`RLIMIT_AS`).
    pub memory_bytes: u64,
}

impl Worker {
    /// gpuarchd's own program, as it runs now (even if replaced on disk
    /// since), in worker mode.
    pub fn this_program(memory_bytes: u64) -> Self {
        Self {
            argv: vec!["/proc/self/exe".into(), "--build-worker".into()],
            memory_bytes,
        }
    }

    /// Run `req` in a new worker within `timeout`: its answer, or why
    /// there is none. The worker is killed at `timeout`, with anything it
    /// started, and always reaped.
    pub fn call(&self, req: &Request, timeout: Duration) -> Result<Response, BuildError> {
        let tool = |m: String| BuildError::Tool(format!("build worker: {m}"));
        let body = serde_json::to_vec(req).map_err(|e| tool(e.to_string()))?;
        let (prog, args) = self
            .argv
            .split_first()
            .ok_or_else(|| tool("no program".into()))?;
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let limit = self.memory_bytes;
        // SAFETY: setrlimit is async-signal-safe and touches no memory of
        // the parent.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::resource::setrlimit(
                    nix::sys::resource::Resource::RLIMIT_AS,
                    limit,
                    limit,
                )
                .map_err(io::Error::from)?;
                nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)
                    .map_err(io::Error::from)
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| tool(format!("cannot start {prog}: {e}")))?;
        let pid = child.id();
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            kill_group(pid);
            let _ = child.wait();
            return Err(tool("no pipes".into()));
        };
        // Each pipe on its own thread: a worker that writes much to one
        // while the other is full never blocks the other's reader.
        let feed = std::thread::spawn(move || {
            let _ = stdin.write_all(&body);
        });
        let out = std::thread::spawn(move || read_bounded(stdout, MAX_MESSAGE));
        let err = std::thread::spawn(move || read_bounded(stderr, MAX_STDERR));
        let start = Instant::now();
        let mut nap = Duration::from_millis(1);
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Ok(s),
                Ok(None) if start.elapsed() >= timeout => break Err(()),
                Ok(None) => {
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_millis(20));
                }
                Err(e) => {
                    kill_group(pid);
                    let _ = child.wait();
                    return Err(tool(e.to_string()));
                }
            }
        };
        // Whatever it left in its group goes with it.
        kill_group(pid);
        let status = match status {
            Ok(s) => s,
            Err(()) => {
                let _ = child.wait();
                let _ = (feed.join(), out.join(), err.join());
                return Err(BuildError::Tool(format!(
                    "the build ran past its limit of {} (kernels.build_timeout_s); its worker was killed",
                    shown(timeout)
                )));
            }
        };
        let _ = feed.join();
        let stdout = out.join().unwrap_or_default();
        let stderr = err.join().unwrap_or_default();
        let said = String::from_utf8_lossy(&stderr).trim_end().to_owned();
        let said = if said.is_empty() {
            String::new()
        } else {
            format!(": {said}")
        };
        if let Some(sig) = std::os::unix::process::ExitStatusExt::signal(&status) {
            return Err(BuildError::Tool(format!(
                "the build worker died of signal {sig} (its memory is capped at {} MiB, kernels.build_memory_mib){said}",
                self.memory_bytes >> 20
            )));
        }
        match serde_json::from_slice::<Response>(&stdout) {
            Ok(r) if status.success() => Ok(r),
            Ok(_) | Err(_) => Err(tool(format!("exited with {status} and no answer{said}"))),
        }
    }

    /// Which NVRTC the worker finds in `cuda_dirs`.
    pub fn probe(&self, cuda_dirs: &[PathBuf], timeout: Duration) -> Result<Probe, BuildError> {
        let req = Request::Probe {
            cuda_dirs: cuda_dirs.to_vec(),
        };
        match self.call(&req, timeout)? {
            Response::Done { nvrtc } => Ok(nvrtc),
            Response::Failed { rejected, error } => Err(failed(rejected, error)),
        }
    }

    /// Compile in a worker, which must run the NVRTC `expect` names (the
    /// one the build's key was made with).
    #[allow(clippy::too_many_arguments)]
    pub fn compile(
        &self,
        expect: &Probe,
        cuda_dirs: &[PathBuf],
        main: (&str, &[u8]),
        headers: &[(String, Vec<u8>)],
        options: &[String],
        outputs: &[(Target, &Path)],
        timeout: Duration,
    ) -> Result<(), BuildError> {
        let req = Request::Compile {
            cuda_dirs: cuda_dirs.to_vec(),
            main: (main.0.to_owned(), main.1.to_vec()),
            headers: headers.to_vec(),
            options: options.to_vec(),
            outputs: outputs
                .iter()
                .map(|(t, p)| (t.to_string(), p.to_path_buf()))
                .collect(),
        };
        match self.call(&req, timeout)? {
            Response::Done { nvrtc } if nvrtc == *expect => Ok(()),
            Response::Done { nvrtc } => Err(BuildError::Tool(format!(
                "NVRTC changed since gpuarchd found it ({} {} then, {} {} now): reload gpuarchd",
                expect.library.display(),
                expect.version,
                nvrtc.library.display(),
                nvrtc.version
            ))),
            Response::Failed { rejected, error } => Err(failed(rejected, error)),
        }
    }
}

/// `600 s`, or `300 ms` below a second.
fn shown(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

fn failed(rejected: bool, error: String) -> BuildError {
    if rejected {
        BuildError::Rejected(error)
    } else {
        BuildError::Tool(error)
    }
}

/// Up to `limit` bytes of `r`, then the rest drained and dropped.
fn read_bounded(r: impl Read, limit: u64) -> Vec<u8> {
    let mut r = r;
    let mut v = Vec::new();
    let _ = (&mut r).take(limit).read_to_end(&mut v);
    let _ = io::copy(&mut r, &mut io::sink());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Worker {
        Worker {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            memory_bytes: 1 << 30,
        }
    }

    fn probe() -> Request {
        Request::Probe {
            cuda_dirs: Vec::new(),
        }
    }

    #[test]
    fn a_worker_that_hangs_is_killed_at_its_limit_with_what_it_started() {
        let t0 = Instant::now();
        // It starts a grandchild in its group that would outlive it.
        let e = sh("sleep 300 & sleep 300")
            .call(&probe(), Duration::from_millis(300))
            .unwrap_err();
        assert!(
            matches!(&e, BuildError::Tool(m) if m.contains("ran past its limit of 300 ms")),
            "{e:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_worker_that_crashes_or_says_nothing_fails_the_build_with_why() {
        let e = sh("echo 'out of memory' >&2; kill -SEGV $$")
            .call(&probe(), Duration::from_secs(10))
            .unwrap_err()
            .to_string();
        assert!(e.contains("died of signal 11"), "{e}");
        assert!(e.contains("out of memory"), "{e}");
        let e = sh("cat >/dev/null; echo garbage")
            .call(&probe(), Duration::from_secs(10))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("exited with exit status: 0 and no answer"),
            "{e}"
        );
        let e = sh("exit 3")
            .call(&probe(), Duration::from_secs(10))
            .unwrap_err()
            .to_string();
        assert!(e.contains("exit status: 3"), "{e}");
    }

    #[test]
    fn the_memory_cap_applies_to_the_worker() {
        // The shell's own limit, as the worker sees it.
        let w = Worker {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                r#"cat >/dev/null; printf '{"answer":"failed","rejected":false,"error":"%s"}' "$(ulimit -v)""#.into(),
            ],
            memory_bytes: 256 << 20,
        };
        match w.call(&probe(), Duration::from_secs(10)).unwrap() {
            Response::Failed { error, .. } => assert_eq!(error, (256 * 1024).to_string()),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn the_worker_answers_what_it_is_asked_and_refuses_what_it_cannot_read() {
        let mut out = Vec::new();
        serve(&b"{\"op\": \"nonsense\"}"[..], &mut out).unwrap();
        let r: Response = serde_json::from_slice(&out).unwrap();
        assert!(
            matches!(&r, Response::Failed { rejected: false, error } if error.contains("not a build request")),
            "{r:?}"
        );
        // A probe where there is no NVRTC: its reason, not a crash.
        let mut out = Vec::new();
        let req = serde_json::to_vec(&Request::Probe {
            cuda_dirs: vec!["/nonexistent".into()],
        })
        .unwrap();
        serve(&req[..], &mut out).unwrap();
        let _: Response = serde_json::from_slice(&out).unwrap();
    }
}
