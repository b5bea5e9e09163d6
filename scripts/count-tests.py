#!/usr/bin/env python3
"""Counts the test results of one or more `meson test` runs.

Every test executable is a doctest program: the summary line it prints,
"[doctest] test cases: N | P passed | F failed | S skipped", gives the test
cases it ran (a test that prints several, e.g. one per process, counts them
all). A pytest run (the Python module's suite) counts likewise by its final
line, "===== P passed, F failed, S skipped in T s =====": its passed (and
xfailed, xpassed) tests passed, its failed ones and errors failed, skipped
ones neither. A test without either line (it crashed or timed out before the summary,
or is not a doctest program) counts as one test, passed or failed by its
result; a skipped one counts neither way. A test whose process failed
although doctest reported no failed case (e.g. a sanitizer report at exit)
counts one failure more. A check given with --check (such as building the
embedding sample) counts as one test, and so does a log that is missing (its
build failed before the tests ran).

usage: count-tests.py [--label TEXT] [--quiet] [--check NAME=ok|fail]... [TESTLOG]...

TESTLOG is a meson-logs/testlog.json. Prints each failure, then one line
"LABEL: N passed, M failed" (LABEL defaults to "tests"). Exits with 1 when
anything failed.
"""

import argparse
import json
import re
import sys

SUMMARY = re.compile(r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed")
PYTEST_SUMMARY = re.compile(r"^=+ (\d+ [a-z]+(?:, \d+ [a-z]+)*) in [0-9.]+s(?: \([0-9:.]+\))? =+$", re.M)
PYTEST_COUNT = re.compile(r"(\d+) ([a-z]+)")
PYTEST_PASSED = {"passed", "xfailed", "xpassed"}
PYTEST_FAILED = {"failed", "error", "errors"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PASSING_RESULTS = {"OK", "EXPECTEDFAIL"}
NEUTRAL_RESULTS = {"SKIP"}  # neither passed nor failed


def pytest_summaries(output):
    """(total, passed, failed) of each pytest summary line in `output`."""
    found = []
    for line in PYTEST_SUMMARY.findall(output):
        counts = [(int(n), word) for n, word in PYTEST_COUNT.findall(line)]
        passed = sum(n for n, word in counts if word in PYTEST_PASSED)
        failed = sum(n for n, word in counts if word in PYTEST_FAILED)
        found.append((passed + failed, passed, failed))
    return found


def count_log(path, failures):
    """Returns (passed, failed) for one testlog.json."""
    passed = failed = 0
    try:
        with open(path, encoding="utf-8") as log:
            lines = [line for line in log if line.strip()]
    except OSError as error:
        failures.append(f"{path}: no test log ({error.strerror})")
        return 0, 1
    for line in lines:
        test = json.loads(line)
        name = test.get("name", "?")
        result = test.get("result", "ERROR")
        output = ANSI.sub("", (test.get("stdout") or "") + "\n" + (test.get("stderr") or ""))
        summaries = SUMMARY.findall(output) + pytest_summaries(output)
        if summaries:
            test_passed = sum(int(p) for _, p, _ in summaries)
            test_failed = sum(int(f) for _, _, f in summaries)
            if result not in PASSING_RESULTS | NEUTRAL_RESULTS and test_failed == 0:
                test_failed = 1
        elif result in NEUTRAL_RESULTS:
            test_passed, test_failed = 0, 0
        elif result in PASSING_RESULTS:
            test_passed, test_failed = 1, 0
        else:
            test_passed, test_failed = 0, 1
        if test_failed:
            failures.append(f"{name}: {result}, {test_failed} failed")
        passed += test_passed
        failed += test_failed
    return passed, failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="tests")
    parser.add_argument("--quiet", action="store_true", help="print the count line only")
    parser.add_argument("--check", action="append", default=[], metavar="NAME=ok|fail")
    parser.add_argument("logs", nargs="*", metavar="TESTLOG")
    args = parser.parse_args()

    passed = failed = 0
    failures = []
    for path in args.logs:
        log_passed, log_failed = count_log(path, failures)
        passed += log_passed
        failed += log_failed
    for check in args.check:
        name, _, outcome = check.rpartition("=")
        if outcome == "ok":
            passed += 1
        else:
            failed += 1
            failures.append(f"{name or check}: failed")

    if not args.quiet:
        for failure in failures:
            print(f"FAILED {failure}")
    print(f"{args.label}: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
