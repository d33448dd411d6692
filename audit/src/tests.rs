//! Unit tests of the image audit, on image fixtures in temporary
//! directories: crafted cubins and fatbins (the inspector's own layouts;
//! real nvcc output is audited in tests/tests/audit.rs).

use std::fs;
use std::path::Path;

use gpuarch_core::arch::{ComputeCapability, Placement};
use gpuarch_kernels::inspect::{write_cubin, write_fatbin};

use super::*;

/// A cubin of SM `sm` with one kernel.
fn cubin(sm: u32) -> Vec<u8> {
    write_cubin(sm, "kernel")
}

/// A cubin with no sections: no kernel in it.
fn stub_cubin(sm: u32) -> Vec<u8> {
    let mut d = cubin(sm)[..64].to_vec();
    d[40..48].fill(0);
    d[60..64].fill(0);
    d
}

fn ptx_fatbin(sm: u32) -> Vec<u8> {
    let ptx =
        format!(".version 8.0\n.target sm_{sm}\n.address_size 64\n.visible .entry k()\n{{\n}}\n");
    write_fatbin(&[(1, sm, ptx.as_bytes())])
}

fn put(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, data).unwrap();
}

/// A distribution in `site`: its METADATA, and a RECORD naming `files`
/// (path, contents), which are written too.
fn dist(root: &Path, site: &str, name: &str, version: &str, files: &[(&str, Vec<u8>)]) {
    let info = format!("{site}/{name}-{version}.dist-info");
    put(
        root,
        &format!("{info}/METADATA"),
        format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nA description.\n")
            .as_bytes(),
    );
    let mut record = String::new();
    for (path, data) in files {
        put(root, &format!("{site}/{path}"), data);
        record.push_str(&format!("{path},sha256=x,{}\n", data.len()));
    }
    record.push_str(&format!("{name}-{version}.dist-info/RECORD,,\n"));
    put(root, &format!("{info}/RECORD"), record.as_bytes());
}

const SITE: &str = "usr/local/lib/python3.12/dist-packages";

fn run(root: &Path, view: &ContainerView, limits: &Limits) -> ImageAudit {
    audit(Files::Root(&Root::open(root).unwrap()), view, limits)
}

/// Each binary the audit lists: owner, path, code.
fn listed(a: &ImageAudit) -> Vec<(&str, &str, Vec<String>)> {
    a.binaries
        .iter()
        .map(|b| (b.owner.as_str(), b.path.as_str(), b.code.clone()))
        .collect()
}

fn view() -> ContainerView {
    ContainerView::default()
}

#[test]
fn each_distributions_gpu_binaries_are_listed_with_its_release() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    put(r, "usr/bin/python3.12", b"");
    dist(
        r,
        SITE,
        "xformers",
        "0.0.29",
        &[
            ("xformers/_C.so", cubin(75)),
            ("xformers/__init__.py", b"".to_vec()),
            ("xformers/host_only.so", fs::read("/bin/true").unwrap()),
            // A placeholder cubin with no kernel launches nothing.
            ("xformers/stub.cubin", stub_cubin(75)),
        ],
    );
    dist(
        r,
        SITE,
        "torch",
        "2.12.0",
        &[("torch/lib/jit.fatbin", ptx_fatbin(80))],
    );
    let a = run(r, &view(), &Limits::default());
    assert_eq!(a.stopped, None);
    assert!(a.read.contains(&format!("/{SITE}")), "{:?}", a.read);
    assert_eq!(
        listed(&a),
        [
            (
                "torch 2.12.0",
                "/usr/local/lib/python3.12/dist-packages/torch/lib/jit.fatbin",
                vec!["compute_80".to_owned()]
            ),
            (
                "xformers 0.0.29",
                "/usr/local/lib/python3.12/dist-packages/xformers/_C.so",
                vec!["sm_75".to_owned()]
            ),
        ]
    );
    // The 3090 runs none of xformers' code; the 2080 Ti runs it from SASS.
    let x = &a.binaries[1];
    assert!(matches!(
        x.placement(ComputeCapability::new(8, 6), None),
        Placement::No(_)
    ));
    assert!(matches!(
        x.placement(ComputeCapability::new(7, 5), None),
        Placement::Sass(_)
    ));
    // The host-only library was read and is not a GPU binary, not an error.
    assert!(a.unread.is_empty(), "{:?}", a.unread);
    assert_eq!(a.files, 4);
}

