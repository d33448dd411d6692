"""accelerate: its reading of ACCELERATE_MIXED_PRECISION."""

import ast
import os
import sys

from consumer_check.common import ACCELERATE, CACHE, tally


def accelerate_precision(version=ACCELERATE):
    """accelerate's own reading of ACCELERATE_MIXED_PRECISION: its
    parse_choice_from_env and its PrecisionType, which Accelerator checks
    the value against."""
    import enum
    d = os.path.join(CACHE, f"accelerate-{version}")
    ns = {"os": os, "enum": enum}
    for name, wanted in (("environment.py", ["parse_choice_from_env"]),
                         ("dataclasses.py", ["EnumWithContains", "BaseEnum", "PrecisionType"])):
        path = os.path.join(d, name)
        with open(path) as f:
            tree = ast.parse(f.read())
        nodes = [n for n in tree.body
                 if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in wanted]
        if len(nodes) != len(wanted):
            sys.exit(f"accelerate {version} {name}: expected {wanted}")
        exec(compile(ast.Module(body=nodes, type_ignores=[]), path, "exec"), ns)

    def run(value):
        old = os.environ.pop("ACCELERATE_MIXED_PRECISION", None)
        try:
            if value is not None:
                os.environ["ACCELERATE_MIXED_PRECISION"] = value
            got = ns["parse_choice_from_env"]("ACCELERATE_MIXED_PRECISION", "no")
            return got, got in ns["PrecisionType"]
        finally:
            os.environ.pop("ACCELERATE_MIXED_PRECISION", None)
            if old is not None:
                os.environ["ACCELERATE_MIXED_PRECISION"] = old
    return run


def check_accelerate(label, value, caps, run):
    """Set (the script's config enables it) on every GPU; accelerate takes
    it; bf16 exactly when every GPU has it (8.0 on)."""
    if value is None:
        return [f"{label}: not set although env.enable names it"]
    got, valid = run(value)
    want = "bf16" if all(d >= (8, 0) for d in caps) else "fp16"
    out = []
    # Unset, accelerate takes "no": it works, in full precision.
    if not valid:
        out.append(f"{label}: accelerate does not take {got!r}")
    if got != want:
        out.append(f"{label}: {got!r} where {want!r} runs on every GPU")
    tally(run(None)[1], not out)
    return out
