"""The Kubernetes files of `ops/deploy/render.py`: the settings and setup Job, a Deployment
and KEDA ScaledObject per type, and the history process's Deployment."""

from __future__ import annotations

from ops.deploy.options import (
    CONTAINER_HISTORY_DIR,
    GENERATED,
    HISTORY_COMMAND,
    HISTORY_STOP_GRACE_S,
    HISTORY_UNIT,
    STOP_GRACE_S,
    Options,
    command,
    q,
    slug,
)
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.naming import worker_group


def k8s_config(opts: Options) -> str:
    return f"""\
# {GENERATED}.
# Settings for every worker (the database URL and any password go in the Secret
# `stream-jobs`, made by you:
#   kubectl create secret generic stream-jobs \\
#     --from-literal=STREAM_JOBS_DATABASE_URL=postgresql://user:pass@db:5432/stream_jobs)
apiVersion: v1
kind: ConfigMap
metadata:
  name: stream-jobs
data:
  STREAM_JOBS_KAFKA_BOOTSTRAP: {q(opts.bootstrap)}
  STREAM_JOBS_TOPIC_PREFIX: {q(opts.prefix)}
  STREAM_JOBS_TOPICS_DIR: /app/topics
  STREAM_JOBS_LOG_LEVEL: INFO
---
# Run once per release, before the workers: make Kafka match topics/ and migrate.
apiVersion: batch/v1
kind: Job
metadata:
  name: stream-jobs-setup
spec:
  backoffLimit: 3
  template:
    spec:
      restartPolicy: OnFailure
      containers:
        - name: setup
          image: {q(opts.image)}
          command: ["sh", "-c", "stream-jobs topics apply && stream-jobs db migrate"]
          envFrom:
            - configMapRef:
                name: stream-jobs
            - secretRef:
                name: stream-jobs
"""


def k8s_history(opts: Options) -> str:
    """The history process's Deployment: one replica, never two at once."""
    return f"""\
# {GENERATED}.
# The history process of prefix {opts.prefix} (`stream-jobs history`): it folds the workers'
# reports into windows in Postgres, exactly once (the brokers must allow transactions).
# One replica: a second would only wait as a standby (the reports topic has one
# partition); Recreate stops the old pod before a rollout starts the new one. A crash
# exits 1 and the kubelet starts the container again, which is safe: its state is in Kafka.
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {HISTORY_UNIT}
  labels:
    app.kubernetes.io/name: {HISTORY_UNIT}
spec:
  replicas: 1
  strategy:
    type: Recreate
  selector:
    matchLabels:
      app.kubernetes.io/name: {HISTORY_UNIT}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: {HISTORY_UNIT}
    spec:
      restartPolicy: Always
      terminationGracePeriodSeconds: {HISTORY_STOP_GRACE_S}  # it stops within a second
      securityContext:
        runAsNonRoot: true
        runAsUser: 10001  # the image's `worker` user (ops/deploy/Dockerfile)
      containers:
        - name: history
          image: {q(opts.image)}
          command: {q(HISTORY_COMMAND)}
          envFrom:
            - configMapRef:
                name: stream-jobs
            - secretRef:
                name: stream-jobs
          env:
            - name: STREAM_JOBS_HISTORY_DATA_DIR
              value: {CONTAINER_HISTORY_DIR}
          volumeMounts:
            - name: history-data
              mountPath: {CONTAINER_HISTORY_DIR}
          # 97 MB idle (measured); its tables are in memory, ~8 MB a type for a week.
          resources:
            requests:
              cpu: 100m
              memory: 256Mi
            limits:
              memory: 512Mi
      volumes:
        # faust-streaming's small local files: scratch space, its state is in Kafka.
        - name: history-data
          emptyDir: {{}}
"""


def k8s_type(policy: JobTypePolicy, opts: Options) -> str:
    """The type's Deployment, and the KEDA ScaledObject that scales it on its lag."""
    labels = [
        "app.kubernetes.io/name: stream-jobs-worker",
        f"stream-jobs/job-type: {q(policy.job_type)}",
    ]
    return _k8s_deployment(policy, opts, labels) + "---\n" + _k8s_scaler(policy, opts, labels)


def _indented(lines: list[str], by: int) -> str:
    return "\n".join(" " * by + line for line in lines)


def _k8s_deployment(policy: JobTypePolicy, opts: Options, labels: list[str]) -> str:
    group = worker_group(opts.prefix, policy.job_type)
    name = f"stream-jobs-worker-{slug(policy.job_type)}"
    label_text, selector = _indented(labels, 4), _indented(labels, 6)
    pod_labels = _indented(labels, 8)
    return f"""\
# {GENERATED}.
# Job type {policy.job_type}: its handlers (group {group}) and its delay relay.
# One type per Deployment, so KEDA scales each type on its own lag (docs/deploying.md).
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  labels:
{label_text}
spec:
  replicas: 1  # KEDA sets the count from here on
  selector:
    matchLabels:
{selector}
  template:
    metadata:
      labels:
{pod_labels}
    spec:
      # SIGTERM drains: in-flight jobs get their grace period, offsets are committed.
      terminationGracePeriodSeconds: {STOP_GRACE_S}
      securityContext:
        runAsNonRoot: true
        runAsUser: 10001  # the image's `worker` user (ops/deploy/Dockerfile)
      containers:
        - name: worker
          image: {q(opts.image)}
          command: {q(command(opts, policy))}
          envFrom:
            - configMapRef:
                name: stream-jobs
            - secretRef:
                name: stream-jobs
          resources:
            requests:
              cpu: 500m
              memory: 256Mi
            limits:
              memory: 512Mi
"""


def _k8s_scaler(policy: JobTypePolicy, opts: Options, labels: list[str]) -> str:
    group = worker_group(opts.prefix, policy.job_type)
    name = f"stream-jobs-worker-{slug(policy.job_type)}"
    label_text = _indented(labels, 4)
    triggers = []
    for topic in policy.lane_topics(opts.prefix).values():
        triggers += [
            "    - type: kafka",
            "      metadata:",
            f"        bootstrapServers: {q(opts.bootstrap)}",
            f"        consumerGroup: {q(group)}",
            f"        topic: {q(topic)}",
            f"        lagThreshold: {q(str(opts.lag_threshold))}",
            # A group that never committed has all of the lane to do (the worker reads
            # from the earliest offset too).
            "        offsetResetPolicy: earliest",
        ]
    trigger_text = "\n".join(triggers)
    return f"""\
# Scales the Deployment on the lag of {group}, lane by lane
# (the most any lane asks for): about one replica per {opts.lag_threshold} jobs waiting,
# between 1 and the partition count.
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {name}
  labels:
{label_text}
spec:
  scaleTargetRef:
    name: {name}
  # Never zero: the worker also runs the type's delay relay, whose backlog is not lane lag.
  minReplicaCount: 1
  maxReplicaCount: {policy.partitions}
  pollingInterval: 15
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        scaleDown:
          # Each change is a group rebalance: shrink one replica a minute at most.
          stabilizationWindowSeconds: 300
          policies:
            - type: Pods
              value: 1
              periodSeconds: 60
  triggers:
{trigger_text}
"""
