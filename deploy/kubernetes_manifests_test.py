#!/usr/bin/python3
"""Validates deploy/kubernetes/*.yaml.

No Kubernetes schema validator is packaged for Debian 12 (kubeconform and
kubeval are not; `apt-cache search` finds neither) and the suite is offline,
so this checks, with PyYAML (python3-yaml), what a schema would not: that
the pieces fit together. Every document has apiVersion, kind, metadata.name
and the pagealloc namespace; selectors match the pod labels; probes and
Service/PodMonitor ports name container ports; every mounted volume exists;
the daemon flags are the server's (from the real binary's --helpfull), its
socket lies in the shared hostPath and matches the readiness probe; no pod
asks for hostIPC or hostPID (memory goes by file descriptor); the uid and group match the Dockerfile's; the PodMonitor's
job label is the one the alert rules use; daemonsets.yaml is
render_daemonsets.py's output. Usage: kubernetes_manifests_test.py SERVER.
"""

import glob
import re
import subprocess
import sys

import yaml

sys.path.insert(0, "deploy/kubernetes")
import render_daemonsets  # noqa: E402

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def server_flags(server):
    out = subprocess.run([server, "--helpfull"], capture_output=True,
                         text=True).stdout
    return set(re.findall(r"^\s+--([a-z_]+) \(", out, re.M))


def check_pod_spec(where, spec):
    check(not spec.get("hostIPC"), f"{where}: hostIPC must be off")
    check(not spec.get("hostPID"), f"{where}: hostPID must be off")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    check(volumes.get("run-pagealloc", {}).get("hostPath", {}).get("path")
          == "/run/pagealloc", f"{where}: no hostPath /run/pagealloc volume")
    for container in spec.get("initContainers", []) + spec["containers"]:
        name = f"{where}/{container['name']}"
        check(container.get("image"), f"{name}: no image")
        mounts = {m["mountPath"]: m["name"] for m in
                  container.get("volumeMounts", [])}
        for path, volume in mounts.items():
            check(volume in volumes, f"{name}: mounts unknown volume {volume}")
        check(mounts.get("/run/pagealloc") == "run-pagealloc",
              f"{name}: does not mount the socket directory")
        resources = container.get("resources", {})
        if container in spec["containers"]:
            check(resources.get("requests") and resources.get("limits"),
                  f"{name}: needs resource requests and limits")
        ports = {p["name"]: p["containerPort"]
                 for p in container.get("ports", [])}
        for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = container.get(probe_name)
            if probe is None:
                continue
            http = probe.get("httpGet")
            if http:
                port = http["port"]
                check(port in ports or port in ports.values(),
                      f"{name}.{probe_name}: port {port} is not a "
                      f"container port {ports}")
    sc = spec.get("securityContext", {})
    if sc.get("runAsUser") is not None:
        check(sc["runAsUser"] != 0 and sc.get("runAsNonRoot") is True,
              f"{where}: must run as non-root")


