"""scripts/file-lengths on a planted fault: a tracked source file one line
over the bound fails; one at the bound, documentation, fixtures and an
untracked file do not."""

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "file-lengths")


def repo(tmp_path, files):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for rel, lines in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(f"line {i}\n" for i in range(lines)))
    subprocess.run(["git", "-C", str(tmp_path), "add", *files], check=True)


def run(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT, "--root", str(tmp_path)], capture_output=True,
                       text=True)
    return r.returncode, r.stdout + r.stderr


def test_a_source_file_over_the_bound_fails(tmp_path):
    repo(tmp_path, {"core/src/big.rs": 701, "scripts/tool.py": 700, "docs/LONG.md": 5000,
                    "tests/fixtures/x.rs": 900})
    (tmp_path / "untracked.rs").write_text("x\n" * 900)
    rc, out = run(tmp_path)
    assert rc == 1, out
    assert "core/src/big.rs: 701 lines (at most 700)" in out
    assert "tool.py" not in out and "LONG.md" not in out and "fixtures" not in out
    assert "untracked" not in out


def test_a_script_without_suffix_is_counted_by_its_shebang(tmp_path):
    repo(tmp_path, {"scripts/run": 2})
    (tmp_path / "scripts/run").write_text("#!/usr/bin/env python3\n" + "pass\n" * 800)
    rc, out = run(tmp_path)
    assert rc == 1 and "scripts/run: 801 lines" in out, out

