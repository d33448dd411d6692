use std::path::Path;

use gpuarch_core::arch::ComputeCapability;

use super::testwheel::{DSL, FMHA, Wheel};
use super::wheel::MAX_MISSING;
use super::*;
use gpuarch_wire::library::MAX_FETCH_DIRS;

fn cap(s: &str) -> ComputeCapability {
    ComputeCapability::parse_known(s).unwrap()
}

fn import(root: &Path, wheel: &Wheel, limits: &Limits) -> Result<Index, LibraryError> {
    let path = root.parent().unwrap().join("w.whl");
    wheel.write(&path);
    let f = std::fs::File::open(&path).unwrap();
    import_wheel(
        root,
        &f,
        &Source::file("flashinfer_cubin-0.6.13-py3-none-any.whl"),
        limits,
    )
}

/// Every file below `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Nothing of a refused import is left: no version, nothing in `tmp/`.
fn assert_nothing_left(root: &Path) {
    assert!(list(root).is_empty(), "{:?}", list(root));
    let tmp = root.join("tmp");
    if tmp.exists() {
        assert_eq!(tree(&tmp), Vec::<String>::new());
    }
}

fn setup() -> (tempfile::TempDir, std::path::PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("libraries");
    std::fs::create_dir(&root).unwrap();
    (t, root)
}

const LIMITS: Limits = Limits {
    max_bytes: 1 << 30,
    max_files: 1000,
    max_file_bytes: 1 << 20,
};

#[test]
fn a_wheel_is_indexed_by_what_each_file_carries_and_what_its_lists_lack() {
    let (_t, root) = setup();
    let index = import(&root, &Wheel::flashinfer("0.6.13"), &LIMITS).unwrap();
    assert_eq!(
        (index.dist.as_str(), index.version.as_str()),
        ("flashinfer-cubin", "0.6.13")
    );
    let t = |p: &str| {
        index.files[&format!("158f/fmha/trtllm-gen/{p}")]
            .targets
            .clone()
    };
    assert_eq!(t("fmhaSm100aKernel_Q.cubin"), ["sm_100a"]);
    assert!(!t("fmhaSm100fKernel_Q.cubin").is_empty());
    assert!(t("checksums.txt").is_empty() && t("include/flashInferMetaInfo.h").is_empty());
    assert!(
        !index.files.keys().any(|k| k.contains("__init__")),
        "only the cubins' root is served"
    );
    assert_eq!(
        index.missing.keys().collect::<Vec<_>>(),
        [
            "158f/fmha/trtllm-gen/fmhaSm103aKernel_Q.cubin",
            "801e/fmha/cute-dsl/x86_64/sm_100a/cute_dsl_fmha_bf16.so"
        ]
    );
    assert_eq!(
        list(&root),
        [("flashinfer-cubin".to_owned(), "0.6.13".to_owned())]
    );
    assert_eq!(
        read_index(&root, "flashinfer-cubin", "0.6.13").unwrap(),
        index
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(
            version_dir(&root, "flashinfer-cubin", "0.6.13")
                .join("files/158f/fmha/trtllm-gen/checksums.txt"),
        )
        .unwrap()
        .permissions(),
    );
    assert_eq!(mode & 0o777, 0o444);
}

