"""The model zoo: transformer and recurrent networks built in code with seeded weights.

Each builder writes an ONNX graph (opset 17) with onnx's helper API, in the form
PyTorch's exporter gives these architectures (`LSTM`/`GRU` nodes for the recurrent
layers, MatMul/Softmax/LayerNormalization for attention); `zoo_vmfb(name)` imports it with
the pinned `iree-import-onnx` and compiles it for this host, both cached by content hash.

These are the programs that are more than a few big kernels: IREE turns them into tens
to hundreds of small dispatches per call, recorded into one-shot command buffers (the
recurrent ones loop over time steps in the VM), so the host path per HAL operation is
what they measure.

`ZOO` maps a model's name to a `ZooModel`: its ONNX builder, the exported function's
name and seeded inputs. `small=True` builders give a cheaper variant of the same shape
of program, for the default test suite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .iree_tools import HOST_FLAGS, compile_mlir
from .models import import_onnx


class _Graph:
    """A graph under construction: seeded initializers and generated node names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, array: np.ndarray, prefix: str = "c", dtype: type = np.float32) -> str:
        from onnx import numpy_helper

        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array).astype(dtype), n))
        return n

    def weight(self, shape: tuple[int, ...], scale: float, prefix: str = "w") -> str:
        return self.const(self.rng.standard_normal(shape) * scale, prefix)

    def op(self, kind: str, inputs: list[str], outputs: int = 1, **attrs: object) -> str | list[str]:
        from onnx import helper

        names = [self.name(kind.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(kind, inputs, names, **attrs))
        return names[0] if outputs == 1 else names

    def linear(self, x: str, fan_in: int, fan_out: int) -> str:
        w = self.weight((fan_in, fan_out), 1.0 / np.sqrt(fan_in))
        b = self.weight((fan_out,), 0.02, "b")
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def layer_norm(self, x: str, width: int) -> str:
        scale = self.const(1.0 + self.rng.standard_normal(width) * 0.05, "ln_g")
        bias = self.const(self.rng.standard_normal(width) * 0.05, "ln_b")
        return self.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-5)

    def gelu(self, x: str) -> str:
        # the erf form PyTorch exports for nn.GELU at opset 17
        scaled = self.op("Div", [x, self.const(np.sqrt(2.0))])
        one_plus = self.op("Add", [self.op("Erf", [scaled]), self.const(1.0)])
        return self.op("Mul", [self.op("Mul", [x, one_plus]), self.const(0.5)])

    def model(self, name: str, inputs: list, outputs: list) -> bytes:
        import onnx
        from onnx import helper

        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                  producer_name="tinyhal-zoo")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model.SerializeToString()


def _split_heads(g: _Graph, x: str, seq: int, heads: int, head_dim: int) -> str:
    shape = g.const(np.array([1, seq, heads, head_dim]), "shape", np.int64)
    return g.op("Transpose", [g.op("Reshape", [x, shape])], perm=[0, 2, 1, 3])


def _merge_heads(g: _Graph, x: str, seq: int, width: int) -> str:
    shape = g.const(np.array([1, seq, width]), "shape", np.int64)
    return g.op("Reshape", [g.op("Transpose", [x], perm=[0, 2, 1, 3]), shape])


def _attention(g: _Graph, q: str, k: str, v: str, head_dim: int, bias: str | None) -> str:
    """softmax(q k^T / sqrt(d) + bias) v over [1, heads, seq, head_dim] tensors."""
    scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = g.op("Mul", [scores, g.const(1.0 / np.sqrt(head_dim))])
    if bias is not None:
        scores = g.op("Add", [scores, bias])
    return g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])


