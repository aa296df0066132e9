"""The Tinker API's protobuf bodies (the SDK's ``tinker.proto.tinker_public_pb2``), decoded and encoded.

The SDK posts ``/api/v1/forward_backward`` as a protobuf ``ForwardBackwardRequest`` (zstd-compressed when the
server's client config asks for it; rlvr's does not) and asks for ``ForwardBackwardOutput`` and ``SampleResponse``
results as protobuf (``Accept: application/x-protobuf``); everything else is JSON. Tensors travel as raw
little-endian bytes: tokens as int32, ``float32``/``int64`` loss inputs as declared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PROTO = "application/x-protobuf"


class WireError(ValueError):
    """A request body the server cannot read: the message names the field and what was expected."""


@dataclass(frozen=True)
class ForwardBackwardCall:
    """A decoded ``/api/v1/forward_backward`` request: ``data`` = [(input tokens [N], {name: [N] array})]."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float] | None
    forward_only: bool
    data: list[tuple[list[int], dict[str, np.ndarray]]]


_NP = {1: np.float32, 2: np.int64, 3: np.int32}  # DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32


def _tensor(msg, where: str) -> np.ndarray:
    dtype = _NP.get(int(msg.dtype))
    if dtype is None:
        raise WireError(f"{where}: tensor dtype {int(msg.dtype)} is not float32, int64 or int32")
    if msg.HasField("sparse_csr"):
        raise WireError(f"{where}: sparse tensors are not supported (send a dense [N] tensor)")
    arr = np.frombuffer(msg.dense, dtype=dtype)
    shape = list(msg.shape) or [arr.size]
    if int(np.prod(shape)) != arr.size:
        raise WireError(f"{where}: shape {shape} does not hold the {arr.size} values sent")
    out = arr.reshape(shape)
    return out.astype(np.int64) if dtype is np.int32 else out.copy()


def decode_forward_backward(body: bytes, encoding: str | None) -> ForwardBackwardCall:
    """Decode the protobuf body of ``/api/v1/forward_backward``. Errors: :class:`WireError` for a body that is not
    the message, an image or audio chunk, a sparse or mistyped tensor."""
    from tinker.proto import tinker_public_pb2 as pb

    if encoding and encoding.lower() == "zstd":
        import zstandard

        body = zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 31)
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise WireError(f"forward_backward: the body is not a protobuf ForwardBackwardRequest ({e})") from e
    if not msg.model_id:
        raise WireError("forward_backward: model_id is missing")
    config: dict[str, float] | None = None
    if msg.loss_fn_config_v2:
        config = {}
        for k, v in msg.loss_fn_config_v2.items():
            if v.WhichOneof("value") == "text":
                raise WireError(f"forward_backward: loss_fn_config[{k!r}] is text ({v.text!r}); the built-in losses take numbers")
            config[k] = float(v.number)
    elif msg.loss_fn_config:
        config = {k: float(v) for k, v in msg.loss_fn_config.items()}
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for c in d.model_input:
            if c.WhichOneof("chunk") != "encoded_text":
                raise WireError(f"forward_backward: datum {i} has an image or audio chunk; this server runs text models")
            tokens.extend(np.frombuffer(c.encoded_text.tokens, dtype=np.int32).tolist())
        inputs = {k: _tensor(t, f"forward_backward: datum {i} loss_fn_inputs[{k!r}]") for k, t in d.loss_fn_inputs.items()}
        data.append((tokens, inputs))
    if not data:
        raise WireError("forward_backward: no data (send at least one datum)")
    return ForwardBackwardCall(msg.model_id, int(msg.seq_id), msg.loss_fn, config, bool(msg.forward_only), data)


def _batched(arrays: list[np.ndarray]):
    """A ``BatchedTensor``: the datums' [N_i] arrays end to end, byte offsets [D + 1]."""
    from tinker.proto import tinker_public_pb2 as pb

    bt = pb.BatchedTensor()
    dtype = arrays[0].dtype if arrays else np.dtype(np.float32)
    bt.dtype = pb.DTYPE_INT64 if dtype.kind in "iu" else pb.DTYPE_FLOAT32
    np_dtype = np.int64 if bt.dtype == pb.DTYPE_INT64 else np.float32
    parts = [np.ascontiguousarray(a, dtype=np_dtype).reshape(-1) for a in arrays]
    offsets = np.cumsum([0] + [p.nbytes for p in parts]).astype(np.int64)
    bt.data = b"".join(p.tobytes() for p in parts)
    bt.offsets = offsets.tobytes()
    return bt


def encode_forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A protobuf ``ForwardBackwardOutput``: one ``ArrayRecord`` holding every datum's output fields (1-D each)."""
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.ForwardBackwardOutput()
    msg.loss_fn_output_type = "ArrayRecord"
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    rec = msg.loss_fn_outputs.add()
    rec.type_tag = "ArrayRecord"
    rec.num_datums = len(outputs)
    names = sorted({k for o in outputs for k in o})
    for name in names:
        rec.fields[name].CopyFrom(_batched([o[name] for o in outputs]))
    return msg.SerializeToString()


def encode_sample_response(sequences: list[tuple[list[int], list[float], str]],
                           prompt_logprobs: list[float | None] | None) -> bytes:
    """A protobuf ``SampleResponse``: each sequence's (tokens, logprobs, stop reason ``stop``/``length``), and the
    prompt's logprobs ([L], NaN where none: the first token) when asked."""
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.SampleResponse()
    for tokens, logprobs, reason in sequences:
        s = msg.sequences.add()
        s.stop_reason = pb.STOP_REASON_STOP if reason == "stop" else pb.STOP_REASON_LENGTH
        s.tokens = np.asarray(tokens, dtype=np.int32).tobytes()
        s.logprobs = np.asarray(logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray([np.nan if x is None else x for x in prompt_logprobs], dtype=np.float32).tobytes()
    return msg.SerializeToString()

