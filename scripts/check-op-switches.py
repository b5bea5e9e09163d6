#!/usr/bin/env python3
"""Checks that no source file of the library switches over every op kind.

Ops are defined by their families (docs/adding-an-op.md): shape inference,
autodiff, the executor and the time model read the op and kernel tables, so a
new op touches its family's two files. A switch that lists the op kinds one
by one would have to grow with every op again. A file may still name a few
kinds in `case OpKind::` labels (the sources, the collectives of one family),
but one that names more than a quarter of the built-in kinds is reported.

Usage: check-op-switches.py [--root DIR]. Prints each offending file with the
number of kinds it names, then one summary line; exits 1 when there is one.
"""

import argparse
import pathlib
import re
import sys

FOLDERS = ("lib", "popdist", "optimizers", "simdevice", "onnx", "sessions")
CASE = re.compile(r"case\s+OpKind::(\w+)")
ENUMERATOR = re.compile(r"^\s*(\w+)\s*(?:=\s*\w+\s*)?,", re.MULTILINE)


def builtin_kinds(root):
    text = (root / "include/tessera/graph.hpp").read_text()
    body = text[text.index("enum class OpKind"):]
    body = body[body.index("{") + 1:body.index("};")]
    body = re.sub(r"//[^\n]*", "", body)
    return set(ENUMERATOR.findall(body))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=pathlib.Path(__file__).resolve().parent.parent, type=pathlib.Path)
    root = parser.parse_args().root
    kinds = builtin_kinds(root)
    if len(kinds) < 8:
        sys.exit(f"check-op-switches: found only {len(kinds)} OpKind enumerators in include/tessera/graph.hpp")
    limit = len(kinds) // 4
    problems = []
    files = 0
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".cc", ".hpp", ".h", ".cpp"):
                continue
            files += 1
            named = set(CASE.findall(path.read_text())) & kinds
            if len(named) > limit:
                problems.append(f"{path.relative_to(root)}: `case OpKind::` names {len(named)} of the "
                                f"{len(kinds)} op kinds (at most {limit}); dispatch through the op table "
                                f"(lib/op_def.hpp) or the kernel table (simdevice/kernel_table.hpp) instead")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"op switches: {len(problems)} file(s) switch over the op kinds")
        return 1
    print(f"op switches: ok ({files} files, {len(kinds)} op kinds, at most {limit} named per file)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
