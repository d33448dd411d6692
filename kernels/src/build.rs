//! Building a package for one architecture: pick the variant, build it
//! through its backend into the store, fall back to the next variant when
//! the compiler refuses one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use gpuarch_core::arch::{CodeKind, Target};
use serde_json::json;

use crate::command::{self, Vars};
use crate::remote::{Remote, RemoteError};
use crate::spec::{BuildSpec, Package, sha256_hex};
use crate::store::{self, BuildError, BuildInfo, Entry, Meta, Outcome, Store};
use crate::toolchain::{self, Nvrtc};
use crate::worker::{Probe, Worker};

/// One variant that does not serve an arch, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable {
    pub variant: String,
    pub reason: String,
}

/// What building (or looking up) a package for one arch came to.
#[derive(Clone, Debug)]
pub struct ArchResult {
    pub package: String,
    pub arch: Target,
    /// The entry that serves it, and whether it was built just now.
    pub served: Option<(Entry, bool)>,
    /// Variants passed over, in order, with the reason.
    pub unavailable: Vec<Unavailable>,
    /// Set when nothing serves the arch because of a failure around the
    /// build (no compiler, a full disk): worth retrying later.
    pub error: Option<String>,
}

impl ArchResult {
    /// Nothing serves the task's arch, for `why`.
    pub fn failed(task: &Task, why: &str) -> Self {
        Self {
            package: task.package.clone(),
            arch: task.arch,
            served: None,
            unavailable: Vec::new(),
            error: Some(why.to_owned()),
        }
    }
}

/// How [`Builder::resolve`] gets a variant that is not stored yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// It does not: only what is stored serves.
    Stored,
    /// From the registry when it has it (`kernels.remote`), else built here.
    Build,
    /// From the registry only: nothing is built here.
    Pull,
}

/// Why a variant was not pulled.
struct NotPulled(String);

/// How long a failed probe of NVRTC stands before it is asked again.
pub const PROBE_RETRY: Duration = Duration::from_secs(30);

/// Builds packages into a store.
#[derive(Debug)]
pub struct Builder {
    pub store: Store,
    cuda_dirs: Vec<PathBuf>,
    timeout: Duration,
    nvrtc: OnceLock<Result<Nvrtc, BuildError>>,
    /// Where NVRTC runs: in a worker process per build (gpuarchd), or
    /// loaded here (tests, benchmarks, gpucheck).
    worker: Option<Worker>,
    /// The worker's NVRTC once a probe found it; a failure, with when, is
    /// kept [`PROBE_RETRY`].
    probed: Mutex<Option<(std::time::Instant, Result<Probe, BuildError>)>>,
    /// Keys of command programs already digested, by path.
    programs: Mutex<BTreeMap<PathBuf, String>>,
    /// The registry tier (`kernels.remote`): pulled before a build, pushed
    /// after one.
    remote: Option<Box<dyn Remote>>,
}

/// The inputs of variant `i` of `pkg`, without the toolkit: sources,
/// build section, variant. Two builds with the same inputs and arch differ
/// only by toolkit.
pub fn inputs_digest(pkg: &Package, i: usize) -> String {
    let v = &pkg.spec.variants[i];
    let record = json!({
        "package": pkg.spec.name,
        "sources": pkg.spec.sources.iter().zip(&pkg.digests).collect::<Vec<_>>(),
        "build": pkg.spec.build,
        "variant": v,
        "exports": pkg.exports(i),
    });
    sha256_hex(record.to_string().as_bytes())
}

impl Builder {
    pub fn new(store: Store, cuda_dirs: Vec<PathBuf>, timeout: Duration) -> Self {
        Self {
            store,
            cuda_dirs,
            timeout,
            nvrtc: OnceLock::new(),
            worker: None,
            probed: Mutex::new(None),
            programs: Mutex::new(BTreeMap::new()),
            remote: None,
        }
    }

    /// Pull from and push to `remote`.
    pub fn with_remote(mut self, remote: Box<dyn Remote>) -> Self {
        self.remote = Some(remote);
        self
    }

    /// Run NVRTC in `worker` processes, never in this one.
    pub fn with_worker(mut self, worker: Worker) -> Self {
        self.worker = Some(worker);
        self
    }

    /// Which NVRTC builds run with: asked of a worker once it answers (a
    /// failure is asked again after [`PROBE_RETRY`], so reads of it cannot
    /// start a process each), or loaded here.
    pub fn nvrtc_probe(&self) -> Result<Probe, BuildError> {
        let Some(w) = &self.worker else {
            return self.nvrtc().map(Probe::of);
        };
        // One probe at a time: the lock is held across it.
        let mut slot = self
            .probed
            .lock()
            .map_err(|e| BuildError::Tool(e.to_string()))?;
        match slot.as_ref() {
            Some((_, Ok(p))) => return Ok(p.clone()),
            Some((at, Err(e))) if at.elapsed() < PROBE_RETRY => return Err(e.clone()),
            _ => {}
        }
        let p = w.probe(&self.cuda_dirs, self.timeout);
        *slot = Some((std::time::Instant::now(), p.clone()));
        p
    }

