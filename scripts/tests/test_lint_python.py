"""scripts/lint-python on files with planted faults: the module-level
rebinding that broke gpu-check's part 3, what pyflakes finds, and what is
not a fault."""

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "lint-python")


def lint(tmp_path, text):
    p = tmp_path / "probe.py"
    p.write_text(text)
    r = subprocess.run([sys.executable, SCRIPT, str(p)], capture_output=True, text=True)
    return r.returncode, r.stdout


def test_a_constant_bound_twice_is_found(tmp_path):
    rc, out = lint(tmp_path, 'SRC = "a"\n\n\ndef f():\n    return SRC\n\n\nSRC = "b"\n')
    assert rc == 1
    assert "probe.py:8: SRC bound again at module level (first at line 1)" in out


def test_a_function_defined_twice_is_found(tmp_path):
    rc, out = lint(tmp_path, "def f():\n    return 1\n\n\ndef f():\n    return 2\n")
    assert rc == 1
    assert "f bound again" in out


def test_extending_a_name_and_rebinding_inside_functions_are_fine(tmp_path):
    text = ('PARTS = [1]\nPARTS = PARTS + [2]\n\n\ndef g():\n    x = 1\n    x = 2\n'
            '    return x + PARTS[0]\n')
    assert lint(tmp_path, text) == (0, "")


def test_what_pyflakes_finds_is_a_finding(tmp_path):
    rc, out = lint(tmp_path, "import os\n\n\ndef f():\n    return undefined_name\n")
    assert rc == 1
    assert "'os' imported but unused" in out and "undefined name 'undefined_name'" in out


def test_the_repository_is_clean():
    r = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
    assert (r.returncode, r.stdout) == (0, "")
