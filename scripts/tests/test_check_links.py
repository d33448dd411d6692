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


# A tree with sources: a test file split into a directory of modules, and
# a lone file.
SOURCES = dict(GOOD, **{
    "tests/tests/audit/main.rs": "mod wheels;\n#[test]\nfn an_image_is_audited_once() {}\n",
    "tests/tests/audit/wheels.rs": "#[test]\nfn every_wheel_matches_cuobjdump() {}\n",
    "fs/src/trust.rs": "pub fn open() {}\n",
    "scripts/tests/test_x.py": "def test_a_planted_fault_is_found():\n    pass\n",
})


def refs(tmp_path, text):
    page = SOURCES["docs/ops/install.md"]  # 7 lines: text starts at line 8
    return tree(tmp_path, dict(SOURCES, **{"docs/ops/install.md": page + text}))


def test_code_references_that_resolve_pass(tmp_path):
    rc, out = refs(tmp_path,
                   "Held by `tests/tests/audit/main.rs::an_image_is_audited_once`,"
                   " `every_wheel_matches_cuobjdump` (a module beside it), `trust.rs`"
                   " (a path's tail), `fs/src/trust.rs::open`,"
                   " `scripts/tests/test_x.py::test_a_planted_fault_is_found`;"
                   " torch's `torch/utils/cpp_extension.py` is not ours.\n"
                   "```\n`tests/tests/gone.rs`\n```\n")
    assert rc == 0, out


def test_a_file_split_into_a_directory(tmp_path):
    rc, out = refs(tmp_path, "See `tests/tests/audit.rs::an_image_is_audited_once`.\n")
    assert rc == 1, out
    assert "install.md:8: `tests/tests/audit.rs::an_image_is_audited_once`" \
        " (no tests/tests/audit.rs (it is a directory now))" in out, out


def test_a_renamed_test_and_a_bare_one_after_it(tmp_path):
    rc, out = refs(tmp_path, "`tests/tests/audit/main.rs::an_image_is_audited_twice`,"
                             " `every_wheel_is_read_by_hand`\n")
    assert rc == 1, out
    assert "defines no an_image_is_audited_twice" in out, out
    assert "`tests/tests/audit/main.rs::every_wheel_is_read_by_hand`" in out, out


def test_a_file_that_is_not_there(tmp_path):
    rc, out = refs(tmp_path, "`inventory/src/trust.rs` unit tests\n")
    assert rc == 1, out
    assert "(no inventory/src/trust.rs)" in out, out
