//! Real Python layouts found as Python finds them: uv's venv, /opt venvs on
//! PATH, user sites, conda envs, lib64, dist-packages, PYTHONPATH.

use super::*;

#[test]
fn uvs_app_venv_is_read_through_its_interpreter_on_path() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr/local", 12);
    // uv: bin/python -> the base's interpreter, python3 -> python.
    link(r, "app/.venv/bin/python", "/usr/local/bin/python3");
    link(r, "app/.venv/bin/python3", "python");
    write(
        r,
        "app/.venv/pyvenv.cfg",
        "home = /usr/local/bin\nimplementation = CPython\nuv = 0.9.5\nversion_info = 3.12.12\ninclude-system-site-packages = false\n",
    );
    let site = "app/.venv/lib/python3.12/site-packages";
    dist(r, site, "torch", "2.9.1");
    dist(r, site, "deepspeed", "0.18.9");
    let path = format!("/app/.venv/bin:{PATH}");
    let (got, proven, sw) = found(r, &process(&[("PATH", &path)]));
    assert_eq!(got, ["torch 2.9.1", "deepspeed 0.18.9"]);
    assert!(proven, "{sw:?}");
    assert!(sw.read.contains(&format!("/{site}")), "{:?}", sw.read);
}

/// A merged-/usr image (Debian and Ubuntu since 2023: `/bin`, `/lib` and
/// `/lib64` are links into `/usr`) whose PATH finds Python through `/bin`
/// too: the prefixes `/` and `/usr` share one `lib`, which the read lists
/// once (envs.rs, `subdirs_once`); both still count as found, so absence
/// stays proven.
#[test]
fn a_merged_usr_lib_shared_by_two_prefixes_counts_for_both() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 12);
    link(r, "bin", "usr/bin");
    link(r, "lib", "usr/lib");
    std::fs::create_dir_all(r.join("usr/lib64")).unwrap();
    link(r, "lib64", "usr/lib64");
    dist(r, "usr/lib/python3.12/site-packages", "torch", "2.9.1");
    dist(r, "usr/lib/python3/dist-packages", "accelerate", "1.15.0");
    // /usr/bin's python3 has the prefix `/usr`, /bin's the prefix `/`,
    // whose lib is /usr/lib again.
    let (got, proven, sw) = found(r, &process(&[("PATH", "/usr/bin:/bin")]));
    assert_eq!(got, ["torch 2.9.1", "accelerate 1.15.0"]);
    assert!(proven, "{sw:?}");
    // Each site once, under the name found first.
    let mut read = sw.read.clone();
    read.sort();
    read.dedup();
    assert_eq!(read.len(), sw.read.len(), "{:?}", sw.read);
}

#[test]
fn a_venv_under_opt_found_through_path_as_on_the_h100_host() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 12);
    link(r, "opt/torch/.venv/bin/python3", "/usr/bin/python3");
    write(
        r,
        "opt/torch/.venv/pyvenv.cfg",
        "home = /usr/bin\ninclude-system-site-packages = true\nversion = 3.12.3\n",
    );
    dist(
        r,
        "opt/torch/.venv/lib/python3.12/site-packages",
        "torch",
        "2.11.0+cu130",
    );
    // The system site the venv includes.
    dist(r, "usr/lib/python3/dist-packages", "accelerate", "1.10.1");
    let path = format!("/opt/torch/.venv/bin:{PATH}");
    let view = process(&[("PATH", &path), ("VIRTUAL_ENV", "/opt/torch/.venv")]);
    let (got, proven, _) = found(r, &view);
    assert_eq!(got, ["torch 2.11.0", "accelerate 1.10.1"]);
    assert!(proven);
}

