//! Every variant of every package, built for this GPU's arch through the
//! real store and builder, loaded with `cuModuleLoadData` and run against
//! its CPU reference.
//!
//! The sample packages (saxpy, rmsnorm, rotary) are run on seeded random
//! inputs; a package this check does not know is only loaded, and each of
//! its exports looked up.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use gpuarch_core::arch::Target;
use gpuarch_kernels::build::Builder;
use gpuarch_kernels::spec::{self, Package};
use gpuarch_kernels::store::{Entry, Store};
use serde_json::json;

use crate::Check;
use crate::driver::{Gpu, error_name};
use crate::numerics::{self, ABS_TOL, Agreement, Half, Rng};

/// Where to find and keep things.
#[derive(Debug)]
pub struct Setup {
    pub packages: Vec<PathBuf>,
    pub store: PathBuf,
    pub cuda_dirs: Vec<PathBuf>,
    pub seed: u64,
}

/// Build, load and run everything for `gpu`'s arch (`sm_XY`).
pub fn run(gpu: &Gpu, setup: &Setup) -> Result<Vec<Check>> {
    let (packages, errors) = spec::discover(&setup.packages);
    let mut checks: Vec<Check> = errors
        .iter()
        .map(|e| Check::new("kernels", "package", false, e.to_string()))
        .collect();
    if packages.is_empty() {
        checks.push(Check::new(
            "kernels",
            "packages",
            false,
            format!("no kernel packages under {:?}", setup.packages),
        ));
        return Ok(checks);
    }
    let store = Store::open(&setup.store, 1 << 30)
        .map_err(|e| anyhow!("kernel store {}: {e}", setup.store.display()))?;
    let builder = Builder::new(store, setup.cuda_dirs.clone(), Duration::from_secs(600));
    let arch = Target::sass(gpu.cap);
    for pkg in packages.values() {
        for i in 0..pkg.spec.variants.len() {
            checks.push(variant(gpu, &builder, pkg, i, arch, setup.seed));
        }
    }
    Ok(checks)
}

fn variant(
    gpu: &Gpu,
    builder: &Builder,
    pkg: &Package,
    i: usize,
    arch: Target,
    seed: u64,
) -> Check {
    let v = &pkg.spec.variants[i];
    let name = format!("{}/{} {arch}", pkg.spec.name, v.name);
    if let Err(why) = pkg.admits(i, arch) {
        // Not for this GPU by its own declaration: nothing to load.
        return Check::new("kernels", name, true, format!("not built: {why}"));
    }
    let t0 = Instant::now();
    let entry = match builder.build_variant(pkg, i, arch) {
        Ok(o) => o.entry().clone(),
        Err(e) => return Check::new("kernels", name, false, format!("build failed: {e}")),
    };
    let built_ms = t0.elapsed().as_secs_f64() * 1e3;
    let toolkit = entry.manifest.toolkit.clone();
    let r = load_and_run(gpu, pkg, &entry, v.dtype.as_deref(), seed);
    let data = |extra: serde_json::Value| {
        json!({"key": entry.manifest.key, "toolkit": toolkit, "build_ms": built_ms,
               "files": entry.manifest.files.keys().collect::<Vec<_>>(), "result": extra})
    };
    match r {
        Ok(Ran::Compared(a, what)) => {
            let ok = a.outside == 0 && a.n > 0;
            Check::new(
                "kernels",
                name,
                ok,
                format!(
                    "{what}: {} elements, max abs error {:.3e}, max rel {:.3e}, {} outside tolerance ({toolkit})",
                    a.n, a.max_abs, a.max_rel, a.outside
                ),
            )
            .with(data(json!({"n": a.n, "max_abs": a.max_abs, "max_rel": a.max_rel,
                              "outside": a.outside, "what": what})))
        }
        Ok(Ran::Loaded(exports)) => Check::new(
            "kernels",
            name,
            true,
            format!(
                "loaded; exports {} found (no reference for this package)",
                exports.join(", ")
            ),
        )
        .with(data(json!({"exports": exports}))),
        Err(e) => Check::new("kernels", name, false, format!("{e:#}")).with(data(json!(null))),
    }
}

enum Ran {
    Compared(Agreement, String),
    Loaded(Vec<String>),
}

/// The entry's cubin (the file whose name ends `.cubin`).
fn cubin(entry: &Entry) -> Result<PathBuf> {
    entry
        .manifest
        .files
        .keys()
        .find(|f| f.ends_with(".cubin"))
        .map(|f| entry.dir.join(f))
        .ok_or_else(|| anyhow!("entry {} has no cubin", entry.manifest.key))
}

