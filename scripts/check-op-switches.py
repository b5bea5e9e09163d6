#!/usr/bin/env python3
"""Checks that no source file of the library switches over every op kind or op type.

Ops are defined by their families (docs/adding-an-op.md): shape inference,
autodiff, the executor and the time model read the op and kernel tables, so a
new op touches its family's two files. A switch that lists the op kinds one
by one would have to grow with every op again. A file may still name a few
kinds in `case OpKind::` labels (the sources, the collectives of one family),
but one that names more than a quarter of the built-in kinds is reported.

The ONNX importer maps its op types the same way: each family's file
onnx/ops/<family>.cc registers table entries (onnx/op_mapping.hpp) that
Importer::mapNode dispatches through. So a chain of op-type string
comparisons (`op == "Relu"`, `node.op_type() != "Constant"`, `opType == ...`,
`kind == ...` or `type == ...` against a capitalised string literal) is
counted per file too: a file outside onnx/ops/ with more than
MAX_OP_TYPE_COMPARISONS of them is reported (the importer's single mapping
function had 238). onnx/const_eval.cc is exempt: it folds constant subgraphs
at import, one evaluator per op type over known values, which the mapping
table does not describe (docs/adding-an-op.md).

Usage: check-op-switches.py [--root DIR]. Prints each offending file with the
number of kinds it names, then one summary line; exits 1 when there is one.
"""

import argparse
import pathlib
import re
import sys

FOLDERS = ("lib", "popdist", "optimizers", "simdevice", "onnx", "sessions", "app")
CASE = re.compile(r"case\s+OpKind::(\w+)")
OP_TYPE_COMPARISON = re.compile(r"\b(?:op|opType|op_type\(\)|kind|type)\s*[!=]=\s*\"[A-Z]\w*\"")
MAX_OP_TYPE_COMPARISONS = 10
# Folders whose files may compare op types freely, and files exempt by name.
OP_TYPE_FOLDERS = ("onnx/ops",)
OP_TYPE_EXEMPT = ("onnx/const_eval.cc",)
ENUMERATOR = re.compile(r"^\s*(\w+)\s*(?:=\s*\w+\s*)?,", re.MULTILINE)


def builtin_kinds(root):
    text = (root / "include/tessera/lib/graph.hpp").read_text()
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
        sys.exit(f"check-op-switches: found only {len(kinds)} OpKind enumerators in include/tessera/lib/graph.hpp")
    limit = len(kinds) // 4
    problems = []
    files = 0
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".cc", ".hpp", ".h", ".cpp"):
                continue
            files += 1
            text = path.read_text()
            relative = path.relative_to(root).as_posix()
            named = set(CASE.findall(text)) & kinds
            if len(named) > limit:
                problems.append(f"{path.relative_to(root)}: `case OpKind::` names {len(named)} of the "
                                f"{len(kinds)} op kinds (at most {limit}); dispatch through the op table "
                                f"(lib/op_def.hpp) or the kernel table (simdevice/kernel_table.hpp) instead")
            if relative in OP_TYPE_EXEMPT or any(relative.startswith(f + "/") for f in OP_TYPE_FOLDERS):
                continue
            comparisons = len(OP_TYPE_COMPARISON.findall(text))
            if comparisons > MAX_OP_TYPE_COMPARISONS:
                problems.append(f"{relative}: {comparisons} op-type string comparisons (at most "
                                f"{MAX_OP_TYPE_COMPARISONS}); map ONNX op types through the table of "
                                f"onnx/op_mapping.hpp, in the family's onnx/ops/<family>.cc")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"op switches: {len(problems)} file(s) switch over the op kinds or compare op types")
        return 1
    print(f"op switches: ok ({files} files, {len(kinds)} op kinds, at most {limit} named per file, at most "
          f"{MAX_OP_TYPE_COMPARISONS} op-type comparisons outside onnx/ops/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
