#!/usr/bin/env python3
"""Sums the test cases in Bazel's test.xml files into one line.

  test_summary.py [--label L] [--append FILE] [--newer-than MARKER] TESTLOGS
  test_summary.py --label L --check-exit STATUS [--append FILE]
                                a pass that is not a Bazel test (a format
                                check, a build): one case, passed if STATUS
                                is 0
  test_summary.py --total FILE                           the passes summed

Prints "L: N passed, N failed, N skipped" so that a CI reader sees how many
test cases ran, not only how many Bazel targets passed.
"""
import argparse
import pathlib
import xml.etree.ElementTree as ET


def count(root: pathlib.Path, newer_than: float):
    passed = failed = skipped = 0
    for xml in root.rglob("test.xml"):
        if xml.stat().st_mtime < newer_than:
            continue  # a result from an earlier pass or run
        try:
            tree = ET.parse(xml)
        except ET.ParseError:
            failed += 1
            continue
        cases = list(tree.iter("testcase"))
        if not cases:  # a test without cases (sh_test): its suite's result
            suite = tree.getroot()
            bad = int(suite.get("failures", 0) or 0) + int(suite.get("errors", 0) or 0)
            failed += 1 if bad else 0
            passed += 0 if bad else 1
        for case in cases:
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.get("result") == "skipped" or case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    return passed, failed, skipped


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("testlogs", nargs="?", default="bazel-testlogs")
    parser.add_argument("--label", default="summary")
    parser.add_argument("--append")
    parser.add_argument("--total")
    parser.add_argument("--newer-than", help="count only results written after this file")
    parser.add_argument("--check-exit", type=int,
                        help="count one case with this exit status instead of test.xml files")
    args = parser.parse_args()
    if args.total:
        totals = [0, 0, 0]
        for line in pathlib.Path(args.total).read_text().splitlines():
            for i, value in enumerate(line.split()):
                totals[i] += int(value)
        print(f"summary: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
        return 0
    if args.check_exit is not None:
        passed, failed, skipped = (1, 0, 0) if args.check_exit == 0 else (0, 1, 0)
    else:
        since = pathlib.Path(args.newer_than).stat().st_mtime if args.newer_than else 0
        passed, failed, skipped = count(pathlib.Path(args.testlogs), since)
    print(f"{args.label}: {passed} passed, {failed} failed, {skipped} skipped")
    if args.append:
        with open(args.append, "a") as out:
            out.write(f"{passed} {failed} {skipped}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
