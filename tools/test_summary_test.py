#!/usr/bin/python3
"""tools/test_summary.py on a build event file as Bazel writes it
(--build_event_json_file): every test target counts, cached or not, the
last attempt of a flaky one, a target that failed to build, and each
skipped case is listed with its reason (GoogleTest's and pytest's XML)."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

GTEST_XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="3" failures="0" disabled="0" errors="0" name="AllTests">
  <testsuite name="KernelTest" tests="3" failures="0" skipped="2">
    <testcase name="Decode" status="run" result="completed" classname="KernelTest" />
    <testcase name="Extend" status="run" result="skipped" classname="KernelTest">
      <skipped message="tests/gpu/kernel_test.cc:40&#x0A;no CUDA device: cudaErrorNoDevice"><![CDATA[tests/gpu/kernel_test.cc:40
no CUDA device: cudaErrorNoDevice]]></skipped>
    </testcase>
    <testcase name="Free" status="run" result="skipped" classname="KernelTest">
      <skipped message="tests/gpu/kernel_test.cc:41&#x0A;no CUDA device: cudaErrorNoDevice&#x0A;Google Test trace:&#x0A;tests/gpu/kernel_test.cc:30: seed 7" />
    </testcase>
  </testsuite>
</testsuites>
"""

PYTEST_XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="3">
<testcase classname="test_client" name="test_alloc" time="0.1" />
<testcase classname="test_client" name="test_cuda_slots" time="0.0"><skipped type="pytest.skip" message="the CUDA backend only">/x/test_client.py:80: the CUDA backend only</skipped></testcase>
<testcase classname="test_client" name="test_close" time="0.1"><failure message="assert 1 == 2">...</failure></testcase>
</testsuite></testsuites>
"""

# An sh_test's XML as Bazel writes it when the script writes none.
SH_XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="tools/bazelw_test" tests="1" failures="0" errors="0">
<testcase name="tools/bazelw_test" status="run" duration="1" time="1"></testcase>
</testsuite></testsuites>
"""


def result(label, xml, status, attempt=1, cached=False, remote=False,
           millis=1000):
    return {"id": {"testResult": {"label": label, "run": 1, "shard": 1,
                                  "attempt": attempt,
                                  "configuration": {"id": "c"}}},
            "testResult": {"status": status, "cachedLocally": cached,
                           "executionInfo": {"cachedRemotely": remote},
                           "testAttemptDurationMillis": millis,
                           "testActionOutput": [
                               {"name": "test.log", "uri": "file://" + xml + ".log"},
                               {"name": "test.xml", "uri": "file://" + xml}]}}


def main():
    tool = sys.argv[1]
    scratch = pathlib.Path(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")))
    files = {}
    for name, text in (("gtest", GTEST_XML), ("pytest", PYTEST_XML),
                       ("sh", SH_XML), ("flaky1", PYTEST_XML),
                       ("flaky2", SH_XML)):
        files[name] = scratch / (name + ".xml")
        files[name].write_text(text)
    events = [
        {"id": {"started": {}}, "started": {}},
        result("//tests/gpu:kernel_test", str(files["gtest"]), "PASSED",
               cached=True),
        result("//python:client_test", str(files["pytest"]), "FAILED"),
        # From the disk cache: counted, but not among the slowest.
        result("//tools:bazelw_test", str(files["sh"]), "PASSED", remote=True,
               millis=90000),
        # A flaky test: its last attempt counts.
        result("//tests:flaky_test", str(files["flaky1"]), "FAILED", 1),
        result("//tests:flaky_test", str(files["flaky2"]), "PASSED", 2),
        {"id": {"testSummary": {"label": "//tests:broken_test"}},
         "testSummary": {"overallStatus": "FAILED_TO_BUILD"}},
    ]
    bep = scratch / "events.json"
    bep.write_text("".join(json.dumps(e) + "\n" for e in events))
    counts = scratch / "counts"
    skip_log = scratch / "skips"
    out = subprocess.run(
        [sys.executable, tool, "--events", str(bep), "--label", "suite",
         "--skips", "--append", str(counts), "--skip-log", str(skip_log),
         "--slowest", "8"],
        capture_output=True, text=True, check=True).stdout
    print(out)
    lines = out.splitlines()
    # gtest 1 + pytest 1 + sh 1 + flaky (last attempt) 1 passed; the pytest
    # failure and the unbuilt target failed; 3 skipped.
    assert lines[0] == "suite: 4 passed, 2 failed, 3 skipped", lines[0]
    assert "  failed: //python:client_test test_client.test_close" in lines
    assert "  failed: //tests:broken_test (not built)" in lines
    assert "suite: skipped, with their reasons:" in lines
    assert ("  //tests/gpu:kernel_test KernelTest.Extend: no CUDA device: "
            "cudaErrorNoDevice") in lines, out
    assert ("  //tests/gpu:kernel_test KernelTest.Free: no CUDA device: "
            "cudaErrorNoDevice") in lines, out
    assert ("  //python:client_test test_client.test_cuda_slots: the CUDA "
            "backend only") in lines, out
    # Only the runs of this invocation rank: the cached ones took no time.
    slowest = lines[lines.index("suite: the slowest test targets, seconds:")
                    + 1:]
    ranked = [line.split()[1] for line in slowest if line.startswith("    ")]
    assert "//tools:bazelw_test" not in ranked, out
    assert "//tests/gpu:kernel_test" not in ranked, out
    assert "//python:client_test" in ranked, out
    assert counts.read_text() == "4 2 3\n"
    assert skip_log.read_text().splitlines()[0] == (
        "  suite: //python:client_test test_client.test_cuda_slots: the CUDA "
        "backend only"), skip_log.read_text()
    total = subprocess.run([sys.executable, tool, "--total", str(counts)],
                           capture_output=True, text=True, check=True).stdout
    assert total == "summary: 4 passed, 2 failed, 3 skipped\n", total
    print("test_summary_test: OK")


if __name__ == "__main__":
    main()
