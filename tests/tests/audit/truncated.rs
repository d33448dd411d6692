//! A library of the image truncated while the audit reads it: its mapping
//! faults (SIGBUS). Under `gpuarchctl audit` and under gpuarchd's audit
//! worker the file is named, by its path in the image, in a clear error,
//! not a "Bus error" and a core; gpuarchd goes on.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuarch_tests::daemon::{Node, Policy};

use crate::ctl_on_the_fixture;

/// Where the library is in the image.
const LIB: &str = "usr/local/cuda/lib64/libbig.so";

/// An image (in memory) for a library at [`LIB`], and the library's
/// bytes: a `.ldata` of 256 MiB of fatbin magic over and over, none a real
/// container, so that the audit searches it through for embedded fatbins,
/// a candidate every 4 bytes, while the test cuts the file.
fn image_and_library() -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let image = gpuarch_tests::truncate::scratch_in_memory();
    let lib = image.path().join(LIB);
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    let build = gpuarch_tests::truncate::scratch_in_memory();
    let magic = 0xBA55_ED50u32.to_le_bytes().repeat(64 << 20);
    let built = gpuarch_tests::fatlib::shared_library_with_section(
        build.path(),
        "libbig.so",
        ".ldata",
        &magic,
    );
    (image, lib, std::fs::read(built).unwrap())
}

/// Exit status 2 from gpuarchctl (the worker's is 1).
#[test]
fn a_library_truncated_while_it_is_audited_is_named() {
    let (image, lib, bytes) = image_and_library();
    let outs = gpuarch_tests::truncate::truncated_under(
        || {
            let mut c = ctl_on_the_fixture();
            c.arg("audit").arg(image.path());
            c
        },
        &lib,
        || std::fs::write(&lib, &bytes).unwrap(),
    );
    gpuarch_tests::truncate::assert_named_on_sigbus(&outs, &format!("gpuarchctl: /{LIB}"), 2);
}

/// Whether an audit worker (`gpuarchd --audit-worker`) has `file` mapped.
fn a_worker_maps(file: &Path) -> bool {
    let name = file.to_str().unwrap();
    std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
        std::fs::read(p.path().join("cmdline"))
            .is_ok_and(|c| c.windows(14).any(|w| w == b"--audit-worker"))
            && std::fs::read_to_string(p.path().join("maps")).is_ok_and(|m| m.contains(name))
    })
}

/// The lines of gpuarchd's log on an image's audit, kept or failed.
fn audit_lines(node: &Node) -> Vec<String> {
    node.log()
        .lines()
        .filter(|l| l.contains("image audit ") && !l.contains("image audit: "))
        .map(str::to_owned)
        .collect()
}

/// A container start asks gpuarchd to audit its image; gpuarchd's worker
/// maps the library, the test cuts it: gpuarchd's log names the library
/// by its path in the image, gpuarchd goes on serving, and keeps no audit
/// of the image. A run whose worker finished reading first is tried again
/// on a changed image (another Python distribution: another image key),
/// up to five.
#[test]
fn a_library_truncated_under_gpuarchds_audit_worker_is_named_in_its_log() {
    let (image, lib, bytes) = image_and_library();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let audits = node.path("audits");
    let yaml = gpuarch_tests::private_hook_paths(
        &format!(
            "audit:\n  dir: {}\n{}",
            audits.display(),
            node.private_config("")
        ),
        &node.path("hook"),
    );
    std::fs::write(node.path("config.yaml"), yaml).unwrap();
    node.start(&[]);
    let site = image.path().join(gpuarch_tests::audit::SITE);
    let mut lines = Vec::new();
    for n in 1..=5 {
        std::fs::write(&lib, &bytes).unwrap();
        let dist = site.join(format!("pkg{n}-1.0.dist-info"));
        std::fs::create_dir_all(&dist).unwrap();
        std::fs::write(
            dist.join("METADATA"),
            format!("Metadata-Version: 2.1\nName: pkg{n}\nVersion: 1.0\n\n"),
        )
        .unwrap();
        let before = audit_lines(&node).len();
        let (ok, log) = crate::start(&node, image.path(), "1");
        assert!(ok && log.contains("asked gpuarchd"), "{log}");
        let t0 = Instant::now();
        while !a_worker_maps(&lib) && audit_lines(&node).len() == before {
            assert!(t0.elapsed() < Duration::from_secs(60), "{}", node.log());
            std::thread::yield_now();
        }
        gpuarch_tests::truncate::cut(&lib);
        let line = loop {
            if let Some(l) = audit_lines(&node).get(before) {
                break l.clone();
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "{}", node.log());
            std::thread::sleep(Duration::from_millis(20));
        };
        let cut = line.contains("SIGBUS");
        lines.push(line);
        if cut {
            break;
        }
    }
    let last = lines.last().unwrap();
    assert!(
        last.contains("the audit worker exited with exit status: 1")
            && last.contains(&format!(
                "gpuarchd --audit-worker: /{LIB}: the file shrank while it was read (SIGBUS)"
            ))
            && last.contains("not asked again for 600 s"),
        "no run of {} named the file cut under the worker: {lines:#?}",
        lines.len()
    );
    // gpuarchd goes on, and kept no audit of the image it could not read.
    assert!(node.ctl(None, &["status"]).status.success());
    let key = last
        .split_whitespace()
        .nth(4)
        .unwrap()
        .trim_end_matches(':');
    assert_eq!(key.len(), 64, "{last}");
    assert!(
        !audits.join(format!("{key}.json")).exists(),
        "{}",
        node.log()
    );
}