#[test]
fn each_tree_holds_only_what_its_gpus_run_and_says_what_it_lacks() {
    let (_t, root) = setup();
    import(&root, &Wheel::flashinfer("0.6.13"), &LIMITS).unwrap();
    let meta = [
        "158f/fmha/trtllm-gen/checksums.txt",
        "158f/fmha/trtllm-gen/include/flashInferMetaInfo.h",
        "801e/fmha/cute-dsl/x86_64/sm_100a/checksums.txt",
    ];
    let with = |extra: &[&str]| {
        let mut v: Vec<String> = meta.iter().chain(extra).map(|s| (*s).to_owned()).collect();
        v.sort();
        v
    };

    // A B200: both of its cubins. Its CuTe DSL module is missing from a
    // directory that holds no code: FlashInfer may fetch it there, into a
    // tmpfs, as into its own cache. And FlashInfer's own scratch place.
    let (dir, s) = serve(&root, "flashinfer-cubin", "0.6.13", &[cap("10.0")]).unwrap();
    assert_eq!(
        tree(&dir),
        with(&[
            "158f/fmha/trtllm-gen/fmhaSm100aKernel_Q.cubin",
            "158f/fmha/trtllm-gen/fmhaSm100fKernel_Q.cubin"
        ])
    );
    assert_eq!((s.code_files, s.complete()), (2, true));
    assert_eq!(s.fetch_dirs, ["801e/fmha/cute-dsl/x86_64/sm_100a"]);
    assert_eq!(s.scratch_dirs, ["flashinfer"]);
    for d in s.writable_dirs() {
        assert!(dir.join(d).is_dir(), "no mount point {d}");
    }

    // A B300 (10.3): the family cubin only, and its own sm_103a cubin is
    // missing among the tree's code, where no tmpfs can go: incomplete.
    let (dir, s) = serve(&root, "flashinfer-cubin", "0.6.13", &[cap("10.3")]).unwrap();
    assert_eq!(
        tree(&dir),
        with(&["158f/fmha/trtllm-gen/fmhaSm100fKernel_Q.cubin"])
    );
    assert!(!s.complete());
    assert_eq!(s.missing, ["158f/fmha/trtllm-gen/fmhaSm103aKernel_Q.cubin"]);
    assert!(s.fetch_dirs.is_empty(), "{:?}", s.fetch_dirs);

    // An H100: no GPU code at all, and nothing it could ask for is missing.
    let (dir, s) = serve(&root, "flashinfer-cubin", "0.6.13", &[cap("9.0")]).unwrap();
    assert_eq!(tree(&dir), with(&[]));
    assert_eq!((s.code_files, s.complete()), (0, true));
    assert!(s.fetch_dirs.is_empty());

    // The same set again is the same tree, not a second one.
    let (again, s2) = serve(
        &root,
        "flashinfer-cubin",
        "0.6.13",
        &[cap("9.0"), cap("9.0")],
    )
    .unwrap();
    assert_eq!((again, s2), (dir, s));
    // Files are links to the import's, not copies.
    let a = std::fs::metadata(
        version_dir(&root, "flashinfer-cubin", "0.6.13")
            .join("files/158f/fmha/trtllm-gen/checksums.txt"),
    )
    .unwrap();
    let b = std::fs::metadata(
        version_dir(&root, "flashinfer-cubin", "0.6.13")
            .join("serve/9.0/158f/fmha/trtllm-gen/checksums.txt"),
    )
    .unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&a),
        std::os::unix::fs::MetadataExt::ino(&b)
    );
}

#[test]
fn a_version_imported_again_is_replaced_whole() {
    let (_t, root) = setup();
    import(&root, &Wheel::flashinfer("0.6.13"), &LIMITS).unwrap();
    serve(&root, "flashinfer-cubin", "0.6.13", &[cap("10.0")]).unwrap();
    let mut w = Wheel::flashinfer("0.6.13");
    w.members.retain(|(n, _)| !n.contains("Sm100a"));
    let mut list_fix = String::new();
    for (n, b) in &mut w.members {
        if n == &format!("{FMHA}checksums.txt") {
            list_fix = String::from_utf8(b.clone())
                .unwrap()
                .lines()
                .filter(|l| !l.contains("Sm100a"))
                .collect::<Vec<_>>()
                .join("\n");
            *b = list_fix.clone().into_bytes();
        }
    }
    assert!(!list_fix.is_empty());
    let index = import(&root, &w, &LIMITS).unwrap();
    assert!(!index.files.keys().any(|k| k.contains("Sm100a")));
    let vdir = version_dir(&root, "flashinfer-cubin", "0.6.13");
    assert!(
        !vdir.join("serve").exists(),
        "the old import's trees went with it"
    );
    assert_nothing_left_in_tmp(&root);
}

fn assert_nothing_left_in_tmp(root: &Path) {
    assert_eq!(tree(&root.join("tmp")), Vec::<String>::new());
}

