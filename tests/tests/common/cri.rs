//! The calls kubelet makes for a pod, over the CRI v1 gRPC API, shared by
//! the test binaries that drive containerd's CRI.

#![allow(dead_code)] // each test binary uses its part

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::*;
use tonic::transport::{Channel, Endpoint, Uri};

pub async fn client(sock: &Path) -> RuntimeServiceClient<Channel> {
    let sock = sock.to_owned();
    let ch = Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let sock = sock.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(sock).await?))
            }
        }))
        .await
        .unwrap();
    RuntimeServiceClient::new(ch)
}

/// One pod of one container, as kubelet would create it.
#[derive(Debug, Clone)]
pub struct Pod<'a> {
    /// containerd's CRI socket.
    pub sock: &'a Path,
    /// Host directory under which `<name>/` is the container's `/out`.
    pub pods: &'a Path,
    pub image: &'a str,
    pub name: &'a str,
    /// The runtime handler (`runtimeClassName`); empty for the default.
    pub handler: &'a str,
    pub envs: &'a [(&'a str, &'a str)],
    /// The container's annotations (CDI requests among them).
    pub annotations: &'a [(&'a str, &'a str)],
    /// Host device node, path in the container.
    pub devices: &'a [(&'a Path, &'a str)],
}

impl Pod<'_> {
    pub fn out(&self) -> PathBuf {
        self.pods.join(self.name)
    }

    /// Run the container's `env` into `/out/env`; what it printed.
    pub async fn env(&self) -> Result<String, String> {
        self.run("env > /out/env").await?;
        Ok(std::fs::read_to_string(self.out().join("env")).unwrap())
    }

    /// A pod (host network) whose container runs `script` with the host
    /// directory [`Pod::out`] at `/out`, to its end; the pod is removed
    /// after. `Err`: what CreateContainer answered when it refused.
    pub async fn run(&self, script: &str) -> Result<(), String> {
        self.run_timed(script).await.map(|_| ())
    }

    /// [`Pod::run`], and how long CreateContainer took (kubelet's call,
    /// NRI's plugins within it).
    pub async fn run_timed(&self, script: &str) -> Result<Duration, String> {
        let mut c = client(self.sock).await;
        let out = self.out();
        std::fs::create_dir_all(&out).unwrap();
        let sandbox = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: self.name.into(),
                uid: format!("uid-{}", self.name),
                namespace: "default".into(),
                attempt: 0,
            }),
            log_directory: out.display().to_string(),
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Node as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let handler = self.handler;
        let pod = c
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(sandbox.clone()),
                runtime_handler: handler.into(),
            })
            .await
            .unwrap_or_else(|s| panic!("RunPodSandbox({handler:?}): {s}"))
            .into_inner()
            .pod_sandbox_id;
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: "probe".into(),
                attempt: 0,
            }),
            // As kubelet 1.30 and later name it: the image as the pod
            // spec says (CRI-O requires it to verify signatures).
            image: Some(ImageSpec {
                image: self.image.into(),
                user_specified_image: self.image.into(),
                ..Default::default()
            }),
            command: vec!["sh".into(), "-c".into(), script.into()],
            envs: self
                .envs
                .iter()
                .map(|(k, v)| KeyValue {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            mounts: vec![Mount {
                container_path: "/out".into(),
                host_path: out.display().to_string(),
                ..Default::default()
            }],
            devices: self
                .devices
                .iter()
                .map(|(host, ctr)| Device {
                    container_path: (*ctr).into(),
                    host_path: host.display().to_string(),
                    permissions: "rw".into(),
                })
                .collect(),
            annotations: self
                .annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            log_path: "probe.log".into(),
            ..Default::default()
        };
        let t = Instant::now();
        let created = c
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(config),
                sandbox_config: Some(sandbox),
            })
            .await;
        let took = t.elapsed();
        let result = match created {
            Err(s) => Err(s.message().to_owned()),
            Ok(r) => {
                let id = r.into_inner().container_id;
                c.start_container(StartContainerRequest {
                    container_id: id.clone(),
                })
                .await
                .unwrap_or_else(|s| panic!("StartContainer: {s}"));
                let t = Instant::now();
                loop {
                    let st = c
                        .container_status(ContainerStatusRequest {
                            container_id: id.clone(),
                            verbose: false,
                        })
                        .await
                        .unwrap()
                        .into_inner()
                        .status
                        .unwrap();
                    if st.state == ContainerState::ContainerExited as i32 {
                        assert_eq!(st.exit_code, 0, "{st:?}");
                        break;
                    }
                    assert!(t.elapsed() < Duration::from_secs(60), "{st:?}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(took)
            }
        };
        c.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap();
        c.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod,
        })
        .await
        .unwrap();
        result
    }
}

/// The value of `key` in `env` output.
pub fn var(env: &str, key: &str) -> Option<String> {
    env.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_owned)
}
