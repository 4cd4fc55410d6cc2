#!/usr/bin/env python3
"""Sums the test cases of a Bazel test run into one line, and lists the
skipped cases with their reasons.

  test_summary.py --events BEP.json [--label L] [--append FILE] [--skips]
                  [--skip-log FILE]
                                the run's test targets, cached or not: the
                                test.xml of each test target
                                in Bazel's build event file
                                (--build_event_json_file)
  test_summary.py --label L --check-exit STATUS [--append FILE]
                                a pass that is not a Bazel test (a format
                                check, a build): one case, passed if STATUS
                                is 0
  test_summary.py --total FILE  the passes summed

Prints "L: N passed, N failed, N skipped" so that a reader sees how many
test cases ran, not only how many Bazel targets passed; with --skips, then
one line per skipped case: its target, its name and why it skipped.
--skip-log appends those lines, labelled, to FILE (.ci/run lists them all
again at its end).

Every test target of the run counts, whether Bazel ran it or took its
result from the cache: the build event file names each target's result
files either way. A target without test.xml (an sh_test whose script
writes none) counts as one case, passed or failed by Bazel's status; a
target that failed to build counts as one failed case.
"""
import argparse
import json
import pathlib
import sys
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET


class Counts:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0
        self.skips = []  # (target, case, reason)
        self.failures = []  # (target, case)
        self.durations = {}  # target -> seconds its uncached runs took

    def line(self, label):
        return (f"{label}: {self.passed} passed, {self.failed} failed, "
                f"{self.skipped} skipped")


def _path(uri):
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme != "file":
        return None
    return pathlib.Path(urllib.request.url2pathname(parsed.path))


def _reason(case):
    skipped = case.find("skipped")
    text = ""
    if skipped is not None:
        text = skipped.get("message") or (skipped.text or "")
    # GoogleTest's message is "file:line\nreason" and may end with its
    # "Google Test trace:" lines: keep the reason.
    text = text.split("Google Test trace:", 1)[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and ":" in lines[0] and " " not in lines[0]:
        lines = lines[1:]
    return " ".join(lines) or "(no reason given)"


def count_xml(target, xml, passed_status, counts):
    """Adds the cases of one test.xml; False when it cannot be read."""
    try:
        tree = ET.parse(xml)
    except (ET.ParseError, OSError):
        return False
    cases = list(tree.iter("testcase"))
    if not cases:  # a test without cases (sh_test): its status
        if passed_status:
            counts.passed += 1
        else:
            counts.failed += 1
            counts.failures.append((target, "(the whole test)"))
        return True
    for case in cases:
        name = ".".join(filter(None, (case.get("classname"), case.get("name"))))
        if case.find("failure") is not None or case.find("error") is not None:
            counts.failed += 1
            counts.failures.append((target, name))
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            counts.skipped += 1
            counts.skips.append((target, name, _reason(case)))
        else:
            counts.passed += 1
    return True


def count_events(events_file):
    """The cases of every test target in a build event file: the last
    attempt of each run and shard."""
    results = {}  # (label, run, shard) -> (attempt, status, outputs)
    durations = {}  # label -> seconds its runs took, this invocation only
    unbuilt = []
    for line in pathlib.Path(events_file).read_text().splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        ident = event.get("id", {})
        if "testResult" in ident:
            key = ident["testResult"]
            result = event.get("testResult", {})
            outputs = {o.get("name"): o.get("uri", "")
                       for o in result.get("testActionOutput", [])}
            where = (key.get("label"), key.get("run", 1), key.get("shard", 1))
            attempt = key.get("attempt", 1)
            # A result from the disk cache (.bazelrc) is cached remotely.
            cached = result.get("cachedLocally") or result.get(
                "executionInfo", {}).get("cachedRemotely")
            if not cached:
                durations[where[0]] = durations.get(where[0], 0.0) + int(
                    result.get("testAttemptDurationMillis", 0)) / 1000.0
            if where not in results or results[where][0] < attempt:
                results[where] = (attempt, result.get("status"), outputs)
        elif "testSummary" in ident:
            status = event.get("testSummary", {}).get("overallStatus")
            if status in ("FAILED_TO_BUILD", "NO_STATUS"):
                unbuilt.append(ident["testSummary"].get("label"))
    counts = Counts()
    counts.durations = durations
    for (label, _, _), (_, status, outputs) in sorted(results.items()):
        passed = status == "PASSED"
        xml = _path(outputs.get("test.xml", ""))
        if xml is not None and count_xml(label, xml, passed, counts):
            continue
        if passed:
            counts.passed += 1
        else:
            counts.failed += 1
            counts.failures.append((label, "(the whole test: %s)" % status))
    for label in unbuilt:
        if not any(where[0] == label for where in results):
            counts.failed += 1
            counts.failures.append((label, "(not built)"))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", help="Bazel's --build_event_json_file")
    parser.add_argument("--label", default="summary")
    parser.add_argument("--append")
    parser.add_argument("--total")
    parser.add_argument("--skips", action="store_true",
                        help="list each skipped case with its reason")
    parser.add_argument("--skip-log",
                        help="append the skipped cases, labelled, to this file")
    parser.add_argument("--slowest", type=int, default=0,
                        help="list the N test targets that ran longest "
                        "(summed over runs and shards; cached ones not)")
    parser.add_argument("--check-exit", type=int,
                        help="count one case with this exit status instead")
    args = parser.parse_args()
    if args.total:
        totals = [0, 0, 0]
        for line in pathlib.Path(args.total).read_text().splitlines():
            for i, value in enumerate(line.split()):
                totals[i] += int(value)
        print(f"summary: {totals[0]} passed, {totals[1]} failed, "
              f"{totals[2]} skipped")
        return 0
    counts = Counts()
    if args.check_exit is not None:
        if args.check_exit == 0:
            counts.passed = 1
        else:
            counts.failed = 1
    elif args.events:
        try:
            counts = count_events(args.events)
        except (OSError, ValueError) as error:
            print(f"{args.label}: cannot read {args.events}: {error}",
                  file=sys.stderr)
            counts.failed = 1
    else:
        parser.error("--events, --check-exit or --total")
    print(counts.line(args.label))
    for target, case in counts.failures:
        print(f"  failed: {target} {case}")
    if args.skips and counts.skips:
        print(f"{args.label}: skipped, with their reasons:")
        for target, case, reason in counts.skips:
            print(f"  {target} {case}: {reason}")
    if args.slowest and counts.durations:
        print(f"{args.label}: the slowest test targets, seconds:")
        ranked = sorted(counts.durations.items(), key=lambda item: -item[1])
        for target, seconds in ranked[:args.slowest]:
            print(f"  {seconds:8.1f}  {target}")
    if args.skip_log and counts.skips:
        with open(args.skip_log, "a") as out:
            for target, case, reason in counts.skips:
                out.write(f"  {args.label}: {target} {case}: {reason}\n")
    if args.append:
        with open(args.append, "a") as out:
            out.write(f"{counts.passed} {counts.failed} {counts.skipped}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
