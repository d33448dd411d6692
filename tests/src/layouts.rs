//! What `tests/fixtures/images/layouts` holds (every place real images keep
//! Python), as the hook's line on the image's consumers names it, for the
//! tests that read it through each way in: runc and podman
//! (tests/containers.rs), Docker (tests/engines.rs) and NRI (tests/nri/).

/// The image's process env: uv's venv first on PATH, as uv's images set it.
pub const ENV: [&str; 2] = [
    "PATH=/app/.venv/bin:/usr/local/bin:/usr/bin:/bin",
    "VIRTUAL_ENV=/app/.venv",
];

/// What any user's read names: each consumer, and each site it is in.
pub const FOR_ANY_USER: [&str; 12] = [
    "torch 2.9.1",
    "flashinfer-python 0.6.13",
    "xformers 0.0.34",
    "deepspeed 0.19.8",
    "flash-attn 2.8.3",
    "accelerate 1.15.0",
    "/app/.venv/lib/python3.12/site-packages",
    "/usr/lib/python3/dist-packages",
    "/usr/local/lib64/python3.12/site-packages",
    "/opt/conda/lib/python3.11/site-packages",
    "/opt/conda/envs/serve/lib/python3.11/site-packages",
    "/root/.local/lib/python3.12/site-packages",
];

/// What only the read for uid 1000 (`app`, whose home only `/etc/passwd`
/// names) adds: its `~/.local` and what is in it.
pub const FOR_APP: [&str; 2] = [
    "bitsandbytes 0.45.0",
    "/srv/app/.local/lib/python3.12/site-packages",
];

/// The line on the image's consumers in `log`, checked: everything of
/// [`FOR_ANY_USER`], and [`FOR_APP`] exactly where `app_site`.
pub fn assert_read(how: &str, log: &str, app_site: bool) {
    let line = log
        .lines()
        .find(|l| l.contains("the image's consumers: "))
        .unwrap_or_else(|| panic!("{how}: no line on the image's consumers: {log}"));
    for want in FOR_ANY_USER {
        assert!(line.contains(want), "{how}: {want}: {line}");
    }
    for want in FOR_APP {
        assert_eq!(line.contains(want), app_site, "{how}: {want}: {line}");
    }
}
