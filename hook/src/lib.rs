//! gpuarch-hook: applies a [`gpuarch_core::plan::Plan`] to an OCI container.
//!
//! Synchronous, no tokio, no D-Bus: the hook runs on every container start.
//! Configs are edited as JSON values so that every field gpuarch does not own
//! comes out as it came in.
//!
//! Built so far: the `precreate` stage (podman hooks.d). The runtime shim, the
//! `createContainer`/`prestart` stage, kernel mounts and the rootfs-safety
//! work of the container-hook issue come next.

use gpuarch_core::config::Config;
use gpuarch_core::oci::{self, ContainerView};
use gpuarch_core::plan::{self, Plan};
use gpuarch_core::snapshot::Snapshot;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("{0}")]
    Oci(#[from] oci::OciError),
    #[error("OCI config has {0}; cannot add env")]
    Shape(&'static str),
    #[error("cannot encode the OCI config: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Set the Plan's env in `process.env`. An entry of the same name is
/// replaced: the Plan holds a variable the container sets only when the
/// config says to override it. Nothing else in the config is touched.
pub fn apply_env(config: &mut Value, plan: &Plan) -> Result<(), HookError> {
    if plan.env.is_empty() {
        return Ok(());
    }
    let process = config
        .as_object_mut()
        .ok_or(HookError::Shape("no top-level object"))?
        .get_mut("process")
        .and_then(Value::as_object_mut)
        .ok_or(HookError::Shape("no \"process\" object"))?;
    let env = process
        .entry("env")
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or(HookError::Shape("a \"process.env\" that is not a list"))?;
    for (k, v) in &plan.env {
        env.retain(|e| {
            e.as_str()
                .and_then(|s| s.split_once('='))
                .is_none_or(|(name, _)| name != k)
        });
        env.push(Value::String(format!("{k}={v}")));
    }
    Ok(())
}

/// The precreate stage: the proposed config in, the config with the Plan
/// applied out, and the Plan for the log.
pub fn precreate(input: &[u8], inv: &Snapshot, cfg: &Config) -> Result<(Vec<u8>, Plan), HookError> {
    let mut config = oci::parse_value(input)?;
    let view = ContainerView::from_value(&config)?;
    let plan = plan::plan(&view, inv, &cfg.env);
    if plan.is_noop() {
        return Ok((input.to_vec(), plan));
    }
    apply_env(&mut config, &plan)?;
    let out = serde_json::to_vec(&config)?;
    Ok((out, plan))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuarch_core::config::EnvConfig;
    use serde_json::json;

    fn host() -> Snapshot {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/2080ti-3090.json"
        );
        Snapshot::from_json(&std::fs::read(path).unwrap()).unwrap()
    }

    fn config(env: &[&str]) -> Value {
        json!({
            "ociVersion": "1.2.0",
            "process": {"args": ["sh"], "env": env, "user": {"uid": 0, "gid": 0}},
            "root": {"path": "rootfs", "readonly": true},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "annotations": {"org.example/x": "y"},
            "linux": {"namespaces": [{"type": "pid"}], "resources": {"devices": [{"allow": false, "access": "rwm"}]}},
            "vendor.example/unknown": {"nested": [1, 2.5, null, "s"], "big": 18446744073709551615u64}
        })
    }

    fn env_of(v: &Value) -> Vec<String> {
        v["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn precreate_adds_the_env_and_preserves_every_other_field() {
        let input = config(&["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0,1"]);
        let (out, plan) =
            precreate(input.to_string().as_bytes(), &host(), &Config::default()).unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        let env = env_of(&out);
        assert!(
            env.contains(&"TORCH_CUDA_ARCH_LIST=7.5;8.6".to_owned()),
            "{env:?}"
        );
        assert!(env.contains(&"GPUARCH_DTYPE=float16".to_owned()));
        assert_eq!(&env[..2], ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0,1"]);
        assert_eq!(env.len(), 2 + plan.env.len());
        // Everything but process.env is exactly as it came in.
        let mut a = out.clone();
        let mut b = input.clone();
        a["process"]["env"] = Value::Null;
        b["process"]["env"] = Value::Null;
        assert_eq!(a, b);
    }

    #[test]
    fn no_gpu_or_opt_out_passes_the_bytes_through_untouched() {
        for env in [
            &["PATH=/bin"][..],
            &["NVIDIA_VISIBLE_DEVICES=all", "GPUARCH_DISABLE=1"],
        ] {
            let input = format!("{}\n", config(env));
            let (out, plan) = precreate(input.as_bytes(), &host(), &Config::default()).unwrap();
            assert!(plan.is_noop());
            assert_eq!(out, input.as_bytes());
        }
    }

    #[test]
    fn container_values_are_kept_unless_override() {
        let input = config(&["NVIDIA_VISIBLE_DEVICES=1", "TORCH_CUDA_ARCH_LIST=8.0"]).to_string();
        let (out, _) = precreate(input.as_bytes(), &host(), &Config::default()).unwrap();
        let env = env_of(&serde_json::from_slice(&out).unwrap());
        assert_eq!(
            env.iter()
                .filter(|e| e.starts_with("TORCH_CUDA_ARCH_LIST="))
                .count(),
            1
        );
        assert!(env.contains(&"TORCH_CUDA_ARCH_LIST=8.0".to_owned()));

        let cfg = Config {
            env: EnvConfig {
                override_existing: true,
                ..EnvConfig::default()
            },
            ..Config::default()
        };
        let (out, _) = precreate(input.as_bytes(), &host(), &cfg).unwrap();
        let env = env_of(&serde_json::from_slice(&out).unwrap());
        assert_eq!(
            env.iter()
                .filter(|e| e.starts_with("TORCH_CUDA_ARCH_LIST="))
                .count(),
            1
        );
        assert!(env.contains(&"TORCH_CUDA_ARCH_LIST=8.6".to_owned()));
    }

    #[test]
    fn bad_configs_are_errors_not_panics() {
        let h = host();
        let c = Config::default();
        assert!(matches!(
            precreate(b"{\"process\":", &h, &c),
            Err(HookError::Oci(oci::OciError::Syntax { .. }))
        ));
        assert!(matches!(precreate(b"[1]", &h, &c), Err(HookError::Oci(_))));
        let no_process = json!({"annotations": {"cdi.k8s.io/g": "nvidia.com/gpu=0"}}).to_string();
        let e = precreate(no_process.as_bytes(), &h, &c).unwrap_err();
        assert!(e.to_string().contains("no \"process\" object"), "{e}");
    }

    #[test]
    fn a_hundred_thousand_env_entries_are_handled() {
        let mut env: Vec<String> = (0..100_000).map(|i| format!("V{i}=x")).collect();
        env.push("NVIDIA_VISIBLE_DEVICES=1".into());
        let refs: Vec<&str> = env.iter().map(String::as_str).collect();
        let input = config(&refs).to_string();
        let t = std::time::Instant::now();
        let (out, plan) = precreate(input.as_bytes(), &host(), &Config::default()).unwrap();
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(
            env_of(&serde_json::from_slice(&out).unwrap()).len(),
            100_001 + plan.env.len()
        );
    }
}
