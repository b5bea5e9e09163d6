#!/usr/bin/env python3
"""Checks the links and commands of README.md and docs/*.md.

usage: check-docs.py [SOURCE_ROOT]

Links: every relative link [text](PATH) or [text](PATH#ANCHOR) outside code
must name a file or folder of the checkout, and its ANCHOR a heading of that
Markdown file (GitHub's anchors: lower case, punctuation dropped, spaces as
hyphens, -1, -2, ... for repeated headings); [text](#ANCHOR) a heading of the
same file. Links with a scheme (https:, mailto:) are not followed.

Commands: every command of a ```sh or ```bash block, and every line starting
with "$ " in any code block, must start with a program that exists: a known
system command, a file of the checkout, or a program the build makes
(BUILD_DIR/FOLDER/NAME where FOLDER/meson.build builds NAME, as
build-release/samples/tessera/tessera). Arguments that name a file of the
checkout (samples/..., tests/..., scripts/..., bench/..., docs/...) must
exist. The commands are not run.

Prints one line per problem, FILE:LINE: what is wrong, then a count line;
exits with 1 when anything is wrong.
"""

import pathlib
import re
import shlex
import sys

# Programs the documents may start a command with, besides the checkout's
# own files and build outputs: Debian's, as scripts/setup.sh installs them.
SYSTEM_COMMANDS = {
    "apt-get", "bash", "c++", "cat", "cd", "clang++", "cp", "echo", "env", "export", "g++", "git",
    "gzip", "kill", "ln", "ls", "meson", "mkdir", "mpirun", "ninja", "pkg-config", "python3", "rm",
    "sed", "sh", "taskset", "time", "timeout", "valgrind", "/usr/bin/time", "/usr/bin/python3",
}
# Folders of the checkout whose paths in a command's arguments are checked.
REPO_FOLDERS = ("samples/", "tests/", "scripts/", "bench/", "docs/", "include/", "lib/", "sessions/",
                "app/", "simdevice/", "onnx/", "popdist/", "optimizers/", ".ci/")

FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"(?<!\\)!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)


def slug(heading):
    text = re.sub(r"`", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def blocks(lines):
    """Yields (line number, text, language or None when outside code) per line."""
    fence = None
    language = None
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence, language = match.group(2), match.group(3).lower()
            continue
        if fence is not None and line.strip().startswith(fence[0] * len(fence)) and \
                line.strip().strip(fence[0]) == "":
            fence = None
            continue
        yield number, line, (language if fence is not None else None)


def anchors(path, cache={}):
    if path not in cache:
        seen = {}
        found = set()
        for _, line, language in blocks(path.read_text(encoding="utf-8").splitlines()):
            match = HEADING.match(line) if language is None else None
            if not match:
                continue
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        cache[path] = found
    return cache[path]


def prose(lines):
    """The text outside code blocks and inline code, with its line numbers kept."""
    kept = [line if language is None else "" for _, line, language in blocks(lines)]
    text = "\n".join(kept)
    # Inline code may not cross a blank line; keep the newlines it spans.
    return INLINE_CODE.sub(lambda m: "\n" * m.group(0).count("\n") if "\n\n" not in m.group(0) else m.group(0),
                           text)


def check_links(root, path, lines, problems):
    text = prose(lines)
    count = 0
    for match in LINK.finditer(text):
        target = match.group(1)
        line = text.count("\n", 0, match.start()) + 1
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue
        count += 1
        file_part, _, anchor = target.partition("#")
        where = f"{path.relative_to(root)}:{line}"
        destination = path if file_part == "" else (path.parent / file_part).resolve()
        if file_part.startswith("/"):
            problems.append(f"{where}: {target}: an absolute path; link relative to the file")
            continue
        if not destination.exists():
            problems.append(f"{where}: {target}: no such file")
            continue
        try:
            destination.relative_to(root)
        except ValueError:
            problems.append(f"{where}: {target}: outside the checkout")
            continue
        if anchor:
            if destination.suffix != ".md" or destination.is_dir():
                problems.append(f"{where}: {target}: an anchor into a file that is not Markdown")
            elif anchor not in anchors(destination):
                problems.append(f"{where}: {target}: no heading with anchor #{anchor} in "
                                f"{destination.relative_to(root)}")
    return count


def commands(lines):
    """Yields (line number, command) for the shell commands of code blocks."""
    pending, start = "", 0
    for number, line, language in blocks(lines):
        if language is None:
            pending = ""
            continue
        if language in ("sh", "bash", "shell"):
            text = line
        elif line.startswith("$ "):
            text = line[2:]
        elif pending:
            text = line
        else:
            continue
        if not pending:
            start = number
        text = text.split(" #", 1)[0] if not text.lstrip().startswith("#") else ""
        if text.rstrip().endswith("\\"):
            pending += text.rstrip()[:-1] + " "
            continue
        command = (pending + text).strip()
        pending = ""
        if command:
            yield start, command


def built_program(root, word):
    """Whether `word` is BUILD_DIR/FOLDER/NAME of a program the build makes."""
    parts = pathlib.PurePosixPath(word).parts
    if len(parts) < 3 or not parts[0].startswith("build"):
        return False
    folder = root.joinpath(*parts[1:-1])
    build_file = folder / "meson.build"
    return build_file.is_file() and re.search(r"executable\(\s*'" + re.escape(parts[-1]) + "'",
                                              build_file.read_text(encoding="utf-8")) is not None


def check_command(root, where, command, problems):
    try:
        words = shlex.split(command)
    except ValueError as error:
        problems.append(f"{where}: {command}: cannot be split into words ({error})")
        return
    # Split at the shell's separators; each part starts with its own program.
    parts, current = [], []
    for word in words:
        if word in ("&&", "||", ";", "|"):
            parts.append(current)
            current = []
        else:
            current.append(word)
    parts.append(current)
    for part in parts:
        while part and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", part[0]):
            part = part[1:]  # VAR=value before the program
        if not part:
            continue
        program = part[0]
        if program in SYSTEM_COMMANDS:
            pass
        elif "/" in program and not program.startswith("/") and \
                ((root / program).exists() or built_program(root, program)):
            pass
        else:
            problems.append(f"{where}: {command}: `{program}` is neither a known system command, a file "
                            f"of the checkout nor a program the build makes")
        for word in part[1:]:
            path = word.split("=", 1)[-1]
            if path.startswith(REPO_FOLDERS) and not re.search(r"[A-Z]{2,}|\.\.\.|[*?]", path) and \
                    not (root / path).exists() and not built_program(root, path):
                problems.append(f"{where}: {command}: {path}: no such file in the checkout")


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent).resolve()
    documents = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    problems = []
    links = checked = 0
    for path in documents:
        lines = path.read_text(encoding="utf-8").splitlines()
        links += check_links(root, path, lines, problems)
        for number, command in commands(lines):
            checked += 1
            check_command(root, f"{path.relative_to(root)}:{number}", command, problems)
    for problem in problems:
        print(problem)
    print(f"check-docs: {len(documents)} documents, {links} links, {checked} commands, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