def bert_tiny_onnx(seed: int = 0, layers: int = 2, hidden: int = 128, heads: int = 2,
                   seq: int = 24, vocab: int = 512) -> bytes:
    """A BERT-tiny encoder: token + position embeddings, `layers` post-norm blocks of
    masked self-attention and a GELU feed-forward (4x hidden); input ids and an attention
    mask (1 keep, 0 pad), both int64 [1, seq]; the last hidden states out."""
    from onnx import TensorProto, helper

    g = _Graph(seed)
    head_dim = hidden // heads
    tokens = g.op("Gather", [g.weight((vocab, hidden), 0.5, "wte"), "input_ids"], axis=0)
    x = g.op("Add", [tokens, g.weight((1, seq, hidden), 0.1, "wpe")])
    x = g.layer_norm(x, hidden)
    keep = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    dropped = g.op("Sub", [g.const(1.0), keep])
    bias = g.op("Mul", [dropped, g.const(-10000.0)])
    bias = g.op("Reshape", [bias, g.const(np.array([1, 1, 1, seq]), "shape", np.int64)])
    for _ in range(layers):
        q = _split_heads(g, g.linear(x, hidden, hidden), seq, heads, head_dim)
        k = _split_heads(g, g.linear(x, hidden, hidden), seq, heads, head_dim)
        v = _split_heads(g, g.linear(x, hidden, hidden), seq, heads, head_dim)
        context = _merge_heads(g, _attention(g, q, k, v, head_dim, bias), seq, hidden)
        x = g.layer_norm(g.op("Add", [x, g.linear(context, hidden, hidden)]), hidden)
        ff = g.linear(g.gelu(g.linear(x, hidden, 4 * hidden)), 4 * hidden, hidden)
        x = g.layer_norm(g.op("Add", [x, ff]), hidden)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    return g.model(
        "bert_tiny",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                       [1, seq, hidden])])


def bert_tiny_inputs(seq: int = 24, vocab: int = 512, seed: int = 1) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (1, seq), dtype=np.int64)
    mask = np.ones((1, seq), np.int64)
    mask[0, seq - seq // 4:] = 0  # the last quarter is padding
    return ids, mask


def gpt_step_onnx(seed: int = 0, layers: int = 2, hidden: int = 128, heads: int = 4,
                  past: int = 32, vocab: int = 256) -> bytes:
    """One decoder step of a GPT-style model: a token id and its position in (int64
    [1, 1]), each layer's key/value cache in ([1, heads, past, head_dim] f32) and out with
    the new position appended; pre-norm blocks, GELU MLP, tied output projection."""
    from onnx import TensorProto, helper

    g = _Graph(seed)
    head_dim = hidden // heads
    wte = g.weight((vocab, hidden), 0.5, "wte")
    x = g.op("Add", [g.op("Gather", [wte, "token"], axis=0),
                     g.op("Gather", [g.weight((past + 1, hidden), 0.1, "wpe"), "position"],
                          axis=0)])
    inputs = [helper.make_tensor_value_info("token", TensorProto.INT64, [1, 1]),
              helper.make_tensor_value_info("position", TensorProto.INT64, [1, 1])]
    outputs = []
    cache = [1, heads, past, head_dim]
    for layer in range(layers):
        h = g.layer_norm(x, hidden)
        q = _split_heads(g, g.linear(h, hidden, hidden), 1, heads, head_dim)
        k = _split_heads(g, g.linear(h, hidden, hidden), 1, heads, head_dim)
        v = _split_heads(g, g.linear(h, hidden, hidden), 1, heads, head_dim)
        for kind, new in (("key", k), ("value", v)):
            inputs.append(helper.make_tensor_value_info(f"past_{kind}_{layer}",
                                                        TensorProto.FLOAT, cache))
            g.nodes.append(helper.make_node("Concat", [f"past_{kind}_{layer}", new],
                                            [f"present_{kind}_{layer}"], axis=2))
            outputs.append(helper.make_tensor_value_info(
                f"present_{kind}_{layer}", TensorProto.FLOAT, [1, heads, past + 1, head_dim]))
        context = _attention(g, q, f"present_key_{layer}", f"present_value_{layer}",
                             head_dim, None)
        x = g.op("Add", [x, g.linear(_merge_heads(g, context, 1, hidden), hidden, hidden)])
        h = g.layer_norm(x, hidden)
        x = g.op("Add", [x, g.linear(g.gelu(g.linear(h, hidden, 4 * hidden)), 4 * hidden,
                                     hidden)])
    x = g.layer_norm(x, hidden)
    g.nodes.append(helper.make_node("MatMul", [x, g.op("Transpose", [wte], perm=[1, 0])],
                                    ["logits"]))
    return g.model("gpt_step", inputs,
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, vocab]),
                    *outputs])


