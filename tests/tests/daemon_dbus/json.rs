//! `--json` on every gpuarchctl command: the test walks clap's tree of
//! subcommands, so a new one without an entry here fails it; each is run
//! against a real gpuarchd, and what it prints on stdout must be one JSON
//! document.

use super::*;

/// How to run a leaf here: its arguments, and, for one that cannot
/// succeed on this node, why (it must then fail with nothing on stdout).
fn case(leaf: &str, dir: &Path) -> Option<(Vec<String>, Option<&'static str>)> {
    let p = |n: &str| dir.join(n).display().to_string();
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    Some(match leaf {
        "status" | "devices" | "reload" | "labels" | "gc" | "verify" | "doctor" | "kernels"
        | "kernels ls" | "arch torch" => (vec![], None),
        "match" => (v(&["feature=bf16"]), None),
        "plan" => (v(&["--devices", "1"]), None),
        "arch check" => (v(&["8.6", "--on", "8.6"]), None),
        "arch parse" => (v(&["sm_86"]), None),
        "arch features" => (v(&["8.6"]), None),
        "arch toolkit" => (v(&["12.8"]), None),
        "inspect" => (vec![p("k.ptx")], None),
        "audit" => (vec![dir.to_str().unwrap().to_owned()], None),
        "prewarm" => (v(&["--arch", "8.6"]), None),
        "kernels import" => (vec!["demo".into(), p("k.ptx")], None),
        "kernels unimport" => (v(&["demo"]), None),
        "kernels push" | "kernels pull" => (vec![], Some("no kernels.remote on this node")),
        // Not a wheel: the failed job, in JSON.
        "kernels import-wheel" => (vec![p("k.ptx")], None),
        "jit ls" | "jit gc" => (vec![], None),
        "slurm gres" => (v(&["--node", "n1"]), None),
        "slurm task-prolog" => (vec![], None),
        "engine containerd" => (
            vec![
                "--root".into(),
                p("root"),
                "--config".into(),
                "/etc/containerd/config.toml".into(),
            ],
            None,
        ),
        "engine docker" => (vec!["--config".into(), p("daemon.json")], None),
        "why" => (
            vec!["0123456789ab".into(), "--dir".into(), p("records")],
            None,
        ),
        _ => return None,
    })
}

/// Every leaf of `cmd`, as its words after `gpuarchctl`.
fn leaves(cmd: &clap::Command, above: &str, out: &mut Vec<String>) {
    let subs: Vec<_> = cmd
        .get_subcommands()
        .filter(|c| c.get_name() != "help")
        .collect();
    // A command with subcommands that also runs alone (kernels) is a leaf too.
    if !above.is_empty() && (subs.is_empty() || !cmd.is_subcommand_required_set()) {
        out.push(above.to_owned());
    }
    for c in subs {
        let name = if above.is_empty() {
            c.get_name().to_owned()
        } else {
            format!("{above} {}", c.get_name())
        };
        leaves(c, &name, out);
    }
}

#[test]
fn every_command_prints_one_json_document() {
    need_bus!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("k.ptx"),
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\n\tret;\n}\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("records")).unwrap();
    let etc = dir.path().join("root/etc/containerd");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::copy(
        workspace_root().join("tests/fixtures/containerd/debian-1.6.toml"),
        etc.join("config.toml"),
    )
    .unwrap();
    let mut all = Vec::new();
    leaves(
        &<gpuarch_ctl::cli::Cli as clap::CommandFactory>::command(),
        "",
        &mut all,
    );
    assert!(all.len() > 20, "{all:?}");
    let mut failures = Vec::new();
    for leaf in &all {
        let Some((args, cannot)) = case(leaf, dir.path()) else {
            failures.push(format!("{leaf}: no case in this test"));
            continue;
        };
        let o = node
            .ctl_cmd(None, &[])
            .arg("--json")
            .args(leaf.split(' '))
            .args(&args)
            .env("SLURM_STEP_GPUS", "1")
            .output()
            .unwrap();
        let (out, err) = text(&o);
        let code = o.status.code();
        match cannot {
            Some(why) => {
                if code != Some(2) || !out.is_empty() {
                    failures.push(format!(
                        "{leaf} ({why}): expected exit 2 and nothing on stdout, got {code:?}: {out}{err}"
                    ));
                }
            }
            None => {
                if !matches!(code, Some(0 | 1)) {
                    failures.push(format!("{leaf}: exit {code:?}: {err}"));
                } else if let Err(e) = serde_json::from_str::<serde_json::Value>(&out) {
                    failures.push(format!("{leaf}: not one JSON document ({e}): {out:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
