"""scripts/check-links on planted faults: a link to no file, an anchor no
heading makes, a page docs/README.md does not list; and links that
resolve (headings with code and punctuation, a fenced block ignored)."""

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "check-links")


def tree(tmp_path, files):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    r = subprocess.run([sys.executable, SCRIPT, "--root", str(tmp_path)],
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


GOOD = {
    "README.md": "# X\n\nSee [install](docs/ops/install.md#wire-it-into-the-engine) and "
                 "[the index](docs/README.md), [up](#x).\n",
    "docs/README.md": "# Index\n\n[install](ops/install.md)\n",
    "docs/ops/install.md": "# Install\n\n## Wire it into the `engine`!\n\n```\n[no](nowhere.md)\n```\n",
}


def test_links_that_resolve_pass(tmp_path):
    rc, out = tree(tmp_path, GOOD)
    assert rc == 0, out


def test_a_link_to_no_file(tmp_path):
    rc, out = tree(tmp_path, dict(GOOD, **{"README.md": "[gone](docs/gone.md)\n"}))
    assert rc == 1, out
    assert "README.md:1: docs/gone.md (no docs/gone.md)" in out, out


def test_an_anchor_no_heading_makes(tmp_path):
    rc, out = tree(tmp_path, dict(GOOD, **{"README.md": "[x](docs/ops/install.md#kubernetes)\n"}))
    assert rc == 1, out
    assert "(no heading #kubernetes)" in out, out


def test_a_page_the_index_does_not_list(tmp_path):
    rc, out = tree(tmp_path, dict(GOOD, **{"docs/ops/slurm.md": "# Slurm\n"}))
    assert rc == 1, out
    assert "docs/README.md does not list docs/ops/slurm.md" in out, out
