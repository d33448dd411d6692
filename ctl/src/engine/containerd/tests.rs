//! Tests of containerd's config merging and the drop-in.

use super::*;

#[test]
fn wildcards_as_containerd_imports_use_them() {
    assert!(wildcard("*.toml", "gpuarch.toml"));
    assert!(!wildcard("*.toml", "gpuarch.toml.bak"));
    assert!(wildcard("g?uarch*", "gpuarch.toml"));
    assert!(!wildcard("a*", "b"));
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_v2_import_replaces_the_cri_section_and_a_runtimes_table_drops_runc() {
    let d = tempfile::tempdir().unwrap();
    let main = write(
        d.path(),
        "config.toml",
        &format!(
            "version = 2\nimports = [\"{}/conf.d/*.toml\"]\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\nbin_dir = \"/usr/lib/cni\"\n",
            d.path().display()
        ),
    );
    let root = Path::new("/");
    assert!(
        effective(root, &main, None)
            .unwrap()
            .cri_problem()
            .is_none()
    );
    let bad = write(
        d.path(),
        "conf.d/old.toml",
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuarch]\nruntime_type = \"io.containerd.runc.v2\"\n",
    );
    let eff = effective(root, &main, None).unwrap();
    assert!(eff.cri.get("cni").is_none(), "1.x replaces the section");
    assert!(
        eff.cri_problem()
            .unwrap()
            .contains("default_runtime_name = \"runc\"")
    );
    std::fs::remove_file(bad).unwrap();

    let out = d.path().join("conf.d/gpuarch.toml");
    let drop = containerd_dropin(
        Path::new("/"),
        &main,
        Path::new("/usr/bin/gpuarch-runtime"),
        HANDLER,
        &out,
    )
    .unwrap();
    assert!(drop.notes.is_empty(), "{:?}", drop.notes);
    std::fs::write(&out, &drop.text).unwrap();
    let eff = effective(root, &main, None).unwrap();
    assert_eq!(eff.cri_problem(), None);
    assert_eq!(eff.gpuarch_handlers(), vec!["gpuarch".to_owned()]);
    assert_eq!(eff.cri["cni"]["bin_dir"].as_str(), Some("/usr/lib/cni"));
    // Written again from the same files, it is the same text.
    let again = containerd_dropin(
        Path::new("/"),
        &main,
        Path::new("/usr/bin/gpuarch-runtime"),
        HANDLER,
        &out,
    )
    .unwrap();
    assert_eq!(again.text, drop.text);
    assert!(!stale(root, &main, &out).unwrap());
    // The admin changes config.toml's CRI section: the copy is stale.
    std::fs::write(
        &main,
        std::fs::read_to_string(&main)
            .unwrap()
            .replace("/usr/lib/cni", "/opt/cni/bin"),
    )
    .unwrap();
    assert!(stale(root, &main, &out).unwrap());
}

