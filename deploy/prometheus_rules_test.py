#!/usr/bin/python3
"""Checks deploy/prometheus/alerts.yml and its Prometheus Operator form.

1. `promtool check rules` accepts alerts.yml.
2. `promtool test rules` passes alerts_test.yml, and that file tests every
   alert three ways: quiet before its condition has held long enough,
   firing, and resolved after (an evaluation with no alert, one with an
   alert, then one with none again).
3. Every rule has a severity, a summary, a description and a runbook_url:
   the docs/operations.md page on GitHub with the alert's own anchor, and
   that anchor is a heading of docs/operations.md (named after the alert)
   whose section says what to do.
4. deploy/kubernetes/prometheusrule.yaml is render_prometheusrule.py's
   output, its spec parses to exactly alerts.yml's rules, and promtool
   accepts that spec as a rule file.
"""

import os
import re
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, "deploy/kubernetes")
import render_prometheusrule  # noqa: E402

ALERTS = "deploy/prometheus/alerts.yml"
ALERTS_TEST = "deploy/prometheus/alerts_test.yml"
RULE = "deploy/kubernetes/prometheusrule.yaml"
OPERATIONS = "docs/operations.md"
RUNBOOK_BASE = (
    "https://github.com/pagealloc/pagealloc/blob/main/docs/operations.md#")
PROMTOOL = "/usr/bin/promtool"

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def promtool(*args):
    result = subprocess.run([PROMTOOL, *args], capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


def github_anchor(heading):
    """The anchor GitHub gives a Markdown heading: lower case, punctuation
    other than '-' and '_' dropped, spaces as '-'."""
    anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return anchor.replace(" ", "-")


def sections(markdown):
    """Heading anchor -> (heading text, the section's text up to the next
    heading of any level)."""
    found = {}
    current = None
    for line in markdown.splitlines():
        match = re.match(r"^#+ (.*)$", line)
        if match:
            current = github_anchor(match.group(1))
            found[current] = (match.group(1), [])
        elif current is not None:
            found[current][1].append(line)
    return {k: (h, "\n".join(body)) for k, (h, body) in found.items()}


def alert_rules(rule_file):
    return [rule for group in rule_file["groups"] for rule in group["rules"]
            if "alert" in rule]


def check_unit_tests(alerts, tests):
    """Each alert: an evaluation without it, then with it, then without."""
    evaluations = {}
    for test in tests["tests"]:
        for case in test.get("alert_rule_test", []):
            seconds = parse_duration(case["eval_time"])
            evaluations.setdefault(case["alertname"], []).append(
                (seconds, bool(case.get("exp_alerts"))))
    for name in alerts:
        cases = sorted(evaluations.get(name, []))
        quiet_before = [t for t, firing in cases if not firing]
        firing = [t for t, firing in cases if firing]
        ok = (firing and any(t < firing[0] for t in quiet_before)
              and any(t > firing[-1] for t in quiet_before))
        check(ok, f"{ALERTS_TEST}: {name} needs an evaluation before it "
                  f"fires, one where it fires and one after it resolved; "
                  f"has {cases}")
    for name in evaluations:
        check(name in alerts, f"{ALERTS_TEST} tests unknown alert {name}")


def parse_duration(text):
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", text))


def main():
    status, output = promtool("check", "rules", ALERTS)
    check(status == 0, f"promtool check rules {ALERTS}:\n{output}")
    status, output = promtool("test", "rules", ALERTS_TEST)
    check(status == 0 and "SUCCESS" in output,
          f"promtool test rules {ALERTS_TEST}:\n{output}")

    rule_file = yaml.safe_load(open(ALERTS))
    rules = alert_rules(rule_file)
    names = [rule["alert"] for rule in rules]
    check(len(names) >= 4, f"{ALERTS}: only {names}")
    check(len(set(names)) == len(names), f"{ALERTS}: duplicate alert names")
    check_unit_tests(names, yaml.safe_load(open(ALERTS_TEST)))

    doc = sections(open(OPERATIONS).read())
    for rule in rules:
        name = rule["alert"]
        check(rule.get("labels", {}).get("severity") in ("warning", "critical"),
              f"{name}: severity must be warning or critical")
        annotations = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            check(annotations.get(key), f"{name}: no annotations.{key}")
        url = annotations.get("runbook_url", "")
        anchor = url[len(RUNBOOK_BASE):]
        check(url.startswith(RUNBOOK_BASE) and anchor == name.lower(),
              f"{name}: runbook_url {url} is not {RUNBOOK_BASE}{name.lower()}")
        if anchor not in doc:
            check(False, f"{name}: {OPERATIONS} has no heading for #{anchor}")
            continue
        heading, body = doc[anchor]
        check(heading == name, f"{name}: its runbook heading is '{heading}'")
        check("What to do" in body and "Resolves" in body,
              f"{name}: its runbook section lacks 'What to do' or 'Resolves'")

    rendered = render_prometheusrule.render(open(ALERTS).read())
    check(open(RULE).read() == rendered,
          f"{RULE} differs from render_prometheusrule.py's output; re-run it")
    resource = yaml.safe_load(open(RULE))
    check(resource["apiVersion"] == "monitoring.coreos.com/v1"
          and resource["kind"] == "PrometheusRule",
          f"{RULE}: not a monitoring.coreos.com/v1 PrometheusRule")
    check(resource["spec"] == rule_file,
          f"{RULE}: spec is not alerts.yml's rules")
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as spec:
        yaml.safe_dump(resource["spec"], spec)
        spec.flush()
        status, output = promtool("check", "rules", spec.name)
        check(status == 0, f"promtool check rules on {RULE}'s spec:\n{output}")

    for failure in failures:
        print("FAIL:", failure)
    if failures:
        return 1
    print(f"OK: {len(rules)} alerts checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