#[test]
fn hostile_wheels_are_refused_and_leave_nothing() {
    let (_t, root) = setup();
    let refused = |w: Wheel, limits: Limits, expect: &str| {
        let e = import(&root, &w, &limits).unwrap_err().to_string();
        assert!(e.contains(expect), "{expect:?} not in: {e}");
        assert_nothing_left(&root);
    };
    let escaping = |name: &str| {
        let mut w = Wheel::flashinfer("0.6.13");
        w.members.push((name.to_owned(), b"x".to_vec()));
        w
    };
    refused(
        escaping("flashinfer_cubin/cubins/../../../../etc/passwd"),
        LIMITS,
        "'..'",
    );
    refused(escaping("/etc/passwd"), LIMITS, "absolute");
    refused(escaping("flashinfer_cubin/cubins/a//b"), LIMITS, "empty");
    assert!(!root.parent().unwrap().join("etc").exists());

    let mut w = Wheel::flashinfer("0.6.13");
    w.symlinks
        .push((format!("{FMHA}link.cubin"), "/etc/shadow".into()));
    refused(w, LIMITS, "symbolic link");

    let mut w = Wheel::flashinfer("0.6.13");
    w.wrong_hash.push(format!("{FMHA}fmhaSm100aKernel_Q.cubin"));
    refused(w, LIMITS, "differs from RECORD");

    let mut w = Wheel::flashinfer("0.6.13");
    w.unlisted.push(format!("{FMHA}fmhaSm100aKernel_Q.cubin"));
    refused(w, LIMITS, "not in RECORD");

    // A cubin its library's own list gives another hash.
    let mut w = Wheel::flashinfer("0.6.13");
    for (n, b) in &mut w.members {
        if n.ends_with("fmhaSm100fKernel_Q.cubin") {
            b.push(0);
        }
    }
    refused(w, LIMITS, "the list says");

    // A small wheel that unpacks to far more than the bound.
    let mut w = Wheel::flashinfer("0.6.13");
    w.members
        .push((format!("{FMHA}zeros.bin"), vec![0u8; 8 << 20]));
    refused(w, LIMITS, "over its bound");
    let mut w = Wheel::flashinfer("0.6.13");
    w.members
        .push((format!("{FMHA}a.bin"), vec![1u8; 900 << 10]));
    w.members
        .push((format!("{FMHA}b.bin"), vec![1u8; 900 << 10]));
    refused(
        w,
        Limits {
            max_bytes: 1 << 20,
            ..LIMITS
        },
        "over its bound",
    );
    let mut w = Wheel::flashinfer("0.6.13");
    for i in 0..20 {
        w.members.push((format!("{FMHA}f{i}.h"), b"x".to_vec()));
    }
    refused(
        w,
        Limits {
            max_files: 10,
            ..LIMITS
        },
        "over its bound",
    );

    // A mount bomb: a list naming 40,000 files the wheel lacks, each in a
    // directory of its own (each would be a tmpfs in every container), or
    // many files in a few directories. (The wheel lacks one more of its
    // own: a cubin its other list names.)
    let bomb = |files: usize, per_dir: usize| {
        let mut w = Wheel::flashinfer("0.6.13");
        let mut list = String::new();
        for i in 0..files {
            let line = format!("{}  d{}/f{i}.so\n", "ef".repeat(32), i / per_dir);
            list.push_str(&line);
        }
        for (n, b) in &mut w.members {
            if n.starts_with(DSL) && n.ends_with("checksums.txt") {
                *b = list.clone().into_bytes();
            }
        }
        w
    };
    let roomy = Limits {
        max_file_bytes: 16 << 20,
        ..LIMITS
    };
    refused(bomb(40_000, 1), roomy, "in 40001 directories");
    refused(bomb(MAX_FETCH_DIRS, 1), roomy, "in 65 directories");
    refused(
        bomb(MAX_MISSING, MAX_MISSING),
        roomy,
        "16385 files it lacks",
    );
    // A list over its bound is not read whole.
    let mut w = Wheel::flashinfer("0.6.13");
    w.members
        .push((format!("{DSL}x/checksums.txt"), vec![b'#'; 9 << 20]));
    refused(w, roomy, "over 8 MiB");
    // As many as may be: imported.
    let (_t2, root2) = setup();
    let index = import(&root2, &bomb(MAX_FETCH_DIRS - 1, 1), &roomy).unwrap();
    assert_eq!(index.missing.len(), MAX_FETCH_DIRS);

    // Not a library gpuarch knows, or a version its directory denies.
    let mut w = Wheel::flashinfer("0.6.13");
    w.members.last_mut().unwrap().1 = b"Name: numpy\nVersion: 0.6.13\n\n".to_vec();
    refused(w, LIMITS, "not a distribution gpuarch imports");
    let mut w = Wheel::flashinfer("0.6.13");
    w.members.last_mut().unwrap().1 = b"Name: flashinfer-cubin\nVersion: ../0.7\n\n".to_vec();
    refused(w, LIMITS, "METADATA says");

    // Not a zip at all.
    let path = root.parent().unwrap().join("junk.whl");
    std::fs::write(&path, b"not a zip").unwrap();
    let e = import_wheel(
        &root,
        &std::fs::File::open(&path).unwrap(),
        &Source::file("junk.whl"),
        &LIMITS,
    )
    .unwrap_err();
    assert!(e.to_string().contains("not a wheel"), "{e}");
}