fn load_and_run(
    gpu: &Gpu,
    pkg: &Package,
    entry: &Entry,
    dtype: Option<&str>,
    seed: u64,
) -> Result<Ran> {
    let path = cubin(entry)?;
    let image = std::fs::read(&path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let module = gpu
        .load(&image)
        .map_err(|e| anyhow!("cuModuleLoadData {}: {}", path.display(), error_name(&e)))?;
    let exports = &entry.manifest.exports;
    let f = |n: &str| Gpu::function(&module, n);
    let first = exports
        .first()
        .ok_or_else(|| anyhow!("the entry exports nothing"))?;
    let mut rng = Rng::new(seed);
    let s = &gpu.stream;
    let dev = |e: cudarc::driver::DriverError| anyhow!("{}", error_name(&e));
    match pkg.spec.name.as_str() {
        "saxpy" => {
            let n: u32 = 1 << 20;
            let a = 1.75f32;
            let x = rng.vec(n as usize, -4.0, 4.0);
            let y = rng.vec(n as usize, -4.0, 4.0);
            let (dx, dy) = (
                s.clone_htod(&x).map_err(dev)?,
                s.clone_htod(&y).map_err(dev)?,
            );
            let mut out = s.alloc_zeros::<f32>(n as usize).map_err(dev)?;
            let func = f(first)?;
            let mut b = s.launch_builder(&func);
            b.arg(&a).arg(&dx).arg(&dy).arg(&mut out).arg(&n);
            // SAFETY: the arguments match saxpy's signature and every buffer
            // holds n elements.
            unsafe { b.launch(LaunchConfig::for_num_elems(n)) }.map_err(dev)?;
            let got = s.clone_dtoh(&out).map_err(dev)?;
            let (want, bound) = numerics::saxpy(a, &x, &y);
            Ok(Ran::Compared(
                numerics::agree(&got, &want, |i| bound[i]),
                format!("{first} f32 against an f64 reference"),
            ))
        }
        "rmsnorm" | "rotary" => {
            let h = dtype
                .and_then(Half::from_dtype)
                .ok_or_else(|| anyhow!("variant dtype {dtype:?} is not bfloat16 or float16"))?;
            let up = |v: &[f32]| -> (Vec<u16>, Vec<f32>) {
                (
                    v.iter().map(|&x| h.to_bits(x)).collect(),
                    v.iter().map(|&x| h.round(x)).collect(),
                )
            };
            let func = f(first)?;
            let (got, want) = if pkg.spec.name == "rmsnorm" {
                let (rows, cols) = (256usize, 4096usize);
                let eps = 1e-6f32;
                let (xb, x) = up(&rng.vec(rows * cols, -2.0, 2.0));
                let (wb, w) = up(&rng.vec(cols, 0.5, 1.5));
                let (dx, dw) = (
                    s.clone_htod(&xb).map_err(dev)?,
                    s.clone_htod(&wb).map_err(dev)?,
                );
                let mut dy = s.alloc_zeros::<u16>(rows * cols).map_err(dev)?;
                let c = cols as i32;
                let mut b = s.launch_builder(&func);
                b.arg(&dx).arg(&dw).arg(&mut dy).arg(&c).arg(&eps);
                let cfg = LaunchConfig {
                    grid_dim: (rows as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: one block per row of `cols` elements, as the
                // kernel expects; buffers are rows * cols.
                unsafe { b.launch(cfg) }.map_err(dev)?;
                let y = s.clone_dtoh(&dy).map_err(dev)?;
                (y, numerics::rmsnorm(&x, &w, cols, eps))
            } else {
                let (tokens, heads, dim) = (128usize, 16usize, 128usize);
                let (xb, x) = up(&rng.vec(tokens * heads * dim, -2.0, 2.0));
                let angles: Vec<f32> = (0..tokens * dim / 2)
                    .map(|i| {
                        let (t, p) = (i / (dim / 2), i % (dim / 2));
                        t as f32 * 10000f32.powf(-2.0 * p as f32 / dim as f32)
                    })
                    .collect();
                let cos_t: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
                let sin_t: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
                let mut dx = s.clone_htod(&xb).map_err(dev)?;
                let (dc, ds) = (
                    s.clone_htod(&cos_t).map_err(dev)?,
                    s.clone_htod(&sin_t).map_err(dev)?,
                );
                let (t, hd, d) = (tokens as i32, heads as i32, dim as i32);
                let mut b = s.launch_builder(&func);
                b.arg(&mut dx).arg(&dc).arg(&ds).arg(&t).arg(&hd).arg(&d);
                // SAFETY: x holds tokens * heads * dim elements (dim/2
                // pairs per head), the tables tokens * dim/2 floats each.
                unsafe {
                    b.launch(LaunchConfig::for_num_elems(
                        (tokens * heads * dim / 2) as u32,
                    ))
                }
                .map_err(dev)?;
                let y = s.clone_dtoh(&dx).map_err(dev)?;
                (y, numerics::rotary(&x, &cos_t, &sin_t, tokens, heads, dim))
            };
            let got: Vec<f32> = got.iter().map(|&b| h.from_bits(b)).collect();
            let tol = h.rel_tol();
            Ok(Ran::Compared(
                numerics::agree(&got, &want, |i| tol * want[i].abs() + ABS_TOL),
                format!(
                    "{first} {dtype} against an f64 reference, tolerance {tol:.2e} relative",
                    dtype = dtype.unwrap_or_default()
                ),
            ))
        }
        _ => {
            for e in exports {
                f(e)?;
            }
            Ok(Ran::Loaded(exports.clone()))
        }
    }
}
