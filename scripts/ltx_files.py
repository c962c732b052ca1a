"""Small readers and writers the fidelity scripts share (numpy only, no torch):
safetensors files (what `engine encode-text` and `engine noise` write, and what the
scripts hand back to the engine), and a weights directory's token budget."""
import json
import os
import struct

import numpy as np

_KINDS = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "F64": np.float64}
_NAMES = {np.dtype(v): k for k, v in _KINDS.items()}


def read_safetensors(path):
    """Every tensor of a safetensors file as a numpy array, and its string metadata."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, h in header.items():
        if h["dtype"] not in _KINDS:
            raise ValueError(f"{path}: tensor {name!r} is {h['dtype']}, expected one of {sorted(_KINDS)}")
        a, b = h["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=_KINDS[h["dtype"]]).reshape(h["shape"])
    return out, meta


def write_safetensors(path, tensors, meta=None):
    """Write `tensors` ({name: array of f32, i32, i64 or f64}) with string `meta`,
    through a temporary file and a rename."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        b = a.tobytes()
        header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if meta:
        header["__metadata__"] = {k: str(v) for k, v in meta.items()}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def max_tokens_of(weights):
    """The tokenizer's token budget (`model_max_length` in tokenizer/tokenizer_config.json)."""
    cfg = json.load(open(os.path.join(weights, "tokenizer", "tokenizer_config.json")))
    return int(cfg["model_max_length"])
