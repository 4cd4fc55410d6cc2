#!/usr/bin/python3
"""Writes daemonsets.yaml: one pagealloc DaemonSet per GPU index.

    deploy/kubernetes/render_daemonsets.py > deploy/kubernetes/daemonsets.yaml

Why one DaemonSet per GPU index: the daemon must own one physical GPU and
serve it at /run/pagealloc/gpuN.sock, N being the host's GPU index (the same
layout as deploy/systemd). A DaemonSet runs one pod per node, so each index
gets its own DaemonSet, placed by node affinity only on nodes with more than
N GPUs (the nvidia.com/gpu.count label of NVIDIA GPU Feature Discovery). A
pod with one container per GPU would need the node's GPU count in the pod
spec, and restarting one GPU's daemon would not be separate from the others.
deploy_kubernetes_test checks that daemonsets.yaml is this script's output.
"""

import sys

MAX_GPUS = 8
IMAGE = "pagealloc:0.1.0"
UID = 10464  # deploy/docker/Dockerfile's pagealloc user and group

TEMPLATE = """\
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: pagealloc-gpu{gpu}
  namespace: pagealloc
  labels:
    app.kubernetes.io/name: pagealloc
    pagealloc.io/gpu: "{gpu}"
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: pagealloc
      pagealloc.io/gpu: "{gpu}"
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  template:
    metadata:
      labels:
        app.kubernetes.io/name: pagealloc
        pagealloc.io/gpu: "{gpu}"
    spec:
      # No hostIPC or hostPID: a session's ring and the pool's completion
      # counter (CUDA virtual memory) reach schedulers in other pods as file
      # descriptors over the memory socket in the shared socket directory.
      # The NVIDIA runtime injects the driver; NVIDIA_VISIBLE_DEVICES=all
      # (below) shows every GPU with the host's indices, so --gpu={gpu} is
      # the host's GPU {gpu}. We do not request nvidia.com/gpu: that would
      # take the GPU away from the schedulers that use it.
      runtimeClassName: nvidia
      priorityClassName: system-node-critical
      terminationGracePeriodSeconds: 30
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - key: nvidia.com/gpu.count
                    operator: Gt
                    values: ["{gpu}"]
      tolerations:
        - key: nvidia.com/gpu
          operator: Exists
          effect: NoSchedule
      securityContext:
        runAsNonRoot: true
        runAsUser: {uid}
        runAsGroup: {uid}
        seccompProfile:
          type: RuntimeDefault
      initContainers:
        # hostPath directories are created root-owned; the daemon (uid
        # {uid}) must create its socket there and schedulers in group {uid}
        # must reach it.
        - name: socket-dir
          image: {image}
          command: ["install", "-d", "-o", "{uid}", "-g", "{uid}", "-m", "0770", "/run/pagealloc"]
          securityContext:
            runAsNonRoot: false
            runAsUser: 0
            allowPrivilegeEscalation: false
            capabilities:
              drop: ["ALL"]
              add: ["CHOWN", "FOWNER"]
          volumeMounts:
            - name: run-pagealloc
              mountPath: /run/pagealloc
      containers:
        - name: pagealloc
          image: {image}
          args:
            - --gpu={gpu}
            - --backend=cuda
            - --listen=unix:///run/pagealloc/gpu{gpu}.sock
            - --metrics_port=9464
            # The pod's own address, which kubelet probes and Prometheus
            # scrapes (the daemon's default is loopback).
            - --metrics_host=$(POD_IP)
            - --page_size=16
            - --num_pages=65536
          env:
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            - name: NVIDIA_VISIBLE_DEVICES
              value: all
          ports:
            # Each pod has its own network namespace, so every GPU's daemon
            # uses 9464 (on systemd hosts it is 9464 + N).
            - name: metrics
              containerPort: 9464
              protocol: TCP
          # Liveness: the HTTP /healthz on the metrics port (200 serving, 503
          # draining), cheap and served by the daemon itself; kubelet's
          # native grpc probe would need a TCP gRPC listener, which we do not
          # open. Readiness: a real GetStats over the Unix socket the
          # schedulers use, so a pod is ready only when its socket answers.
          startupProbe:
            httpGet:
              path: /healthz
              port: metrics
            periodSeconds: 2
            failureThreshold: 30
          livenessProbe:
            httpGet:
              path: /healthz
              port: metrics
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 3
          readinessProbe:
            exec:
              command: ["/usr/local/bin/pagealloc-cli", "--target=unix:///run/pagealloc/gpu{gpu}.sock", "stats"]
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 2
          # The batcher is latency-critical: a CPU request, no CPU limit (CFS
          # throttling would stall launches). Memory is small: the pool's
          # bookkeeping (40 bytes of host memory a page, docs/operations.md)
          # and a host mirror per session's ring.
          resources:
            requests:
              cpu: 500m
              memory: 256Mi
            limits:
              memory: 1Gi
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: ["ALL"]
          volumeMounts:
            - name: run-pagealloc
              mountPath: /run/pagealloc
      volumes:
        # Shared with the scheduler pods of this node (see
        # scheduler-pod-example.yaml).
        - name: run-pagealloc
          hostPath:
            path: /run/pagealloc
            type: DirectoryOrCreate
"""


def render():
    header = ("# Generated by deploy/kubernetes/render_daemonsets.py; edit that "
              "and re-run.\n")
    return header + "".join(TEMPLATE.format(gpu=gpu, image=IMAGE, uid=UID)
                            for gpu in range(MAX_GPUS))


if __name__ == "__main__":
    sys.stdout.write(render())
