"""How many replicas tinyhal-serve wants: the rule the HorizontalPodAutoscaler applies.

A replica's load is the work it holds now: invocations running plus requests queued,
over all its models (`tinyhal_inference_in_flight` + `tinyhal_inference_queued`, the
metric deploy/kubernetes/hpa-prometheus-adapter.yaml serves as `tinyhal_inference_load`).
CPU is the wrong signal for a server whose cost is per request and whose queue is bounded:
a replica at full CPU with an empty queue needs no help, one whose queue grows does.

The decision is Kubernetes' HPA algorithm for an `AverageValue` Pods metric, so the same
numbers decide in tests, in `local.sh` operators' scripts and in the cluster:

    desired = ceil(replicas * mean load / target)   unless |mean load / target - 1| <= 0.1

clamped to [min, max], and lowered by at most `scale_down_step` replicas at a time (the
manifest's `behavior.scaleDown` policy: one pod a minute, each leaving pod drains first).
Kubernetes also waits out a stabilisation window before scaling down; that is time, not
arithmetic, and stays with the caller.

    python -m tinyhal.server.autoscale [--target 4 --min 2 --max 10] URL [URL...]

prints one JSON line: each replica's load and the replica count wanted (URLs are the
replicas' `host:port`; their `/metrics` is read).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Policy", "desired_replicas", "replica_load", "scrape_load"]

LOAD_METRICS = ("tinyhal_inference_in_flight", "tinyhal_inference_queued")


@dataclass(frozen=True)
class Policy:
    """The HPA's settings (deploy/kubernetes/hpa-prometheus-adapter.yaml's values)."""

    target: float = 4.0  # spec.metrics[0].pods.target.averageValue
    min_replicas: int = 2
    max_replicas: int = 10
    tolerance: float = 0.1  # kube-controller-manager's --horizontal-pod-autoscaler-tolerance
    scale_down_step: int = 1  # behavior.scaleDown.policies: Pods 1

    def __post_init__(self) -> None:
        if not (self.target > 0 and math.isfinite(self.target)):
            raise ValueError(f"target load must be a positive number, not {self.target}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= min ({self.min_replicas}) <= max "
                             f"({self.max_replicas}) replicas")
        if self.scale_down_step < 1 or not 0 <= self.tolerance < 1:
            raise ValueError("scale_down_step must be >= 1 and tolerance in [0, 1)")


def replica_load(exposition: str) -> float:
    """Invocations running + requests queued in one replica's `/metrics` text."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(exposition):
        if family.name in LOAD_METRICS:
            total += sum(sample.value for sample in family.samples)
    return total


def scrape_load(address: str, timeout: float = 5.0) -> float:
    """`replica_load` of the replica at `host:port` (or an http:// URL)."""
    url = address if "://" in address else f"http://{address}"
    with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout) as resp:
        return replica_load(resp.read().decode())


def desired_replicas(loads: Sequence[float], policy: Policy = Policy()) -> int:
    """The replica count wanted, given each current (ready) replica's load."""
    current = len(loads)
    if current == 0:
        return policy.min_replicas
    if any(not (load >= 0 and math.isfinite(load)) for load in loads):
        raise ValueError(f"loads must be finite and >= 0: {list(loads)}")
    ratio = sum(loads) / current / policy.target
    desired = current if abs(ratio - 1) <= policy.tolerance else math.ceil(ratio * current)
    desired = max(desired, current - policy.scale_down_step)
    return min(max(desired, policy.min_replicas), policy.max_replicas)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tinyhal.server.autoscale",
                                description="The replica count the HPA rule asks for.")
    p.add_argument("replicas", nargs="+", metavar="HOST:PORT")
    defaults = Policy()
    p.add_argument("--target", type=float, default=defaults.target,
                   help="load per replica aimed at (default %(default)g)")
    p.add_argument("--min", type=int, default=defaults.min_replicas, dest="min_replicas")
    p.add_argument("--max", type=int, default=defaults.max_replicas, dest="max_replicas")
    args = p.parse_args(argv)
    try:
        policy = Policy(args.target, args.min_replicas, args.max_replicas)
        loads = [scrape_load(address) for address in args.replicas]
    except (ValueError, OSError) as exc:
        print(f"autoscale: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"loads": dict(zip(args.replicas, loads)),
                      "replicas": len(loads), "desired": desired_replicas(loads, policy)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