#[test]
fn user_sites_of_root_and_of_a_user_whose_home_is_in_passwd() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 11);
    dist(
        r,
        "root/.local/lib/python3.11/site-packages",
        "deepspeed",
        "0.17.6",
    );
    write(
        r,
        "etc/passwd",
        "root:x:0:0:root:/root:/bin/bash\nml:x:1000:1000::/home/ml:/bin/sh\n",
    );
    dist(
        r,
        "home/ml/.local/lib/python3.11/site-packages",
        "xformers",
        "0.0.33.post2",
    );
    // Root, HOME unset: /root/.local, not ml's.
    let (got, proven, _) = found(r, &process(&[("PATH", PATH)]));
    assert_eq!(got, ["deepspeed 0.17.6"]);
    assert!(proven);
    // uid 1000 without HOME: its home from the image's /etc/passwd.
    let ml = ContainerView {
        user: Some((1000, 1000)),
        ..process(&[("PATH", PATH)])
    };
    let (got, _, _) = found(r, &ml);
    assert_eq!(got, ["xformers 0.0.33", "deepspeed 0.17.6"]);
    // PYTHONUSERBASE wins over both.
    dist(
        r,
        "srv/pyuser/lib/python3.11/site-packages",
        "flash-attn",
        "2.8.3",
    );
    let (got, _, _) = found(
        r,
        &process(&[("PATH", PATH), ("PYTHONUSERBASE", "/srv/pyuser")]),
    );
    assert!(got.contains(&"flash-attn 2.8.3".to_owned()), "{got:?}");
}

#[test]
fn a_conda_named_env_conda_base_and_rhel_lib64() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "opt/conda", 11);
    python(r, "opt/conda/envs/train", 11);
    dist(
        r,
        "opt/conda/envs/train/lib/python3.11/site-packages",
        "flash-attn",
        "2.8.3",
    );
    dist(
        r,
        "opt/conda/lib/python3.11/site-packages",
        "bitsandbytes",
        "0.48.1",
    );
    let path = format!("/opt/conda/envs/train/bin:/opt/conda/bin:{PATH}");
    let view = process(&[("PATH", &path), ("CONDA_PREFIX", "/opt/conda/envs/train")]);
    let (got, proven, _) = found(r, &view);
    assert_eq!(got, ["flash-attn 2.8.3", "bitsandbytes 0.48.1"]);
    assert!(proven);
    // An env not on PATH is still one of conda's envs/*.
    let (got, _, _) = found(r, &process(&[("PATH", PATH)]));
    assert!(got.contains(&"flash-attn 2.8.3".to_owned()), "{got:?}");

    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    // UBI: /usr/bin/python3 -> python3.9, pip's installs under lib64.
    python(r, "usr", 9);
    std::fs::create_dir_all(r.join("usr/lib64/python3.9")).unwrap();
    dist(
        r,
        "usr/local/lib64/python3.9/site-packages",
        "torch",
        "2.7.1",
    );
    dist(r, "usr/local/lib/python3.9/site-packages", "vllm", "0.10.1");
    let (got, proven, _) = found(r, &process(&[("PATH", PATH)]));
    assert_eq!(got, ["torch 2.7.1", "vllm 0.10.1"]);
    assert!(proven);
}

#[test]
fn debians_and_ngcs_dist_packages_and_pythonpath() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 12);
    dist(r, "usr/lib/python3/dist-packages", "accelerate", "1.8.1");
    dist(
        r,
        "usr/local/lib/python3.12/dist-packages",
        "torch",
        "2.8.0a0+5228986c39.nv25.6",
    );
    dist(r, "workspace/libs", "flashinfer-python", "0.6.5");
    let view = process(&[
        ("PATH", PATH),
        ("PYTHONPATH", "/workspace/libs:relative:/gone"),
    ]);
    let (got, proven, _) = found(r, &view);
    assert_eq!(
        got,
        ["torch 2.8.0", "flashinfer-python 0.6.5", "accelerate 1.8.1"]
    );
    assert!(proven);
}

#[test]
fn an_interpreter_whose_environment_is_not_found_proves_no_absence() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 12);
    dist(r, "usr/lib/python3/dist-packages", "xformers", "0.0.33");
    // A Python on PATH with no lib/python3.* where its prefix is.
    write(r, "opt/custom/bin/python3", "ELF");
    // PYTHONPATH naming a zip.
    write(r, "srv/deps.zip", "PK");
    let path = format!("/opt/custom/bin:{PATH}");
    let view = process(&[("PATH", &path), ("PYTHONPATH", "/srv/deps.zip")]);
    let (got, proven, sw) = found(r, &view);
    assert_eq!(got, ["xformers 0.0.33"]);
    assert!(!proven);
    assert!(sw.may_have(Dist::DeepSpeed), "not seen is not absent");
    assert_eq!(
        sw.unread,
        [
            "\"/opt/custom/bin/python3\": no lib/python3.* under \"/opt/custom\"",
            "PYTHONPATH's \"/srv/deps.zip\": not a directory (a zip is not read)",
        ]
    );
}

