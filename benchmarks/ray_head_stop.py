"""How long stopping a private Ray head takes (``executors.ray.cluster.start_head`` / ``stop_head``), as the Ray
executor does at ``close()`` — with the product's environment, and with Ray's own SIGTERM drain (``--drain``).

`ray start` drains its node for up to 30 s on SIGTERM. ``stop_head`` signals the head's whole process group, so
the GCS the drain asks is already gone and the drain's RPC waits out the whole 30 s; the product's head runs with
``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0`` (``ray_cluster.NO_DRAIN``) instead. Every tuner of the Ray executor
without ``ray_address`` stops one head; CI's Ray tests stop five.

    python benchmarks/ray_head_stop.py [--repeats N] [--drain]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from executors.ray import cluster as ray_cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--drain", action="store_true", help="Ray's default: drain for up to 30 s on SIGTERM")
    args = ap.parse_args()
    if args.drain:
        ray_cluster.NO_DRAIN = {}
    took = []
    for _ in range(args.repeats):
        run_dir = Path(tempfile.mkdtemp(prefix="ray-head-stop-"))
        head, _address = ray_cluster.start_head(run_dir, logical_gpus=1)
        t0 = time.monotonic()
        ray_cluster.stop_head(head)
        took.append(time.monotonic() - t0)
        print(f"stop_head: {took[-1]:.1f} s", flush=True)
    print(f"{'drain (Ray default)' if args.drain else 'no drain (product)'}: median {statistics.median(took):.1f} s "
          f"over {len(took)} (min {min(took):.1f}, max {max(took):.1f})")


if __name__ == "__main__":
    main()
