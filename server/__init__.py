"""tinyhal.server: `tinyhal-serve`, a KServe V2 (Open Inference Protocol) REST daemon.

- `protocol`   V2 JSON and binary tensors: parsing and response building (pure functions)
- `repository` the model repository (`DIR/<model>/<version>/model.vmfb` + config.json)
- `admission`  bounded concurrency, bounded queue, deadlines
- `metrics`    Prometheus metrics, above all peak device memory
- `app`        the Starlette (ASGI) routes
- `main`       the CLI: hypercorn on trio, model loading, SIGTERM drain
- `models/`    bundled sample models (and the script that builds them)
"""