#[test]
fn a_real_pip_install_into_a_venv_is_read() {
    // A venv made by this machine's Python and a wheel pip installs into
    // it, as an image's build would.
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    let venv = r.join("opt/env");
    let python = ["python3", "/usr/bin/python3"].into_iter().find(|p| {
        std::process::Command::new(p)
            .args(["-m", "venv", "--help"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some(python) = python else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI: no python3 with venv to make a real environment"
        );
        eprintln!("skipped: no python3 with venv");
        return;
    };
    let ok = std::process::Command::new(python)
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    // A wheel of a consumer's name, built here (no network), installed by
    // the venv's own pip machinery: the base's pip targeting the venv.
    let wheel_dir = tempfile::tempdir().unwrap();
    let wheel = wheel_dir.path().join("accelerate-1.10.1-py3-none-any.whl");
    let mut zip = String::new();
    zip.push_str("import zipfile,sys\n");
    zip.push_str("z=zipfile.ZipFile(sys.argv[1],'w')\n");
    zip.push_str("z.writestr('accelerate/__init__.py','')\n");
    zip.push_str("z.writestr('accelerate-1.10.1.dist-info/METADATA','Metadata-Version: 2.1\\nName: accelerate\\nVersion: 1.10.1\\n')\n");
    zip.push_str("z.writestr('accelerate-1.10.1.dist-info/WHEEL','Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n");
    zip.push_str("z.writestr('accelerate-1.10.1.dist-info/RECORD','')\n");
    let made = std::process::Command::new(python)
        .args(["-c", &zip])
        .arg(&wheel)
        .status()
        .unwrap()
        .success();
    assert!(made);
    let venv_python = venv.join("bin/python3");
    let pip = std::process::Command::new(python)
        .args(["-m", "pip", "--python"])
        .arg(&venv_python)
        .args(["install", "--no-index", "--no-deps", "-q"])
        .arg(&wheel)
        .output()
        .unwrap();
    if !pip.status.success() {
        // pip older than 22.3 has no --python: install with the base's pip
        // into the venv's site.
        let site = std::process::Command::new(&venv_python)
            .args([
                "-c",
                "import sysconfig;print(sysconfig.get_paths()['purelib'])",
            ])
            .output()
            .unwrap();
        let site = String::from_utf8(site.stdout).unwrap();
        let ok = std::process::Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--no-index",
                "--no-deps",
                "-q",
                "--target",
            ])
            .arg(site.trim())
            .arg(&wheel)
            .status()
            .unwrap()
            .success();
        assert!(ok, "{}", String::from_utf8_lossy(&pip.stderr));
    }
    // The venv's interpreter links to this machine's Python, outside the
    // image: found by its pyvenv.cfg, never followed out.
    let view = process(&[("PATH", &format!("/opt/env/bin:{PATH}"))]);
    let (sw, notes) = read(&Root::open(r).unwrap(), &view, None);
    assert_eq!(
        sw.get(Dist::Accelerate),
        Some(Release::new(1, 10, 1)),
        "{sw:?} {notes:?}"
    );
    assert!(
        sw.read
            .iter()
            .any(|s| s.starts_with("/opt/env/lib/python3")),
        "{:?}",
        sw.read
    );
}

#[test]
fn a_process_whose_user_is_not_known_has_every_users_site_read() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    python(r, "usr", 12);
    write(
        r,
        "etc/passwd",
        "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
    );
    dist(
        r,
        "home/app/.local/lib/python3.12/site-packages",
        "deepspeed",
        "0.18.2",
    );
    dist(
        r,
        ".local/lib/python3.12/site-packages",
        "xformers",
        "0.0.30",
    );
    let mut view = process(&[("PATH", PATH)]);
    let (got, proven, _) = found(r, &view);
    assert!(got.is_empty() && proven, "root's sites alone: {got:?}");
    // A uid passwd does not know: HOME is `/` (runc), its site `/.local`.
    view.user = Some((4242, 4242));
    let (got, _, _) = found(r, &view);
    assert_eq!(got, ["xformers 0.0.30"]);
    view.user = None;
    let (got, proven, sw) = found(r, &view);
    assert_eq!(
        got,
        ["xformers 0.0.30", "deepspeed 0.18.2"],
        "{:?}",
        sw.read
    );
    assert!(proven);
}
