//! gpuarchd's `Plan` over D-Bus, timed against `Peer.Ping` to the same
//! daemon on the same connection (the ratio is what `Plan` itself costs).

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use zbus::Connection;

/// Calls per second, and the env the last `Plan` returned.
#[derive(Debug)]
pub struct Rate {
    pub plan_per_s: f64,
    pub ping_per_s: f64,
    /// The GPUs' capabilities the Plan names (`GPUARCH_COMPUTE_CAPABILITIES`,
    /// set for any GPU: `TORCH_CUDA_ARCH_LIST` is not, for an image not
    /// known on a Hopper).
    pub capabilities: String,
    pub env: HashMap<String, String>,
}

/// Variables and their values.
pub type Env = HashMap<String, String>;

/// gpuarchd's `Plan` for `devices`: the env it returns.
pub async fn plan(conn: &Connection, devices: &[&str]) -> Result<Env> {
    let reply = conn
        .call_method(
            Some("io.gpuarch1"),
            "/io/gpuarch1",
            Some("io.gpuarch1.Inventory"),
            "Plan",
            &(devices,),
        )
        .await
        .context("Plan")?;
    let (env, _notes): (HashMap<String, String>, Vec<String>) = reply.body().deserialize()?;
    Ok(env)
}

/// `org.freedesktop.DBus.Peer.Ping` to gpuarchd: the cheapest round trip.
pub async fn ping(conn: &Connection) -> Result<()> {
    conn.call_method(
        Some("io.gpuarch1"),
        "/io/gpuarch1",
        Some("org.freedesktop.DBus.Peer"),
        "Ping",
        &(),
    )
    .await
    .context("Ping")?;
    Ok(())
}

/// `calls` of each, half in each of two ABBA rounds.
pub fn plan_rate(address: &str, devices: &[&str], calls: usize) -> Result<Rate> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let conn = zbus::connection::Builder::address(address)
                .build()
                .await
                .with_context(|| format!("connecting to {address}"))?;
            let env = plan(&conn, devices).await?; // warm up, and what it says
            let Some(caps) = env.get("GPUARCH_COMPUTE_CAPABILITIES").cloned() else {
                bail!("Plan for {devices:?} set no GPUARCH_COMPUTE_CAPABILITIES: {env:?}");
            };
            let (mut plan_s, mut ping_s) = (0.0, 0.0);
            let half = (calls / 2).max(1);
            for plan_first in [true, false] {
                for is_plan in [plan_first, !plan_first] {
                    let t = Instant::now();
                    for _ in 0..half {
                        if is_plan {
                            plan(&conn, devices).await?;
                        } else {
                            ping(&conn).await?;
                        }
                    }
                    let dt = t.elapsed().as_secs_f64();
                    if is_plan { plan_s += dt } else { ping_s += dt }
                }
            }
            let n = (2 * half) as f64;
            Ok(Rate {
                plan_per_s: n / plan_s,
                ping_per_s: n / ping_s,
                capabilities: caps,
                env,
            })
        })
}
