"""What the calls of a kvq.KVCache on a CUDA device use where the caller leaves it open: the CUDA stream they run on,
and the tensor decode_attention writes its output into. The extension (python/src/cache_binding.cpp) calls these.

torch is used where it is imported; a stream is never a reason to import it."""

import sys


def stream_handle(stream, device):
    """The cudaStream_t, as an int, that a call on CUDA device `device` runs on: `stream` if it is an int, its
    ``cuda_stream`` if it is a torch.cuda.Stream, and for None torch's current stream on the device where torch is
    imported, else 0 (the default stream)."""
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return 0
        return torch.cuda.current_stream(device).cuda_stream
    handle = getattr(stream, "cuda_stream", stream)
    if isinstance(handle, bool) or not isinstance(handle, int) or handle < 0:
        raise TypeError(f"stream: expected None, a cudaStream_t as an int or a torch.cuda.Stream, got {stream!r}")
    return handle


def empty_output(shape, device):
    """A new float32 torch tensor of `shape` on CUDA device `device`: decode_attention's output when out is None."""
    try:
        import torch
    except ImportError:
        raise TypeError("out: None asks for a new torch tensor, and torch is not installed; pass out=") from None
    return torch.empty(shape, dtype=torch.float32, device=torch.device("cuda", device))
