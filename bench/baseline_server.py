"""The server a user would write instead of tinyhal-serve: FastAPI + uvicorn, a plain `def`
route calling iree.runtime (local-task) on the same .vmfb, JSON in and out.

    pip install '.[bench]'
    python bench/baseline_server.py MODEL.vmfb --port 8001
"""

import sys

import iree.runtime as rt
import numpy as np
import uvicorn
from fastapi import FastAPI

module = rt.load_vm_flatbuffer_file(sys.argv[1], driver="local-task")
app = FastAPI()


@app.post("/v2/models/mlp_classifier/infer")
def infer(request: dict) -> dict:
    x = request["inputs"][0]
    features = np.asarray(x["data"], np.float32).reshape(x["shape"])
    probs, cls = (r.to_host() for r in module.predict(features))
    return {"model_name": "mlp_classifier", "outputs": [
        {"name": "probabilities", "datatype": "FP32", "shape": list(probs.shape),
         "data": probs.ravel().tolist()},
        {"name": "class", "datatype": "INT32", "shape": list(cls.shape), "data": cls.tolist()}]}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[sys.argv.index("--port") + 1]),
                log_level="warning")
