//! A node of the NRI tests and benches: real containerd (its CRI and NRI)
//! from an engine root, gpuarchd on the 2080 Ti + 3090 fake NVML, and pods
//! made as kubelet makes them.

#![allow(dead_code)] // each test binary and bench uses its part

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuarch_tests::daemon::{Node, Policy};
use gpuarch_tests::stack::{self, Containerd, IMAGE};

use crate::cri;

/// gpuarchd's line once registered.
pub(crate) const REGISTERED: &str = "NRI: registered with containerd";

pub(crate) struct Stack {
    pub(crate) node: Node,
    pub(crate) containerd: Containerd,
    pub(crate) pods: PathBuf,
    pub(crate) dev: PathBuf,
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) serial: usize,
}

impl Stack {
    pub(crate) fn new(suite: &str) -> Option<Self> {
        let root = match stack::root(suite) {
            Ok(r) => r,
            Err(why) => {
                gpuarch_tests::skip(&why);
                return None;
            }
        };
        let node = Node::new("2080ti-3090", Policy::Shipped);
        let dir = node.path("containerd");
        let dev = gpuarch_tests::containers::nvidia_nodes(&node.path("dev"), &[0, 1]);
        // The shim's config (the gpuarch handler): gpuarchd's snapshot and
        // record directory, its own log.
        let shim = gpuarch_tests::private_hook_paths(
            &format!(
                "daemon:\n  snapshot: {}\nlog:\n  to: file\n  file: {}\n{}",
                node.path("run/inventory.json").display(),
                node.path("shim.log").display(),
                gpuarch_tests::daemon::kernels_yaml(&node.path(""), &[], None)
            ),
            &node.path(""),
        );
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("gpuarch.yaml"), shim).unwrap();
        // NVIDIA's CDI spec for GPU 1, as nvidia-ctk writes it, on the
        // stand-in node.
        let specs = dir.join("cdi-specs");
        std::fs::create_dir_all(&specs).unwrap();
        std::fs::write(
            specs.join("nvidia.json"),
            serde_json::json!({
                "cdiVersion": "0.5.0",
                "kind": "nvidia.com/gpu",
                "devices": [{"name": "1", "containerEdits": {"deviceNodes": [
                    {"path": "/dev/nvidia1", "hostPath": dev.join("nvidia1")}
                ]}}],
                "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
            })
            .to_string(),
        )
        .unwrap();
        // A kernel package built for both GPUs, where gpuarchd's store
        // keeps it (`kernels.mount_root`).
        let demo = node.path("kernels/demo");
        std::fs::create_dir_all(&demo).unwrap();
        std::fs::write(
            demo.join("manifest.json"),
            r#"{"package": "demo", "targets": ["sm_75", "sm_86"]}"#,
        )
        .unwrap();
        let mut s = Self {
            // Both kinds of snapshot gpuarchd reads an image from: 2.1's
            // pods on overlayfs (the layers), 1.7's on native (a copy).
            containerd: Containerd::start_with(
                &root,
                &dir,
                &[&node.path("")],
                if suite == "sid" {
                    "overlayfs"
                } else {
                    "native"
                },
            ),
            pods: node.path("pods"),
            node,
            dev,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            serial: 0,
        };
        s.start_gpuarchd(true);
        eprintln!(
            "{suite}: containerd {}, runc {}",
            stack::version(&root, "containerd"),
            stack::version(&root, "runc")
        );
        Some(s)
    }

    pub(crate) fn start_gpuarchd(&mut self, nri: bool) {
        self.write_config(nri, "");
        self.node.start(&[]);
    }

    /// gpuarchd's config: NRI on where `nri`, images audited at start,
    /// `audit` added to the audit's settings.
    pub(crate) fn write_config(&self, nri: bool, audit: &str) {
        let yaml = format!(
            "nri:\n  enable: {nri}\n  socket: {}\n  containerd: {}\njit_cache:\n  enable: true\n  dir: {}\naudit:\n  dir: {}\n{audit}",
            self.containerd.nri_sock.display(),
            self.containerd.sock.display(),
            self.node.path("jit").display(),
            self.node.path("audits").display()
        );
        let yaml = gpuarch_tests::private_hook_paths(
            &self.node.private_config(&yaml),
            &self.node.path(""),
        );
        std::fs::write(self.node.path("config.yaml"), yaml).unwrap();
    }

    /// Wait until gpuarchd's log has `what` `times` times.
    pub(crate) fn wait_log(&self, what: &str, times: usize) {
        let t = Instant::now();
        while self.node.log().matches(what).count() < times {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "gpuarchd did not log {what:?} {times} times in 20 s:\n{}\ncontainerd:\n{}",
                self.node.log(),
                self.containerd.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A pod's container env, or CreateContainer's refusal.
    pub(crate) fn pod(
        &mut self,
        handler: &str,
        envs: &[(&str, &str)],
        devices: &[(&Path, &str)],
    ) -> (String, Result<String, String>) {
        let (name, r) = self.pod_run(handler, envs, devices, "env > /out/env");
        let r = r.map(|()| std::fs::read_to_string(self.pods.join(&name).join("env")).unwrap());
        (name, r)
    }

    /// A pod whose container runs `script` (`/out` is [`Stack::out`]).
    pub(crate) fn pod_run(
        &mut self,
        handler: &str,
        envs: &[(&str, &str)],
        devices: &[(&Path, &str)],
        script: &str,
    ) -> (String, Result<(), String>) {
        self.pod_with(handler, envs, &[], devices, script)
    }

    pub(crate) fn pod_with(
        &mut self,
        handler: &str,
        envs: &[(&str, &str)],
        annotations: &[(&str, &str)],
        devices: &[(&Path, &str)],
        script: &str,
    ) -> (String, Result<(), String>) {
        self.pod_of(IMAGE, handler, envs, annotations, devices, script)
    }

    pub(crate) fn pod_of(
        &mut self,
        image: &str,
        handler: &str,
        envs: &[(&str, &str)],
        annotations: &[(&str, &str)],
        devices: &[(&Path, &str)],
        script: &str,
    ) -> (String, Result<(), String>) {
        self.serial += 1;
        let name = format!("p{}-{}", self.serial, std::process::id());
        let p = cri::Pod {
            sock: &self.containerd.sock,
            pods: &self.pods,
            image,
            name: &name,
            handler,
            envs,
            annotations,
            devices,
        };
        let r = self.rt.block_on(p.run(script));
        (name, r)
    }

    /// A pod on GPU 1 whose container prints its env; its name and how
    /// long its CreateContainer took.
    pub(crate) fn pod_timed(&mut self) -> (String, Duration) {
        self.serial += 1;
        let name = format!("t{}-{}", self.serial, std::process::id());
        let p = cri::Pod {
            sock: &self.containerd.sock,
            pods: &self.pods,
            image: IMAGE,
            name: &name,
            handler: "",
            envs: &[("NVIDIA_VISIBLE_DEVICES", "1")],
            annotations: &[],
            devices: &[],
        };
        let took = self.rt.block_on(p.run_timed("env > /out/env")).unwrap();
        (name, took)
    }

    pub(crate) fn out(&self, name: &str, file: &str) -> String {
        std::fs::read_to_string(self.pods.join(name).join(file))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// gpuarchd's lines about pod `name`.
    pub(crate) fn lines_of(&self, name: &str) -> String {
        let tag = format!("pod=default/{name}:");
        let log = self.node.log();
        log.lines()
            .filter(|l| l.contains(&tag))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A pod of `image` whose image was read, not given up on at a time
    /// bound: on a loaded machine (CI runs the suites beside each other) a
    /// read or containerd's answer may pass its bound, and the image then
    /// counts as not read, by design. Tried at most three times.
    pub(crate) fn read_pod(&mut self, image: &str, envs: &[(&str, &str)], script: &str) -> String {
        for _ in 0..3 {
            let (name, r) = self.pod_of(image, "", envs, &[], &[], script);
            r.unwrap();
            let lines = self.lines_of(&name);
            let bound = lines.lines().find(|l| {
                l.contains("were not read: over")
                    || (l.contains("were not read: containerd at")
                        && ["deadline", "imeout", "timed out"]
                            .iter()
                            .any(|w| l.contains(w)))
            });
            match bound {
                None => return name,
                Some(l) => eprintln!("the image read stopped at a time bound; again: {l}"),
            }
        }
        panic!("three reads of {image} in a row stopped at a time bound")
    }

    pub(crate) fn why(&self, pod: &str) -> String {
        let o = self.node.ctl(
            None,
            &[
                "why",
                "--json",
                "--dir",
                self.node.path("containers").to_str().unwrap(),
                pod,
            ],
        );
        assert!(o.status.success(), "gpuarchctl why {pod}: {o:?}");
        String::from_utf8(o.stdout).unwrap()
    }
}
