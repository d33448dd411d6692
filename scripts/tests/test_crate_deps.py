"""scripts/crate-deps on planted faults: an edge the table lacks, a stale
edge, a crate without a row; and a table that is true."""

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "crate-deps")


def meta(tmp_path, deps):
    """cargo metadata's shape for crates `deps` (dir -> list of dirs)."""
    pkgs = []
    for d, uses in deps.items():
        pkgs.append({
            "name": f"x-{d}",
            "manifest_path": str(tmp_path / d / "Cargo.toml"),
            "dependencies": [{"name": f"x-{u}", "kind": None} for u in uses]
            + [{"name": "serde", "kind": None}, {"name": f"x-{d}dev", "kind": "dev"}],
        })
    path = tmp_path / "meta.json"
    path.write_text(json.dumps({"packages": pkgs, "workspace_root": str(tmp_path)}))
    return path


def doc(tmp_path, rows):
    text = "# A\n\n| crate | role | workspace crates it uses | other |\n|---|---|---|---|\n"
    for d, uses in rows.items():
        text += f"| `{d}` (x-{d}) | a role | {', '.join(uses) or 'none'} | serde |\n"
    path = tmp_path / "ARCH.md"
    path.write_text(text + "\nprose after the table, core, fs\n")
    return path


def run(tmp_path, deps, rows):
    r = subprocess.run([sys.executable, SCRIPT, "--root", str(tmp_path), "--metadata",
                        str(meta(tmp_path, deps)), "--doc", str(doc(tmp_path, rows))],
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def test_a_true_table_passes(tmp_path):
    rc, out = run(tmp_path, {"core": [], "fs": ["core"]}, {"core": [], "fs": ["core"]})
    assert rc == 0, out


def test_an_edge_the_table_does_not_list(tmp_path):
    rc, out = run(tmp_path, {"core": [], "fs": ["core"], "hook": ["core", "fs"]},
                  {"core": [], "fs": ["core"], "hook": ["core"]})
    assert rc == 1, out
    assert "hook uses fs, which its row does not list" in out, out


def test_a_stale_edge_and_a_missing_row(tmp_path):
    rc, out = run(tmp_path, {"core": [], "fs": [], "audit": ["core"]},
                  {"core": [], "fs": ["core"], "gone": []})
    assert rc == 1, out
    assert "fs's row lists core, which it does not use" in out, out
    assert "audit: no row" in out, out
    assert "row gone: no such crate in the workspace" in out, out