#[test]
fn names_say_their_target_where_the_file_cannot_be_read() {
    let t = |p: &str| name_target(p).map(|t| t.to_string());
    assert_eq!(
        t("fmha/trtllm-gen/fmhaSm100aKernel_QE4m3.cubin").as_deref(),
        Some("sm_100a")
    );
    assert_eq!(
        t("fmha/cute-dsl/x86_64/sm_103a/x.so").as_deref(),
        Some("sm_103a")
    );
    assert_eq!(
        t("gemm/Gemm_Bfloat16_schedS_sm100f.cubin").as_deref(),
        Some("sm_100f")
    );
    assert_eq!(
        t("deep-gemm/kernel.fp8_m_grouped_gemm.007404769193.cubin"),
        None
    );
    assert_eq!(t("small/smart.cubin"), None);
}

#[test]
fn a_pulled_wheel_must_be_the_version_asked_for_and_says_where_it_came_from() {
    let (_t, root) = setup();
    let path = root.parent().unwrap().join("w.whl");
    // A registry that answers 0.6.13 with the wheel of 0.7.0: refused,
    // nothing kept.
    Wheel::flashinfer("0.7.0").write(&path);
    let pulled = |expect| Source {
        name: "flashinfer_cubin-0.7.0-py3-none-any.whl",
        origin: Some("127.0.0.1:5000/gpuarch/kernels@sha256:ab"),
        expect: Some(expect),
    };
    let f = std::fs::File::open(&path).unwrap();
    let e = import_wheel(&root, &f, &pulled(("flashinfer-cubin", "0.6.13")), &LIMITS)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "the wheel is flashinfer-cubin 0.7.0, not the flashinfer-cubin 0.6.13 asked for"
        ),
        "{e}"
    );
    assert_nothing_left(&root);

    // The version asked for: kept, with where it was pulled from, which a
    // wheel handed over has not.
    let index = import_wheel(&root, &f, &pulled(("flashinfer-cubin", "0.7.0")), &LIMITS).unwrap();
    assert_eq!(
        index.origin.as_deref(),
        Some("127.0.0.1:5000/gpuarch/kernels@sha256:ab")
    );
    assert_eq!(
        read_index(&root, "flashinfer-cubin", "0.7.0").unwrap(),
        index
    );
    let local = import(&root, &Wheel::flashinfer("0.6.13"), &LIMITS).unwrap();
    assert_eq!(local.origin, None);
    let raw = std::fs::read_to_string(version_dir(&root, "flashinfer-cubin", "0.6.13").join(INDEX))
        .unwrap();
    assert!(!raw.contains("origin"), "{raw}");
}

#[test]
fn what_a_dead_importer_left_half_made_is_cleared_and_imports_stay() {
    let (_t, root) = setup();
    import(&root, &Wheel::flashinfer("0.6.13"), &LIMITS).unwrap();
    let tmp = root.join("tmp");
    std::fs::create_dir_all(tmp.join("import-flashinfer-cubin-0.7.0.99.1/files/a")).unwrap();
    std::fs::write(tmp.join("pull-flashinfer-cubin-0.7.0.99.2.whl"), b"half").unwrap();
    assert_eq!(clear_staging(&root), 2);
    assert_eq!(tree(&tmp), Vec::<String>::new());
    assert_eq!(
        list(&root),
        [("flashinfer-cubin".to_owned(), "0.6.13".to_owned())]
    );
    assert_eq!(clear_staging(&root.join("absent")), 0);
}

