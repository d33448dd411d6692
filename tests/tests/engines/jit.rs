//! JIT caches under CRI and Docker.

use super::*;

/// What the JIT tests' containers run: the cache's variable, then a
/// "build" into it unless one is there (`/out/ext`: built or reused).
const JIT_SCRIPT: &str = "echo $TORCH_EXTENSIONS_DIR > /out/tex; e=$TORCH_EXTENSIONS_DIR/ext/ext.so; \
    if [ -z \"$TORCH_EXTENSIONS_DIR\" ]; then echo none > /out/ext; \
    elif [ -e $e ]; then echo reused > /out/ext; \
    else mkdir -p ${e%/*} && echo built > $e && echo built > /out/ext; fi";

/// Per-arch JIT caches under the real engines. containerd's CRI
/// names the image (`io.kubernetes.cri.image-name`): under the default
/// scope two pods of the image on GPU 1 share a cache, a pod on GPU 0 does
/// not. Docker names none: under the default scope it gets no cache (and
/// the log says why), under `scope: uid` two containers on GPU 1 share one.
#[test]
fn jit_caches_under_cri_and_docker() {
    let Some(e) = get() else { return };
    let _turn = e.lock();
    let jit = e.path(&format!("jit-{}", std::process::id()));
    e.set_gpuarch_config(&format!(
        "jit_cache:\n  enable: true\n  dir: {}\n",
        jit.display()
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let id = std::process::id();
    let pod = |name: &str, gpu: &str| {
        let name = format!("{name}-{id}");
        let pods = e.path("pods");
        let p = cri::Pod {
            sock: &e.containerd_sock,
            pods: &pods,
            image: IMAGE,
            name: &name,
            handler: "gpuarch",
            envs: &[("NVIDIA_VISIBLE_DEVICES", gpu)],
            annotations: &[],
            devices: &[],
        };
        rt.block_on(p.run(JIT_SCRIPT)).unwrap();
        let read = |f: &str| {
            std::fs::read_to_string(e.path(&format!("pods/{name}/{f}")))
                .unwrap()
                .trim()
                .to_owned()
        };
        (read("tex"), read("ext"))
    };
    let log = |e: &Engines| e.take_log();
    let (tex, first) = pod("jit-a", "1");
    assert_eq!(tex, "/var/cache/gpuarch/jit/torch_extensions", "{}", log(e));
    assert_eq!(first, "built");
    let said = log(e);
    assert!(
        said.contains(&format!("image {IMAGE}")) || said.contains("image docker.io/library/"),
        "the CRI runtime's image annotation: {said}"
    );
    assert_eq!(pod("jit-b", "1").1, "reused");
    assert_eq!(pod("jit-c", "0").1, "built");
    let caches: Vec<_> = std::fs::read_dir(&jit)
        .unwrap()
        .flatten()
        .flat_map(|s| std::fs::read_dir(s.path()).unwrap().flatten())
        .filter(|c| c.file_type().unwrap().is_dir())
        .map(|c| c.file_name().to_string_lossy().into_owned())
        .collect();
    let mut sorted = caches.clone();
    sorted.sort();
    assert_eq!(sorted, ["sm_75", "sm_86"], "{caches:?}");

    // Docker: no image in the config, so no cache under the default scope.
    let out = e.path("docker-jit");
    std::fs::create_dir_all(&out).unwrap();
    let docker = |e: &Engines| {
        let o = e.docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--runtime",
            "gpuarch",
            "-e",
            "NVIDIA_VISIBLE_DEVICES=1",
            "-v",
            &format!("{}:/out", out.display()),
            IMAGE,
            "sh",
            "-c",
            JIT_SCRIPT,
        ]);
        assert!(o.status.success(), "{o:?}");
        std::fs::read_to_string(out.join("ext"))
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(docker(e), "none");
    assert!(
        log(e).contains("no JIT cache: jit_cache.scope is image, and the runtime names no image")
    );
    e.set_gpuarch_config(&format!(
        "jit_cache:\n  enable: true\n  dir: {}\n  scope: uid\n",
        jit.display()
    ));
    assert_eq!(docker(e), "built");
    assert_eq!(docker(e), "reused");
    let _ = std::fs::remove_dir_all(&jit);
}