#[test]
fn a_link_or_a_record_path_never_leads_out_of_the_image() {
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.so");
    fs::write(&secret, cubin(86)).unwrap();
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    dist(r, SITE, "evil", "1.0", &[]);
    // A link to the host's file, absolute and by `..`; a RECORD path
    // climbing out.
    fs::create_dir_all(r.join(SITE).join("evil")).unwrap();
    std::os::unix::fs::symlink(&secret, r.join(SITE).join("evil/abs.so")).unwrap();
    let up = "../".repeat(12) + secret.strip_prefix("/").unwrap().to_str().unwrap();
    std::os::unix::fs::symlink(&up, r.join(SITE).join("evil/up.so")).unwrap();
    put(
        r,
        &format!("{SITE}/evil-1.0.dist-info/RECORD"),
        format!("evil/abs.so,,\nevil/up.so,,\n{up},,\n").as_bytes(),
    );
    let a = run(r, &view(), &Limits::default());
    assert!(a.binaries.is_empty(), "{:?}", a.binaries);
    // A device node named by a RECORD is never opened.
    let d2 = tempfile::tempdir().unwrap();
    let r2 = d2.path();
    dist(r2, SITE, "dev", "1.0", &[]);
    fs::create_dir_all(r2.join(SITE).join("dev")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", r2.join(SITE).join("dev/zero.so")).unwrap();
    put(
        r2,
        &format!("{SITE}/dev-1.0.dist-info/RECORD"),
        b"dev/zero.so,,\n",
    );
    put(r2, "dev/zero", b"");
    let a = run(r2, &view(), &Limits::default());
    assert!(a.binaries.is_empty() && a.unread.is_empty(), "{a:?}");
}

#[test]
fn bounds_stop_the_audit_and_say_where() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    let files: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| (format!("p/k{i}.cubin"), cubin(80)))
        .collect();
    let files: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, c)| (p.as_str(), c.clone())).collect();
    dist(r, SITE, "many", "1.0", &files);
    let limits = Limits {
        max_files: 2,
        ..Limits::default()
    };
    let a = run(r, &view(), &limits);
    assert_eq!(a.binaries.len(), 2);
    assert_eq!(a.stopped.as_deref(), Some("over 2 files"));
    let limits = Limits {
        max_file: 10,
        ..Limits::default()
    };
    let a = run(r, &view(), &limits);
    assert!(a.binaries.is_empty());
    assert_eq!(a.unread.len(), 5, "{:?}", a.unread);
    assert!(
        a.unread[0].contains("over the 10 bytes read of one file"),
        "{}",
        a.unread[0]
    );
    let limits = Limits {
        deadline: Duration::ZERO,
        ..Limits::default()
    };
    let a = run(r, &view(), &limits);
    assert_eq!(a.stopped.as_deref(), Some("over 0 s"));
    assert!(a.binaries.is_empty());
}

#[test]
fn the_library_path_and_the_kernel_caches_are_read_too() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    put(
        r,
        "usr/local/cuda/lib64/libcublas.so.13.1.0.3",
        &write_fatbin(&[(2, 90, &cubin(90))]),
    );
    std::os::unix::fs::symlink(
        "libcublas.so.13.1.0.3",
        r.join("usr/local/cuda/lib64/libcublas.so.13"),
    )
    .unwrap();
    put(r, "opt/lib/libmine.so", &cubin(80));
    put(
        r,
        "root/.cache/huggingface/hub/models--kernels-community--activation/snapshots/abc/build/torch28-cxx11-cu128-x86_64-linux/activation/_activation_abc.abi3.so",
        &cubin(89),
    );
    put(r, "root/.cache/flashinfer/cubins/fmha/k.cubin", &cubin(100));
    let v = ContainerView::with_env([("LD_LIBRARY_PATH", "/opt/lib:relative/ignored")]);
    let a = run(r, &v, &Limits::default());
    let found: Vec<(&str, &str)> = a
        .binaries
        .iter()
        .map(|b| (b.owner.as_str(), b.path.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("library path /opt/lib", "/opt/lib/libmine.so"),
            (
                "library path /usr/local/cuda/lib64",
                "/usr/local/cuda/lib64/libcublas.so.13.1.0.3"
            ),
            (
                "Hugging Face hub cache",
                "/root/.cache/huggingface/hub/models--kernels-community--activation/snapshots/abc/build/torch28-cxx11-cu128-x86_64-linux/activation/_activation_abc.abi3.so"
            ),
            (
                "FlashInfer cubin cache",
                "/root/.cache/flashinfer/cubins/fmha/k.cubin"
            ),
        ]
    );
}

#[test]
fn a_venv_given_as_the_directory_is_read() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    put(r, "pyvenv.cfg", b"home = /usr/bin\n");
    dist(
        r,
        "lib/python3.11/site-packages",
        "xformers",
        "0.0.29",
        &[("xformers/_C.so", cubin(75))],
    );
    let a = run(r, &view(), &Limits::default());
    assert_eq!(a.binaries.len(), 1, "{a:?}");
    assert_eq!(a.binaries[0].owner, "xformers 0.0.29");
}

#[test]
fn quoted_record_paths() {
    assert_eq!(
        record_paths(b"a/b.so,sha256=1,2\n\"x,y/\"\"q\"\".so\",,\r\n\n"),
        ["a/b.so", "x,y/\"q\".so"]
    );
    assert_eq!(join("usr/lib/site", "../../../../../etc/x.so"), "etc/x.so");
    assert_eq!(join("a", "/b/./c"), "b/c");
}

mod layers;