def gpt_step_inputs(layers: int = 2, heads: int = 4, past: int = 32, head_dim: int = 32,
                    seed: int = 1) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    args = [np.array([[17]], np.int64), np.array([[past]], np.int64)]
    for _ in range(layers * 2):
        args.append(rng.standard_normal((1, heads, past, head_dim)).astype(np.float32))
    return tuple(args)


def _recurrent_onnx(kind: str, seed: int, layers: int, steps: int, features: int,
                    hidden: int) -> bytes:
    """`layers` stacked unidirectional `kind` ("LSTM" or "GRU") nodes as PyTorch exports
    them: [steps, 1, features] in, the last layer's outputs [steps, 1, hidden] and final
    hidden state out; GRU with `linear_before_reset` as in torch.nn.GRU."""
    from onnx import TensorProto, helper

    g = _Graph(seed)
    gates = 4 if kind == "LSTM" else 3
    scale = 1.0 / np.sqrt(hidden)
    attrs: dict[str, object] = {"hidden_size": hidden}
    if kind == "GRU":
        attrs["linear_before_reset"] = 1
    x, width, h = "input", features, ""
    for _layer in range(layers):
        w = g.weight((1, gates * hidden, width), scale)
        r = g.weight((1, gates * hidden, hidden), scale)
        b = g.weight((1, 2 * gates * hidden), scale, "b")
        y, h = g.op(kind, [x, w, r, b], outputs=2, **attrs)
        # Y is [steps, directions=1, batch, hidden]: drop the direction axis
        x = g.op("Squeeze", [y, g.const(np.array([1]), "axes", np.int64)])
        width = hidden
    g.nodes.append(helper.make_node("Identity", [x], ["output"]))
    g.nodes.append(helper.make_node("Identity", [h], ["hidden"]))
    return g.model(
        kind.lower(),
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [steps, 1, features])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [steps, 1, hidden]),
         helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, 1, hidden])])


def lstm_onnx(seed: int = 0, layers: int = 2, steps: int = 16, features: int = 32,
              hidden: int = 64) -> bytes:
    """A 2-layer LSTM over 16 steps."""
    return _recurrent_onnx("LSTM", seed, layers, steps, features, hidden)


def gru_onnx(seed: int = 0, layers: int = 1, steps: int = 16, features: int = 32,
             hidden: int = 64) -> bytes:
    """A GRU over 16 steps."""
    return _recurrent_onnx("GRU", seed, layers, steps, features, hidden)


def sequence_input(steps: int = 16, features: int = 32, seed: int = 1) -> tuple[np.ndarray]:
    return (np.random.default_rng(seed).standard_normal((steps, 1, features))
            .astype(np.float32),)


@dataclass(frozen=True)
class ZooModel:
    """A zoo entry: its ONNX graph (`build(small)`), exported function and inputs."""

    build: Callable[[bool], bytes]
    function: str
    inputs: Callable[[bool], tuple[np.ndarray, ...]]


ZOO: dict[str, ZooModel] = {
    "bert_tiny": ZooModel(
        lambda small: bert_tiny_onnx(layers=1, seq=8) if small else bert_tiny_onnx(),
        "bert_tiny", lambda small: bert_tiny_inputs(seq=8 if small else 24)),
    "gpt_step": ZooModel(
        lambda small: gpt_step_onnx(layers=1, past=8) if small else gpt_step_onnx(),
        "gpt_step",
        lambda small: gpt_step_inputs(layers=1, past=8) if small else gpt_step_inputs()),
    "lstm": ZooModel(
        lambda small: lstm_onnx(steps=3, hidden=16, features=8) if small else lstm_onnx(),
        "lstm", lambda small: sequence_input(3, 8) if small else sequence_input()),
    "gru": ZooModel(
        lambda small: gru_onnx(steps=3, hidden=16, features=8) if small else gru_onnx(),
        "gru", lambda small: sequence_input(3, 8) if small else sequence_input()),
}


def zoo_vmfb(name: str, small: bool = False) -> Path:
    """The zoo model `name` compiled for this host (cached by content hash)."""
    return compile_mlir(import_onnx(ZOO[name].build(small)), HOST_FLAGS)


def zoo_inputs(name: str, small: bool = False) -> tuple[np.ndarray, ...]:
    return ZOO[name].inputs(small)