def main():
    server = sys.argv[1]
    flags = server_flags(server)
    check("listen" in flags, f"--helpfull parsing found {flags}")
    dockerfile = open("deploy/docker/Dockerfile").read()
    uid = int(re.search(r"^USER (\d+):(\d+)", dockerfile, re.M).group(1))
    check(render_daemonsets.UID == uid,
          f"manifests use uid {render_daemonsets.UID}, Dockerfile {uid}")
    check(open("deploy/kubernetes/daemonsets.yaml").read()
          == render_daemonsets.render(),
          "daemonsets.yaml differs from render_daemonsets.py's output; "
          "re-run it")

    docs = []
    for path in sorted(glob.glob("deploy/kubernetes/*.yaml")):
        for doc in yaml.safe_load_all(open(path)):
            if doc is not None:
                docs.append((path, doc))
    kinds = {}
    for path, doc in docs:
        where = f"{path}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        for field in ("apiVersion", "kind"):
            check(isinstance(doc.get(field), str), f"{where}: no {field}")
        check(doc.get("metadata", {}).get("name"), f"{where}: no metadata.name")
        if doc["kind"] != "Namespace":
            check(doc["metadata"].get("namespace") == "pagealloc",
                  f"{where}: not in namespace pagealloc")
        kinds.setdefault(doc["kind"], []).append((where, doc))

    daemonsets = kinds.get("DaemonSet", [])
    check(len(daemonsets) == render_daemonsets.MAX_GPUS,
          f"{len(daemonsets)} DaemonSets")
    pod_labels = []
    container_ports = set()
    for where, ds in daemonsets:
        check(ds["apiVersion"] == "apps/v1", f"{where}: apiVersion")
        template = ds["spec"]["template"]
        labels = template["metadata"]["labels"]
        pod_labels.append(labels)
        selector = ds["spec"]["selector"]["matchLabels"]
        check(selector.items() <= labels.items(),
              f"{where}: selector {selector} does not match labels {labels}")
        spec = template["spec"]
        check_pod_spec(where, spec)
        gpu = labels["pagealloc.io/gpu"]
        check(ds["metadata"]["name"] == f"pagealloc-gpu{gpu}",
              f"{where}: name does not say GPU {gpu}")
        terms = spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchExpressions"][0]
        check(terms["operator"] == "Gt" and terms["values"] == [gpu],
              f"{where}: must need more than {gpu} GPUs on the node")
        (daemon,) = spec["containers"]
        args = daemon["args"]
        for arg in args:
            check(arg.startswith("--") and arg[2:].split("=")[0] in flags,
                  f"{where}: {arg} is not a pagealloc-server flag")
        check(f"--gpu={gpu}" in args, f"{where}: not --gpu={gpu}")
        socket = f"unix:///run/pagealloc/gpu{gpu}.sock"
        check(f"--listen={socket}" in args, f"{where}: does not listen on {socket}")
        readiness = daemon["readinessProbe"]["exec"]["command"]
        check(f"--target={socket}" in readiness,
              f"{where}: readiness probe asks another socket: {readiness}")
        check("--metrics_host=$(POD_IP)" in args,
              f"{where}: metrics not on the pod's address (the daemon "
              f"defaults to loopback, which kubelet cannot probe): {args}")
        pod_ip = [e for e in daemon.get("env", []) if e["name"] == "POD_IP"]
        check(pod_ip and pod_ip[0].get("valueFrom", {}).get("fieldRef", {})
              .get("fieldPath") == "status.podIP",
              f"{where}: POD_IP is not the downward API's status.podIP")
        metrics = [a for a in args if a.startswith("--metrics_port=")]
        ports = {p["name"]: p["containerPort"] for p in daemon["ports"]}
        check(metrics and int(metrics[0].split("=")[1]) == ports.get("metrics"),
              f"{where}: --metrics_port {metrics} vs container port {ports}")
        container_ports.update(ports)

    for where, svc in kinds.get("Service", []):
        selector = svc["spec"]["selector"]
        check(all(selector.items() <= l.items() for l in pod_labels),
              f"{where}: selector {selector} misses daemon pods")
        for port in svc["spec"]["ports"]:
            check(port["targetPort"] in container_ports,
                  f"{where}: targetPort {port['targetPort']} not a container port")
    monitors = kinds.get("PodMonitor", [])
    check(monitors, "no PodMonitor")
    alerts = open("deploy/prometheus/alerts.yml").read()
    for where, pm in monitors:
        check(pm["apiVersion"] == "monitoring.coreos.com/v1", f"{where}: apiVersion")
        selector = pm["spec"]["selector"]["matchLabels"]
        check(all(selector.items() <= l.items() for l in pod_labels),
              f"{where}: selector {selector} misses daemon pods")
        for endpoint in pm["spec"]["podMetricsEndpoints"]:
            check(endpoint["port"] in container_ports,
                  f"{where}: port {endpoint['port']} not a container port")
            job = [r["replacement"] for r in endpoint.get("relabelings", [])
                   if r.get("targetLabel") == "job"]
            check(job and f'job="{job[0]}"' in alerts,
                  f"{where}: job label {job} is not the alerts' job")
    for where, pod in kinds.get("Pod", []):
        spec = pod["spec"]
        check_pod_spec(where, spec)
        check(uid in spec["securityContext"].get("supplementalGroups", []),
              f"{where}: not in group {uid}: the 0660 sockets refuse it")

    for failure in failures:
        print("FAIL:", failure)
    if failures:
        return 1
    print(f"OK: {len(docs)} documents checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
