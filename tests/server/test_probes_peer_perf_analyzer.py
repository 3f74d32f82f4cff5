"""perf_analyzer's modes against tinyhal-serve (Triton's own load generator, a C++
client: what it parses of metadata, configuration, answers and /metrics must be what
Triton serves). Opt-in: it runs only when `TINYHAL_PERF_ANALYZER` names the binary
(with its libraries on `LD_LIBRARY_PATH`); otherwise it is skipped, saying so."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from serve_helpers import sample_server

pytestmark = pytest.mark.timeout(600)

PERF_ANALYZER = os.environ.get("TINYHAL_PERF_ANALYZER", "")

# (what it checks, arguments): every mode stays short; -s 100 takes any window as stable
# (the machine may be shared: the figures are not what is tested)
_MODES = [
    ("synchronous, batch 4", ["-m", "mlp_classifier", "-b", "4"]),
    ("zero input data, batch 8", ["-m", "mlp_classifier", "--input-data", "zero", "-b", "8"]),
    ("random input data, async, concurrency 4",
     ["-m", "mlp_classifier", "--input-data", "random", "--async", "--concurrency-range", "4"]),
    ("shapes of a model with dynamic dims",
     ["-m", "saxpy", "--shape", "alpha:1", "--shape", "x:16", "--shape", "y:16"]),
    ("request rate, p95", ["-m", "mlp_classifier", "--request-rate-range", "200",
                           "--percentile", "95"]),
    ("request rate, async", ["-m", "mlp_classifier", "--request-rate-range", "200",
                             "--async"]),
]


@pytest.mark.skipif(not PERF_ANALYZER, reason="opt-in: set TINYHAL_PERF_ANALYZER to the "
                                              "perf_analyzer binary")
def test_perf_analyzer_modes_against_the_server(tmp_path):
    data = tmp_path / "input.json"
    data.write_text(json.dumps({"data": [{"features": {"content": [0.5] * 16,
                                                       "shape": [16]}}]}))
    modes = [*_MODES, ("JSON input data", ["-m", "mlp_classifier", "--input-data",
                                           str(data)])]
    with sample_server(tmp_path / "repo", ("mlp_classifier", "saxpy"),
                       "--model-control-mode", "explicit", "--load-model", "*") as server:
        # collecting metrics from our /metrics: it warns that there is no GPU, and runs
        modes.append(("metrics collected from /metrics",
                      ["-m", "mlp_classifier", "--collect-metrics", "--metrics-url",
                       f"{server.url}/metrics", "--metrics-interval", "200"]))
        for what, arguments in modes:
            run = subprocess.run(
                [PERF_ANALYZER, "-u", server.url, "-i", "http", "--measurement-interval",
                 "500", "-s", "100", "--max-trials", "5", *arguments],
                capture_output=True, text=True, timeout=120)
            out = run.stdout + run.stderr
            assert run.returncode == 0 and "Throughput:" in out, (what, out[-3000:])
            assert "error" not in out.lower().replace("nv_gpu", ""), (what, out[-3000:])
        # shared memory is not offered: refused naming the extension, nothing runs
        run = subprocess.run([PERF_ANALYZER, "-u", server.url, "-i", "http", "-m",
                              "mlp_classifier", "--shared-memory", "system"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode != 0
        assert "the system shared memory extension is not offered" in run.stdout + run.stderr
        assert server.request("GET", "/v2/health/ready")[0] == 200
