//! gpuarchd on a real, private `dbus-daemon` configured like the system bus
//! (deny by default, holes punched by `packaging/dbus/io.gpuarch1.conf`),
//! with the fake NVML behind the real nvml-wrapper, a real sd_notify socket,
//! and gpuarchctl as users see it. One file per interface, with doctor and
//! the NFD file beside them; the helpers here.
//!
//! Needs root (only root may own io.gpuarch1 under the shipped policy),
//! dbus-daemon and setpriv; `.ci/run` has them. A missing one is reported
//! and the test skips.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use gpuarch_core::snapshot::Snapshot;
use gpuarch_tests::daemon::{Node, Policy, block_on};
use gpuarch_tests::{artifacts, cannot_run, fixture, workspace_root};
use gpuarch_wire::dbus::{DaemonProxy, InventoryProxy, JobProxy, JobState};

fn missing(tools: &[&str]) -> Option<String> {
    cannot_run(
        ": only root may own io.gpuarch1 under the shipped bus policy",
        tools,
    )
}

macro_rules! need_bus {
    ($($tool:expr),*) => {
        gpuarch_tests::skip_unless!(missing(&["dbus-daemon" $(, $tool)*]))
    };
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The D-Bus error name and message of a failed call.
fn dbus_error(e: zbus::Error) -> (String, String) {
    match e {
        zbus::Error::MethodError(name, msg, _) => {
            (name.as_str().to_owned(), msg.unwrap_or_default())
        }
        zbus::Error::FDO(f) => (
            zbus::DBusError::name(f.as_ref()).as_str().to_owned(),
            zbus::DBusError::description(f.as_ref())
                .unwrap_or_default()
                .to_owned(),
        ),
        other => panic!("not a D-Bus error reply: {other}"),
    }
}

/// `gpuarch-hook precreate` on `node`'s config and inventory for a
/// container given `visible` (NVIDIA_VISIBLE_DEVICES): the config it
/// returns, and its log (the plan's notes).
fn precreate(node: &Node, visible: &str) -> (serde_json::Value, String) {
    let config = serde_json::json!({"ociVersion": "1.2.0",
        "process": {"args": ["sh"], "env": [format!("NVIDIA_VISIBLE_DEVICES={visible}")]},
        "root": {"path": "rootfs"}});
    let o = gpuarch_tests::output_with_stdin(
        Command::new(&artifacts().gpuarch_hook)
            .arg("precreate")
            .env("GPUARCH_CONFIG", node.path("config.yaml"))
            .env("GPUARCH_INVENTORY", node.path("run/inventory.json"))
            .env("GPUARCH_LOG", "stderr"),
        config.to_string().as_bytes(),
    );
    let (out, log) = text(&o);
    assert!(o.status.success(), "{log}");
    (serde_json::from_str(&out).unwrap(), log)
}

fn all_text(o: &Output) -> String {
    let (out, err) = text(o);
    format!("{out}{err}")
}

/// A Prewarm of 8.6 as root on a node with no packages: a job that
/// finishes at once.
async fn empty_prewarm(conn: &zbus::Connection) -> zbus::OwnedObjectPath {
    let reply = conn
        .call_method(
            Some("io.gpuarch1"),
            "/io/gpuarch1",
            Some("io.gpuarch1.KernelCache"),
            "Prewarm",
            &(Vec::<String>::new(), vec!["8.6".to_owned()]),
        )
        .await
        .unwrap();
    reply.body().deserialize().unwrap()
}

mod daemon;
mod doctor;
mod jit_cache;
mod json;
mod kernel_cache;
mod nfd;
