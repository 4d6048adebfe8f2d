"""What makes a model's keys and values what they are, as a digest: its weights (hashed, not
named: a file renamed or copied is the same model, one edited in place is not) and the code
and machine that compute them. The key of the prefix cache's blocks on disk
(:mod:`promptlookup.prefix_disk`), which a later process must find only for the same model,
engine and KV dtype."""

from __future__ import annotations

import hashlib
import platform

import torch


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over every parameter and buffer of ``model`` (name, dtype, shape and bytes), and
    the packed panels of our quantized weights (their layout included)."""
    digest = hashlib.sha256()
    for name, module in model.named_modules():
        tensors = [
            *module.named_parameters(recurse=False),
            *module.named_buffers(recurse=False),
        ]
        quantized = getattr(module, "quantized", None)  # a QuantizedWeight: not a buffer
        if quantized is not None:
            layout = (quantized.kind, quantized.n, quantized.k, quantized.half)
            tensors.append((f"quantized{layout}", quantized.panels))
        for key, tensor in tensors:
            if tensor is None:
                continue
            data = tensor.detach().cpu().contiguous()
            digest.update(f"{name}.{key} {data.dtype} {tuple(data.shape)}\n".encode())
            digest.update(data.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def build_identity() -> str:
    """The libraries and processor that compute a pass: another torch, promptlookup or CPU
    may round a pass otherwise."""
    import transformers

    from ..._version import __version__

    return (
        f"torch={torch.__version__} transformers={transformers.__version__} "
        f"promptlookup={__version__} cpu={platform.machine()}:{_cpu_model()}"
    )


def _cpu_model() -> str:
    """The processor's model name (Linux), else ''."""
    try:
        with open("/proc/cpuinfo") as lines:
            for line in lines:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""
