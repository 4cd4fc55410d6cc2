#!/usr/bin/python3
"""Figures and lists the documents and the deployment files state about
each other, checked against their one source:

1. The fast channel's AllocDecode(256) p50 that README.md and
   docs/integration.md quote is the one in docs/performance.md's current
   end-to-end table ("fast channel, sync"), and its gRPC figure the
   daemon's AllocDecode(256) p50 of the default run in "gRPC's own floor".
2. docs/operations.md's list of the dashboard's rows names every row of
   deploy/grafana/pagealloc.json, in order.
3. The host memory a page that deploy/kubernetes/daemonsets.yaml sizes
   its memory by is docs/operations.md's (the --num_pages row).

Run from the runfiles root (Bazel's sh_test working directory).
"""
import json
import re
import sys

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def read(path):
    with open(path) as f:
        return f.read()


def table_row(text, first_cell):
    """The cells of the first table row whose first cell is `first_cell`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    return None


def main():
    performance = read("docs/performance.md")
    end_to_end = performance.split("## The daemon end to end", 1)[1]
    fast = table_row(end_to_end, "fast channel, sync")
    check(fast, "docs/performance.md has no fast channel sync row under "
          "'The daemon end to end'")
    echo_floor = end_to_end.split("#### gRPC's own floor", 1)[-1]
    grpc = table_row(echo_floor, "A=1")  # the default, 256 requests first
    check(grpc and len(grpc) > 7, "docs/performance.md has no default row "
          "(A=1) in \"gRPC's own floor\"")
    if fast and grpc and len(grpc) > 7:
        p50, grpc_p50 = fast[1], grpc[7]
        readme = " ".join(read("README.md").split())
        check("AllocDecode of 256 requests: %s us p50" % p50 in readme,
              "README.md does not quote performance.md's %s us" % p50)
        integration = " ".join(read("docs/integration.md").split())
        check("%s us p50 for a 256-request decode step" % p50 in integration
              and "instead of %s us over gRPC" % grpc_p50 in integration,
              "docs/integration.md does not quote performance.md's "
              "%s / %s us" % (p50, grpc_p50))

    operations = read("docs/operations.md")
    dashboard = json.loads(read("deploy/grafana/pagealloc.json"))
    rows = [p["title"] for p in dashboard["panels"] if p.get("type") == "row"]
    listed = operations.split("## Dashboard", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^- \*\*(.+?)\*\*:", listed, re.MULTILINE)
    check(documented == rows, "docs/operations.md lists the dashboard rows "
          "%s; the dashboard has %s" % (documented, rows))

    per_page = re.search(r"bookkeeping \((\d+) bytes of host memory a page\)",
                         operations)
    check(per_page, "docs/operations.md states no host bytes a page")
    daemonsets = " ".join(
        line.strip().lstrip("# ")
        for line in read("deploy/kubernetes/daemonsets.yaml").splitlines())
    stated = set(re.findall(r"(\d+) bytes of host memory a page", daemonsets))
    if per_page:
        check(stated == {per_page.group(1)},
              "daemonsets.yaml states %s bytes a page; docs/operations.md "
              "%s" % (sorted(stated), per_page.group(1)))

    for failure in failures:
        print("FAIL:", failure)
    if failures:
        sys.exit(1)
    print("docs_consistency_test: OK")


if __name__ == "__main__":
    main()