#[test]
fn runcs_options_carry_over_and_a_missing_import_is_said() {
    let d = tempfile::tempdir().unwrap();
    let main = write(
        d.path(),
        "config.toml",
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\nruntime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\nSystemdCgroup = true\n",
    );
    let out = d.path().join("conf.d/gpuarch.toml");
    let drop = containerd_dropin(
        Path::new("/"),
        &main,
        Path::new("/x/gpuarch-runtime"),
        "gpu",
        &out,
    )
    .unwrap();
    let doc: Table = drop.text.parse().unwrap();
    let rt = &doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
    assert_eq!(rt["gpu"]["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(
        rt["gpu"]["options"]["BinaryName"].as_str(),
        Some("/x/gpuarch-runtime")
    );
    assert!(rt["runc"]["options"].get("BinaryName").is_none());
    assert!(drop.notes.is_empty(), "{:?}", drop.notes);
    let glob = format!("{}/conf.d/gpuarch*.toml", d.path().display());
    assert_eq!(drop.import.as_deref(), Some(glob.as_str()));
    // Added to a config without imports, the key goes above the first
    // table, and containerd then reads the drop-in.
    write(d.path(), "conf.d/gpuarch.toml", &drop.text);
    let text = std::fs::read_to_string(&main).unwrap();
    let edited = add_import(&text, &glob).unwrap();
    assert!(
        edited.ends_with(&text[text.find('[').unwrap()..]),
        "{edited}"
    );
    assert_eq!(add_import(&edited, &glob).unwrap(), edited);
    std::fs::write(&main, &edited).unwrap();
    let eff = effective(Path::new("/"), &main, None).unwrap();
    assert!(eff.reads_file(Path::new("/"), &main, &out));
    assert_eq!(eff.gpuarch_handlers(), vec!["gpu".to_owned()]);
}

#[test]
fn an_import_joins_an_existing_list_and_keeps_the_comments() {
    let text = "# admin's note\nversion = 2\nimports = [\n  \"/etc/containerd/a.toml\", # theirs\n]\n\n[grpc]\naddress = \"/run/c.sock\"\n";
    let edited = add_import(text, "/etc/containerd/conf.d/gpuarch.toml").unwrap();
    assert!(edited.contains("# admin's note") && edited.contains("# theirs"));
    let doc: Table = edited.parse().unwrap();
    let list: Vec<_> = doc["imports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        list,
        [
            "/etc/containerd/a.toml",
            "/etc/containerd/conf.d/gpuarch.toml"
        ]
    );
    assert_eq!(doc["grpc"]["address"].as_str(), Some("/run/c.sock"));
    let e = add_import("imports = \"/x\"\n", "/y").unwrap_err();
    assert!(e.to_string().contains("not a list"), "{e}");
    assert!(add_import("imports = [\n", "/y").is_err());
}

#[test]
fn v3_gets_only_the_runtimes_and_v1_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let main = write(
        d.path(),
        "config.toml",
        "version = 3\nimports = [\"/nowhere/*.toml\"]\n",
    );
    let out = d.path().join("gpuarch.toml");
    let drop = containerd_dropin(
        Path::new("/"),
        &main,
        Path::new("/usr/bin/gpuarch-runtime"),
        HANDLER,
        &out,
    )
    .unwrap();
    let doc: Table = drop.text.parse().unwrap();
    let cri = doc["plugins"]["io.containerd.cri.v1.runtime"]
        .as_table()
        .unwrap();
    assert_eq!(cri.len(), 1);
    assert!(cri["containerd"]["runtimes"].get("runc").is_some());
    let v1 = write(d.path(), "v1.toml", "root = \"/var/lib/containerd\"\n");
    let err = containerd_dropin(Path::new("/"), &v1, Path::new("/b"), HANDLER, &out).unwrap_err();
    assert!(
        err.to_string().contains("containerd config migrate"),
        "{err}"
    );
}

/// containerd's config is root's, yet doctor and `engine containerd` read
/// it as gpuarchd reads CRI-O's: a FIFO in its place is named, not waited
/// on, and so is an import of over a MiB.
#[test]
fn a_fifo_or_an_oversized_config_is_named_at_once() {
    let d = tempfile::tempdir().unwrap();
    let main = d.path().join("config.toml");
    nix::unistd::mkfifo(&main, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let t = std::time::Instant::now();
    let Err(e) = effective(Path::new("/"), &main, None) else {
        panic!("read")
    };
    assert!(format!("{e:#}").contains("not a regular file"), "{e:#}");
    std::fs::remove_file(&main).unwrap();
    let big = write(
        d.path(),
        "conf.d/big.toml",
        &format!("# {}\n", "x".repeat(1 << 20)),
    );
    write(
        d.path(),
        "config.toml",
        &format!("version = 2\nimports = [\"{}\"]\n", big.display()),
    );
    let Err(e) = effective(Path::new("/"), &main, None) else {
        panic!("read")
    };
    assert!(
        format!("{e:#}").contains("big.toml: over 1048576 bytes"),
        "{e:#}"
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(2));
}