    pub fn remote(&self) -> Option<&dyn Remote> {
        self.remote.as_deref()
    }

    pub fn cuda_dirs(&self) -> &[PathBuf] {
        &self.cuda_dirs
    }

    /// NVRTC, loaded on first use.
    pub fn nvrtc(&self) -> Result<&Nvrtc, BuildError> {
        self.nvrtc
            .get_or_init(|| Nvrtc::load(&self.cuda_dirs))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// What identifies the compiler of `pkg`: `nvrtc 12.9 headers <digest>`,
    /// or `command <program> <sha256 of it>`.
    fn toolkit(&self, pkg: &Package) -> Result<String, BuildError> {
        match &pkg.spec.build {
            BuildSpec::Nvrtc { .. } => {
                let n = self.nvrtc_probe()?;
                Ok(format!(
                    "nvrtc {} headers {}",
                    n.version,
                    &n.headers_digest[..16]
                ))
            }
            BuildSpec::Command { argv, .. } => {
                let tools = toolchain::tool_dirs(&self.cuda_dirs);
                let prog = command::program(&argv[0], &pkg.dir, &tools)?;
                let mut known = self
                    .programs
                    .lock()
                    .map_err(|e| BuildError::Tool(e.to_string()))?;
                if let Some(d) = known.get(&prog.path) {
                    return Ok(d.clone());
                }
                let (sha, _) = crate::file::sha256_of(&prog.file)
                    .map_err(|e| BuildError::Tool(format!("{}: {e}", prog.path.display())))?;
                let id = format!("command {} {sha}", prog.path.display());
                known.insert(prog.path, id.clone());
                Ok(id)
            }
        }
    }

    /// The store key of variant `i` of `pkg` for `arch`.
    pub fn key(&self, pkg: &Package, i: usize, arch: Target) -> Result<String, BuildError> {
        let record = json!({
            "schema": store::SCHEMA,
            "inputs": inputs_digest(pkg, i),
            "backend": pkg.spec.build.backend(),
            "toolkit": self.toolkit(pkg)?,
            "arch": arch.to_string(),
        });
        Ok(sha256_hex(record.to_string().as_bytes()))
    }

    fn meta(pkg: &Package, i: usize, arch: Target) -> Meta {
        let v = &pkg.spec.variants[i];
        Meta {
            package: pkg.spec.name.clone(),
            version: pkg.spec.version.clone(),
            variant: v.name.clone(),
            dtype: v.dtype.clone(),
            arch,
            backend: pkg.spec.build.backend().to_owned(),
            exports: pkg.exports(i).to_vec(),
        }
    }

    /// Serve `arch`: the first variant, in preference order, that is
    /// stored, or that `fetch` brings into the store on the way.
    pub fn resolve(&self, pkg: &Package, arch: Target, fetch: Fetch) -> ArchResult {
        let mut res = ArchResult {
            package: pkg.spec.name.clone(),
            arch,
            served: None,
            unavailable: Vec::new(),
            error: None,
        };
        if arch.kind != CodeKind::Sass {
            res.error = Some(format!("{arch} is not a machine-code target (use sm_XX)"));
            return res;
        }
        let mut pending = None;
        let mut not_pulled = Vec::new();
        for i in 0..pkg.spec.variants.len() {
            let name = pkg.spec.variants[i].name.clone();
            if let Err(why) = pkg.admits(i, arch) {
                res.unavailable.push(Unavailable {
                    variant: name,
                    reason: why.to_string(),
                });
                continue;
            }
            let key = match self.key(pkg, i, arch) {
                Ok(k) => k,
                Err(e) => {
                    res.error = Some(e.to_string());
                    return res;
                }
            };
            if let Some(reason) = self.store.failure(&key) {
                res.unavailable.push(Unavailable {
                    variant: name,
                    reason,
                });
                continue;
            }
            let outcome = match fetch {
                Fetch::Build => self.build_keyed(pkg, i, arch, &key),
                Fetch::Pull => match self.pull_keyed(pkg, i, arch, &key) {
                    Err(NotPulled(why)) => {
                        // Not in the registry: a later variant may be.
                        not_pulled.push(format!("{name}: {why}"));
                        continue;
                    }
                    Ok(o) => o,
                },
                Fetch::Stored => match self.store.lookup(&key) {
                    Ok(Some(e)) => Ok(Outcome::Cached(e)),
                    Ok(None) => {
                        // Not built yet: a later variant may be stored.
                        pending.get_or_insert(name);
                        continue;
                    }
                    Err(e) => Err(BuildError::Tool(e.to_string())),
                },
            };
            match outcome {
                Ok(o) => {
                    let built = matches!(o, Outcome::Built(_));
                    res.served = Some((o.entry().clone(), built));
                    res.error = None;
                    return res;
                }
                Err(BuildError::Rejected(reason)) => {
                    res.unavailable.push(Unavailable {
                        variant: name,
                        reason,
                    });
                }
                Err(BuildError::Tool(e)) => {
                    res.error = Some(e);
                    return res;
                }
            }
        }
        if let Some(v) = pending {
            res.error = Some(format!("no build of variant {v} for {arch} yet"));
        }
        if !not_pulled.is_empty() {
            res.error = Some(format!("not pulled ({})", not_pulled.join("; ")));
        }
        res
    }

    /// Build (or find in the store) variant `i` of `pkg` for `arch`, with
    /// no fallback to another variant: what `resolve` does for each variant
    /// it tries, for a caller that wants every variant (the GPU check).
    pub fn build_variant(
        &self,
        pkg: &Package,
        i: usize,
        arch: Target,
    ) -> Result<Outcome, BuildError> {
        pkg.admits(i, arch)
            .map_err(|e| BuildError::Rejected(e.to_string()))?;
        let key = self.key(pkg, i, arch)?;
        self.build_keyed(pkg, i, arch, &key)
    }

    fn build_keyed(
        &self,
        pkg: &Package,
        i: usize,
        arch: Target,
        key: &str,
    ) -> Result<Outcome, BuildError> {
        let meta = Self::meta(pkg, i, arch);
        let outcome = self.store.build(key, &meta, |out| {
            match self.pull(key, &meta, out) {
                Ok(Some(info)) => return Ok(info),
                Ok(None) => {}
                Err(why) => tracing::warn!(key, "{why}; building here"),
            }
            self.run_backend(pkg, i, arch, out)
        })?;
        if let (Outcome::Built(e), Some(r)) = (&outcome, &self.remote)
            && r.pushes()
            && e.manifest.origin.is_none()
        {
            self.push(r.as_ref(), e);
        }
        Ok(outcome)
    }

    /// Variant `i` of `pkg` for `arch` from the store, else from the
    /// registry, never built here. The outer error is why it is not pulled.
    fn pull_keyed(
        &self,
        pkg: &Package,
        i: usize,
        arch: Target,
        key: &str,
    ) -> Result<Result<Outcome, BuildError>, NotPulled> {
        let meta = Self::meta(pkg, i, arch);
        let mut why = None;
        let r = self
            .store
            .build(key, &meta, |out| match self.pull(key, &meta, out) {
                Ok(Some(info)) => Ok(info),
                Ok(None) => {
                    why = Some(if self.remote.is_some() {
                        "not in the registry".to_owned()
                    } else {
                        "no registry (kernels.remote)".to_owned()
                    });
                    Err(BuildError::Tool(String::new()))
                }
                Err(e) => {
                    why = Some(e.to_string());
                    Err(BuildError::Tool(String::new()))
                }
            });
        match why {
            Some(w) => Err(NotPulled(w)),
            None => Ok(r),
        }
    }

    /// Push a build made here; a failure is logged, never the build's.
    pub fn push(&self, r: &dyn Remote, e: &Entry) -> Option<String> {
        match r.push(e) {
            Ok(at) => {
                tracing::info!(key = %e.manifest.key, "pushed {} {} to {at}", e.manifest.package, e.manifest.arch);
                Some(at)
            }
            Err(err) => {
                tracing::warn!(key = %e.manifest.key, "push failed: {err}");
                None
            }
        }
    }

    /// The registry's artifact for `key`, pulled into `out` and checked:
    /// `Ok(None)` when there is no registry or no such artifact, `Err`
    /// (why) when it could not be had or was refused (recorded, and not
    /// asked for again).
    fn pull(&self, key: &str, meta: &Meta, out: &Path) -> Result<Option<BuildInfo>, PullError> {
        let Some(r) = self.remote.as_ref() else {
            return Ok(None);
        };
        if let Some(why) = self.store.remote_refusal(key) {
            return Err(PullError::RefusedBefore(why));
        }
        match r.pull_into(key, meta, out, self.store.max_bytes()) {
            Ok(Some(p)) => {
                tracing::info!(
                    key,
                    "pulled {} {} from {}",
                    meta.package,
                    meta.arch,
                    p.origin
                );
                Ok(Some(p.build_info()))
            }
            Ok(None) => Ok(None),
            Err(e @ RemoteError::Refused { .. }) => {
                if let Err(io) = self.store.record_remote_refusal(key, &e.to_string()) {
                    tracing::warn!(key, "cannot record the refusal: {io}");
                }
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn run_backend(
        &self,
        pkg: &Package,
        i: usize,
        arch: Target,
        out: &Path,
    ) -> Result<BuildInfo, BuildError> {
        let v = &pkg.spec.variants[i];
        match &pkg.spec.build {
            BuildSpec::Nvrtc { options, ptx } => {
                let mut opts: Vec<String> = v
                    .defines
                    .iter()
                    .map(|(k, val)| format!("-D{k}={val}"))
                    .collect();
                opts.extend(options.iter().map(|o| o.trim().to_owned()));
                let (main, headers) = pkg
                    .sources
                    .split_first()
                    .ok_or_else(|| BuildError::Rejected("no sources".into()))?;
                let cubin = out.join(format!("{}.cubin", pkg.spec.name));
                let ptx_file = out.join(format!("{}.ptx", pkg.spec.name));
                let mut outputs = vec![(arch, cubin.as_path())];
                if *ptx {
                    outputs.push((Target::ptx(arch.cap), ptx_file.as_path()));
                }
                let version = match &self.worker {
                    Some(w) => {
                        let probe = self.nvrtc_probe()?;
                        w.compile(
                            &probe,
                            &self.cuda_dirs,
                            (&main.0, &main.1),
                            headers,
                            &opts,
                            &outputs,
                            self.timeout,
                        )?;
                        probe.version
                    }
                    None => {
                        let nvrtc = self.nvrtc()?;
                        for (t, file) in &outputs {
                            let c = nvrtc.compile((&main.0, &main.1), headers, *t, &opts)?;
                            std::fs::write(file, c.code)?;
                        }
                        nvrtc.version.clone()
                    }
                };
                Ok(BuildInfo {
                    toolkit: format!("nvrtc {version}"),
                    min_driver_cuda: Some(version),
                    origin: None,
                })
            }
            BuildSpec::Command {
                argv,
                env,
                timeout_s,
            } => {
                let work = out.parent().unwrap_or(out).join("work");
                let src = work.join("src");
                std::fs::create_dir_all(&src)?;
                // Executable, so that `argv: [./build.sh]` runs a script
                // among them (root's copy, in root's own directory).
                for (name, data) in &pkg.sources {
                    use std::io::Write;
                    use std::os::unix::fs::OpenOptionsExt;
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o755)
                        .open(src.join(name))?
                        .write_all(data)?;
                }
                let vars = Vars {
                    arch,
                    out: out.to_owned(),
                    src,
                    variant: v.name.clone(),
                };
                let timeout = timeout_s
                    .map_or(self.timeout, Duration::from_secs)
                    .min(self.timeout);
                let tools = toolchain::tool_dirs(&self.cuda_dirs);
                command::run(argv, env, &vars, &work, &tools, timeout)?;
                Ok(BuildInfo {
                    toolkit: self.toolkit(pkg)?,
                    min_driver_cuda: None,
                    origin: None,
                })
            }
        }
    }
}

/// One unit of pre-warming work.
#[derive(Clone, Debug)]
pub struct Task {
    pub package: String,
    pub arch: Target,
}

/// Build every task with `workers` threads; `done` is called after each
/// (from the worker that finished it). Results come back in task order.
pub fn run_tasks(
    builder: &Builder,
    packages: &BTreeMap<String, Package>,
    tasks: &[Task],
    workers: usize,
    done: &(dyn Fn(&ArchResult) + Sync),
) -> Vec<ArchResult> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Mutex<Vec<Option<ArchResult>>> = Mutex::new(vec![None; tasks.len()]);
    std::thread::scope(|s| {
        for _ in 0..workers.max(1).min(tasks.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(t) = tasks.get(i) else { break };
                    let r = match packages.get(&t.package) {
                        Some(p) => builder.resolve(p, t.arch, Fetch::Build),
                        None => {
                            ArchResult::failed(t, &format!("no kernel package named {}", t.package))
                        }
                    };
                    done(&r);
                    if let Ok(mut v) = results.lock() {
                        v[i] = Some(r);
                    }
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .flatten()
        .collect()
}
/// Why a build was not pulled from the registry.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The registry's artifact for this key was refused before (recorded
    /// in the store), so it is not asked for again.
    #[error("refused before: {0}")]
    RefusedBefore(String),
    #[error(transparent)]
    Remote(#[from] RemoteError),
}