/// `wheel` installed into a fresh directory as pip would: its members,
/// and RECORD listing byte code pip compiled, without a hash.
fn installed(parent: &Path, wheel: &Wheel) -> std::path::PathBuf {
    let dir = parent.join("site-packages");
    let _ = std::fs::remove_dir_all(&dir);
    wheel.install(&parent.join("installed.whl"), &dir);
    let pyc = "flashinfer_cubin/__pycache__/__init__.cpython-311.pyc";
    std::fs::create_dir_all(dir.join(pyc).parent().unwrap()).unwrap();
    std::fs::write(dir.join(pyc), b"\x00pyc").unwrap();
    let record = dir.join("flashinfer_cubin-0.6.13.dist-info/RECORD");
    let mut text = std::fs::read_to_string(&record).unwrap();
    text.push_str(&format!("{pyc},,\n"));
    std::fs::write(&record, text).unwrap();
    dir
}

fn import_dir(root: &Path, dir: &Path) -> Result<Index, LibraryError> {
    let d = std::fs::File::open(dir).unwrap();
    import_installed(root, &d, &Source::file("site-packages"), &LIMITS)
}

#[test]
fn an_installed_copy_is_imported_as_its_wheel_would_be() {
    let (t, root) = setup();
    let from_wheel = import(&root, &Wheel::flashinfer("0.6.13"), &LIMITS).unwrap();
    let dir = installed(t.path(), &Wheel::flashinfer("0.6.13"));
    let from_dir = import_dir(&root, &dir).unwrap();
    assert_eq!(from_dir.files, from_wheel.files);
    assert_eq!(from_dir.missing, from_wheel.missing);
    assert_eq!(from_dir.source, "site-packages");
    assert_eq!(
        read_index(&root, "flashinfer-cubin", "0.6.13").unwrap(),
        from_dir
    );
    assert_eq!(tree(&root.join("tmp")), Vec::<String>::new());
}

#[test]
fn a_hostile_installed_copy_is_refused_and_leaves_nothing() {
    let (t, root) = setup();
    let refused = |dir: &Path, want: &str| {
        let e = import_dir(&root, dir).unwrap_err().to_string();
        assert!(e.contains(want), "{want:?} not in {e}");
        assert_nothing_left(&root);
    };
    let cubin = format!("{FMHA}fmhaSm100aKernel_Q.cubin");

    // A cubin swapped for a link to a root-only file, and a directory
    // swapped for a link elsewhere: never followed.
    let dir = installed(t.path(), &Wheel::flashinfer("0.6.13"));
    std::fs::remove_file(dir.join(&cubin)).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", dir.join(&cubin)).unwrap();
    refused(&dir, "symbolic links");
    let dir = installed(t.path(), &Wheel::flashinfer("0.6.13"));
    let fmha = dir.join(FMHA.trim_end_matches('/'));
    let elsewhere = t.path().join("elsewhere");
    std::fs::rename(&fmha, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &fmha).unwrap();
    refused(&dir, "symbolic links");
    std::fs::remove_dir_all(&elsewhere).unwrap();

    // A FIFO where a cubin was: refused, not waited on.
    let dir = installed(t.path(), &Wheel::flashinfer("0.6.13"));
    std::fs::remove_file(dir.join(&cubin)).unwrap();
    nix::unistd::mkfifo(
        &dir.join(&cubin),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    refused(&dir, "not a regular file");

    // A file changed since it was installed.
    let dir = installed(t.path(), &Wheel::flashinfer("0.6.13"));
    let mut b = std::fs::read(dir.join(&cubin)).unwrap();
    b[100] ^= 1;
    std::fs::write(dir.join(&cubin), b).unwrap();
    refused(&dir, "differs from RECORD's");

    // A served file RECORD lists without a hash.
    let dir = installed(t.path(), &Wheel::flashinfer("0.6.13"));
    let record = dir.join("flashinfer_cubin-0.6.13.dist-info/RECORD");
    let text = std::fs::read_to_string(&record).unwrap();
    let text: String = text
        .lines()
        .map(|l| match l.split_once(',') {
            Some((p, _)) if p == cubin => format!("{p},,\n"),
            _ => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&record, text).unwrap();
    refused(&dir, "no hash");

    // Two installed versions side by side, and none.
    let dir = installed(t.path(), &Wheel::flashinfer("0.6.13"));
    std::fs::create_dir(dir.join("flashinfer_cubin-0.7.0.dist-info")).unwrap();
    refused(&dir, "2 installed copies");
    refused(t.path(), "no .dist-info of a library gpuarch imports");
}
