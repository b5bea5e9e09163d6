#!/usr/bin/env python3
"""Checks that the library's includes point one way (README.md: Repository layout).

Every #include of the library's folders and of the public headers is
resolved to the folder that owns the included file, and must name a folder
that the including file's folder may depend on:

    folder      may include
    lib         lib
    popdist     lib, popdist
    optimizers  lib, optimizers
    simdevice   lib, simdevice
    onnx        lib, onnx
    sessions    lib, popdist, optimizers, simdevice, onnx, sessions
    app         lib, popdist, optimizers, simdevice, onnx, sessions, app
    python      lib, popdist, optimizers, simdevice, onnx, sessions, app, python

python/ (the Python module) is a binding of the public API: besides its own
files it may include the public headers only, never a folder's private
header.

A file of a folder (lib/, sessions/transforms/, ...) belongs to that folder,
and a public header to the folder it is filed under:
include/tessera/FOLDER/NAME.hpp belongs to FOLDER (the folder whose .cc files
implement it; a header-only one is filed with the concept it describes).
Since the public headers are checked like the folders' own files, what a
file includes indirectly is checked too, one include at a time. A public
header outside those subfolders is an error, so that a new header is given a
folder when it is added.

Allowed exceptions, one include each (FOLDER HEADER: why):

    simdevice popdist/communicator: the collectives of a multi-instance run
        talk through the Communicator interface, which popdist implements

"tessera/FOLDER/X" (quoted or in angle brackets) is include/tessera/FOLDER/X. Another
quoted include is looked up beside the including file, then in the folders
(their private headers, as the internal dependencies of the meson.build files
expose them); one found nowhere is a system header and is not checked, nor
are other angle-bracket includes. tests/, samples/ and bench/ are not
checked: they may use every folder.

Usage: check-layering.py [--root DIR]. Prints each wrong-way include as
FILE:LINE: the include, the folder it reaches and what the file's folder may
include, then one summary line; exits 1 when there is one.
"""

import argparse
import pathlib
import re
import sys

FOLDERS = ("lib", "popdist", "optimizers", "simdevice", "onnx", "sessions", "app", "python")
# Folders that may reach the others through the public headers only.
PUBLIC_ONLY = ("python",)
SOURCE_SUFFIXES = (".cc", ".cpp", ".hpp", ".h")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


# The tables are read from the docstring above, so that what the header says
# is what the check does.
def doc_block(title):
    """The indented lines of the docstring after the line ending in `title`."""
    lines = __doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith(title)) + 1
    while not lines[start].strip():
        start += 1
    block = []
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        block.append(line)
    return block


def rows(block):
    """FOLDER -> words of its row; indented lines continue the row above."""
    table, folder = {}, None
    for line in block:
        if not line.strip():
            continue
        if line.startswith("     "):
            table[folder].extend(line.split())
        else:
            folder, *words = line.split()
            table[folder] = list(words)
    return table


def allowed_table():
    table = rows(doc_block("may include"))
    return {folder: {word.rstrip(",") for word in words} for folder, words in table.items()}


def exceptions():
    found = set()
    for line in doc_block("(FOLDER HEADER: why):"):
        words = line.split()
        if len(words) >= 2 and words[1].endswith(":") and not line.startswith("     "):
            found.add((words[0], f"include/tessera/{words[1][:-1]}.hpp"))
    return found


def owner_of(relative):
    """The folder a checkout-relative path belongs to: include/tessera/FOLDER/... to
    FOLDER, FOLDER/... to FOLDER; None for anything else."""
    parts = relative.split("/")
    if parts[:2] == ["include", "tessera"]:
        folder = parts[2] if len(parts) > 3 else None
        return folder if folder in FOLDERS and folder not in PUBLIC_ONLY else None
    return parts[0] if parts[0] in FOLDERS else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent,
                        help="the checkout (default: the one holding this script)")
    root = parser.parse_args().root.resolve()

    allowed, allowed_headers = allowed_table(), exceptions()
    if set(allowed) != set(FOLDERS):
        sys.exit(f"scripts/check-layering.py: its table must name the folders {', '.join(FOLDERS)} only")
    problems = []

    public = sorted(p.relative_to(root).as_posix() for p in (root / "include/tessera").rglob("*")
                    if p.suffix in SOURCE_SUFFIXES and p.is_file())
    for header in public:
        if owner_of(header) is None:
            problems.append(f"{header}: a public header of no folder; move it to include/tessera/FOLDER/ "
                            f"(FOLDER one of {', '.join(f for f in FOLDERS if f not in PUBLIC_ONLY)}: "
                            f"the folder whose .cc files implement it)")
    for folder, header in sorted(allowed_headers):
        if header not in public:
            problems.append(f"scripts/check-layering.py: the exception of {folder} names {header}, "
                            f"which does not exist")

    def resolve(including, kind, name):
        """The checkout-relative path an include names; None for a system header."""
        if name.startswith("tessera/"):
            return f"include/{name}"
        if kind == "<":
            return None
        candidates = [including.parent / name] + [root / folder / name for folder in FOLDERS]
        for candidate in candidates:
            if candidate.is_file() and candidate.resolve().is_relative_to(root):
                return candidate.resolve().relative_to(root).as_posix()
        return None

    files = [root / header for header in public if owner_of(header) is not None]
    for folder in FOLDERS:
        files += sorted(p for p in (root / folder).rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file())

    count = 0
    for path in files:
        relative = path.relative_to(root).as_posix()
        folder = owner_of(relative)
        with path.open(encoding="utf-8") as text:
            for number, line in enumerate(text, 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                count += 1
                kind, name = match.groups()
                target = resolve(path, kind, name)
                if target is None:
                    continue
                reached = owner_of(target)
                if target.startswith("include/") and reached is None:
                    problems.append(f"{relative}:{number}: {line.strip()} names no public header")
                    continue
                if (folder in PUBLIC_ONLY and reached not in (None, folder)
                        and not target.startswith("include/")):
                    problems.append(f"{relative}:{number}: {line.strip()} is a private header of {reached} "
                                    f"({target}); {folder} may include the public headers only")
                    continue
                if reached is None or reached in allowed[folder] or (folder, target) in allowed_headers:
                    continue
                problems.append(f"{relative}:{number}: {line.strip()} reaches {reached} ({target}); "
                                f"{folder} may include only {', '.join(sorted(allowed[folder]))}")

    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"layering: {len(problems)} wrong-way include(s) or table error(s); the header of "
              f"scripts/check-layering.py gives the folders and what each may include", file=sys.stderr)
        return 1
    print(f"layering: ok ({count} includes of {len(files)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
