#!/usr/bin/env python3
"""Sums the GoogleTest cases in Bazel's test.xml files into one line.

Prints "summary: N passed, N failed, N skipped" so that a CI reader sees how
many test cases ran, not only how many Bazel test targets passed.
"""
import pathlib
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bazel-testlogs")
    passed = failed = skipped = 0
    for xml in root.rglob("test.xml"):
        try:
            tree = ET.parse(xml)
        except ET.ParseError:
            failed += 1
            continue
        for case in tree.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.get("result") == "skipped" or case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    print(f"summary: {passed} passed, {failed} failed, {skipped} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
