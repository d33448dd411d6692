"""scripts/module-cycles on workspaces with planted cycles: each kind of
cycle it must catch, and the layouts that are not cycles."""

import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "module-cycles")


def workspace(tmp_path, files):
    """A one-crate workspace (`a`) holding `files` (path under a/src -> text)."""
    (tmp_path / "Cargo.toml").write_text('[workspace]\nmembers = ["a"]\n')
    for rel, text in files.items():
        p = tmp_path / "a" / "src" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def run(root):
    r = subprocess.run([sys.executable, SCRIPT, "--root", str(root)],
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def test_two_modules_that_use_each_other(tmp_path):
    root = workspace(tmp_path, {
        "lib.rs": "pub mod x;\npub mod y;\n",
        "x.rs": "use crate::y::Y;\npub struct X(Y);\n",
        "y.rs": "pub struct Y;\npub fn f() -> crate::x::X { todo!() }\n",
    })
    rc, out = run(root)
    assert rc == 1, out
    assert "cycle among x, y" in out, out


def test_a_cycle_through_a_name_re_exported_at_the_crate_root(tmp_path):
    root = workspace(tmp_path, {
        "lib.rs": "pub mod x;\npub mod y;\npub use y::Thing;\n",
        "x.rs": "pub fn make() -> crate::Thing { crate::Thing }\npub struct X;\n",
        "y.rs": "pub struct Thing;\npub fn g(_: crate::x::X) {}\n",
    })
    rc, out = run(root)
    assert rc == 1, out
    assert "cycle among x, y" in out, out


def test_a_cycle_through_a_private_item_of_the_crate_root(tmp_path):
    root = workspace(tmp_path, {
        "lib.rs": "mod x;\nfn helper() -> u32 { x::run() }\n",
        "x.rs": "pub fn run() -> u32 { crate::helper() }\n",
    })
    rc, out = run(root)
    assert rc == 1, out
    assert "cycle among crate, x" in out, out


def test_a_cycle_between_sibling_files_in_one_folder(tmp_path):
    root = workspace(tmp_path, {
        "lib.rs": "pub mod m;\n",
        "m/mod.rs": "mod p;\nmod q;\npub use p::P;\n",
        "m/p.rs": "use super::q::Q;\npub struct P(Q);\n",
        "m/q.rs": "pub struct Q;\npub fn f(_: super::p::P) {}\n",
    })
    rc, out = run(root)
    assert rc == 1, out
    assert "cycle among m::p, m::q" in out, out


def test_a_brace_in_a_test_modules_string_does_not_hide_what_follows(tmp_path):
    root = workspace(tmp_path, {
        "lib.rs": "pub mod x;\npub mod y;\n",
        "x.rs": (
            '#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() { let _ = "{"; }\n}\n\n'
            "use crate::y::Y;\npub struct X(Y);\n"
        ),
        "y.rs": "pub struct Y;\npub fn f(_: crate::x::X) {}\n",
    })
    rc, out = run(root)
    assert rc == 1, out
    assert "cycle among x, y" in out, out


@pytest.mark.parametrize("files", [
    # A folder's front and its children: they use what it defines, it
    # re-exports theirs.
    {
        "lib.rs": "pub mod m;\n",
        "m/mod.rs": "mod p;\npub use p::P;\npub struct Front;\nfn f(_: P) {}\n",
        "m/p.rs": "pub struct P(super::Front);\n",
    },
    # Paths named only in comments, strings and tests.
    {
        "lib.rs": "pub mod x;\npub mod y;\n",
        "x.rs": "// crate::y::Y\npub const S: &str = \"crate::y::Y\";\npub struct X;\n",
        "y.rs": "pub struct Y(crate::x::X);\n#[cfg(test)]\nmod tests {\n    use crate::x::X;\n}\n",
    },
], ids=["a folder's front and its children", "comments, strings and tests"])
def test_what_is_not_a_cycle(tmp_path, files):
    rc, out = run(workspace(tmp_path, files))
    assert rc == 0, out
    assert "no import cycles" in out


def test_this_workspace_has_none():
    rc, out = run(os.path.join(os.path.dirname(__file__), "..", ".."))
    assert rc == 0, out
