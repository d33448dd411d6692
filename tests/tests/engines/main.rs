//! gpuarch under the engines most GPU nodes run: Docker (gpuarch as
//! `--runtime`, as `default-runtime`, opted out with `--runtime runc`, and
//! with a stand-in for NVIDIA's runtime on either side of it; `--gpus`,
//! compose and, from Docker 28, CDI), containerd through `ctr`, and
//! Kubernetes' path: the CRI calls kubelet makes, with `runtime_handler:
//! gpuarch` from the drop-in `gpuarchctl engine containerd` wrote. The
//! engines start once for this binary (gpuarch_tests::engines): the host's
//! Debian 12 releases (containerd 1.6, Docker 20.10, runc 1.1), or with
//! `GPUARCH_ENGINES=sid` today's (containerd 2.1, Docker 28, runc 1.3);
//! `scripts/test` runs this binary both ways. The tests take turns, since
//! some change the gpuarch config.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use gpuarch_tests::engines::{DEEPSPEED_IMAGE, Engines, IMAGE, LAYOUTS_IMAGE, engines, missing};

mod containerd;
mod docker;
mod image;
mod jit;

const GPU1_UUID: &str = "GPU-0ce1cf70-9353-208e-0e37-0746dc707745";

fn get() -> Option<&'static Engines> {
    let e = engines();
    if e.is_none() {
        gpuarch_tests::skip(&missing().unwrap_or_default());
    }
    e
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn env_of(o: &Output) -> BTreeMap<String, String> {
    text(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `docker run --rm ARGS IMAGE env`, which must succeed with nothing on
/// stderr; the container's env.
fn docker_env(e: &Engines, args: &[&str]) -> BTreeMap<String, String> {
    let o = e.docker(&[&["run", "--rm", "--network", "none"], args, &[IMAGE, "env"]].concat());
    assert!(o.status.success(), "docker run {args:?}: {o:?}");
    assert_eq!(text(&o.stderr), "", "docker run {args:?}: stderr");
    env_of(&o)
}

/// `TORCH_CUDA_ARCH_LIST` and `GPUARCH_DTYPE`.
type Hints<'a> = (Option<&'a str>, Option<&'a str>);

fn hints(env: &BTreeMap<String, String>) -> Hints<'_> {
    (
        env.get("TORCH_CUDA_ARCH_LIST").map(String::as_str),
        env.get("GPUARCH_DTYPE").map(String::as_str),
    )
}

fn untouched(env: &BTreeMap<String, String>, case: &str) {
    gpuarch_tests::containers::no_gpuarch_env(env, case);
    assert!(!env.contains_key("TORCH_CUDA_ARCH_LIST"), "{case}: {env:?}");
}

#[path = "../common/cri.rs"]
mod cri;
