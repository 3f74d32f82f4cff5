"""tinyhal.server: `tinyhal-serve`, a KServe V2 (Open Inference Protocol) REST daemon.

- `protocol`   V2 JSON and binary tensors: parsing and response building (pure functions)
- `repository` the model repository (`DIR/<model>/<version>/model.vmfb` + config.json)
- `admission`  bounded concurrency, bounded queue, deadlines
- `metrics`    Prometheus metrics, above all peak device memory
- `http`       HTTP/1.1: httptools (llhttp) on trio streams, keep-alive, drain
- `app`        the V2 routes (`Server.handle`)
- `main`       the CLI: listeners, model loading, SIGTERM drain, exit codes
- `models/`    bundled sample models (and the script that builds them)
"""
