"""One kvq cache on one device, holding the rows of a batch as sequences, and the three things a transformers
attention layer asks of it: append a row's tokens, attend a row's queries causally as decoding would, and attend
one new token of every row (a decode step). Tensors come in as torch tensors laid out as transformers lays them out
([batch, heads, tokens, head_dim]); the kvq cache takes float32 [tokens, heads, head_dim]."""

from __future__ import annotations

import torch

from .. import _kvq


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[heads, tokens, d] of one batch row -> float32 [tokens, heads, d], contiguous."""
    return x.transpose(0, 1).to(torch.float32).contiguous()


class Store:
    """A kvq.KVCache on the CPU or a CUDA device with one sequence per batch row: the layers of one codec pair and key
    centering (`setup`, calibration.LayerSetup). With options.key_order, keys and queries are handed to kvq with
    their channels in that order (channels.py: a calibration file's layout); values as they are."""

    def __init__(self, device: torch.device, n_layers: int, n_kv_heads: int, head_dim: int, setup, batch: int,
                 capacity_pages: int, options):
        self.device = device
        common = dict(capacity_pages=capacity_pages, key_codec=setup.key_codec, value_codec=setup.value_codec,
                      block_tokens=options.block_tokens, residual_tokens=options.residual_tokens,
                      seed=options.seed, center_keys=setup.center_keys, sink_tokens=options.sink_tokens)
        if device.type not in ("cpu", "cuda"):
            raise NotImplementedError(f"kvq.hf: a model layer on device '{device}': kvq caches live on the CPU or "
                                      "on CUDA devices")
        where = "cpu" if device.type == "cpu" else f"cuda:{device.index if device.index is not None else 0}"
        self.cache = _kvq.KVCache(n_layers, n_kv_heads, head_dim, threads=options.threads, device=where, **common)
        self.block_tokens = options.block_tokens
        self.residual_tokens = options.residual_tokens
        self.sink_tokens = options.sink_tokens
        self.key_order = None if options.key_order is None else torch.tensor(options.key_order, device=device)
        self.seqs = [self.cache.add_sequence() for _ in range(batch)]
        self.attention_args: dict[int, tuple[float, int]] = {}  # layer -> (scale, window) of its decode steps
        self.plans: dict[int, tuple] = {}  # CPU: layer -> ((n_q_heads, scale, window), kvq.DecodePlan)
        self.graph_step = None  # a kvq.DecodeStep while a DecodeGraph captures or replays (graph.py)

    def start_layer(self, layer: int, setup) -> None:
        """Before the layer's first append: its codecs start from the setup's trained states, and on CUDA the
        layer's codec pair must have a decode kernel in this build (NotImplementedError naming it otherwise)."""
        if setup.key_state or setup.value_state:
            self.cache.load_layer_state(layer, setup.key_state, setup.value_state)
        if self.device.type == "cuda":
            try:
                self.cache.attention_kernel(layer)
            except _kvq.Error as e:
                raise NotImplementedError(f"kvq.hf: layer {layer}'s codecs '{setup.key_codec}' / "
                                          f"'{setup.value_codec}' on {self.cache.device}: {e}") from e

    def length(self, row: int, layer: int) -> int:
        return self.cache.length(self.seqs[row], layer)

    def append(self, row: int, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """keys, values: [kv heads, n, d] of one row."""
        if keys.shape[1] == 0:
            return
        self.cache.append(self.seqs[row], layer, _rows(self._in_key_order(keys)), _rows(values))

    def decode_step(self, layer: int, keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor, scale: float,
                    window: int) -> torch.Tensor:
        """One new token per row: keys, values [batch, kv heads, 1, d], query [batch, q heads, 1, d]; appends,
        then attends every row at once. Returns float32 [batch, q heads, d]."""
        k = self._in_key_order(keys[:, :, 0]).to(torch.float32).contiguous()
        v = values[:, :, 0].to(torch.float32).contiguous()
        q = self._in_key_order(query[:, :, 0]).to(torch.float32).contiguous()
        if self.graph_step is not None:  # launches only: a CUDA graph is being captured
            out = torch.empty_like(q)
            self.graph_step.run(layer, k, v, q, out)
            return out
        self.attention_args[layer] = (scale, window)
        if self.device.type == "cuda":
            self.cache.append_batch(self.seqs, layer, k, v, [1] * len(self.seqs))
            return self._as_tensor(self.cache.decode_attention(layer, self.seqs, q, scale=scale, window=window))
        for row, seq in enumerate(self.seqs):
            self.cache.append(seq, layer, k[row:row + 1], v[row:row + 1])
        return self._as_tensor(self._plan(layer, q.shape[1], scale, window).run(q))

    def append_attend(self, row: int, layer: int, keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor,
                      scale: float, window: int) -> torch.Tensor:
        """Appends n tokens of one row and attends its n queries causally over the cache, each position seeing the
        cache as it would when decoding: a position attends before the append that encodes the window's oldest
        block, the position that triggers it after. keys, values [kv heads, n, d], query [q heads, n, d].
        Returns float32 [n, q heads, d]."""
        k, v, q = _rows(self._in_key_order(keys)), _rows(values), _rows(self._in_key_order(query))
        n = q.shape[0]
        out = torch.empty_like(q)  # [n, q heads, d]
        seq = self.seqs[row]
        done = 0
        while done < n:
            m = min(n - done, self._tokens_before_encoding(self.cache.length(seq, layer))) if self._is_cpu else 1
            self.cache.append(seq, layer, k[done:done + m], v[done:done + m])
            if m > 1:
                start = self.cache.length(seq, layer) - m
                self.cache.prefill_attention(layer, seq, start, q[done:done + m], scale=scale, window=window,
                                             out=out[done:done + m])
            else:  # the decode kernel, as a decode step would run it
                out[done] = self._as_tensor(self.cache.decode_attention(layer, [seq], q[done:done + 1], scale=scale,
                                                                        window=window))[0]
            done += m
        return out

    def remove(self) -> None:
        for seq in self.seqs:
            self.cache.remove_sequence(seq)
        self.seqs = []
        self.plans.clear()

    def memory(self) -> dict:
        return self.cache.memory()

    @property
    def _is_cpu(self) -> bool:
        return self.device.type == "cpu"

    def _in_key_order(self, x: torch.Tensor) -> torch.Tensor:
        """Keys or queries (channels last) in the order kvq stores keys in (options.key_order)."""
        return x if self.key_order is None else x.index_select(-1, self.key_order)

    def _tokens_before_encoding(self, length: int) -> int:
        """How many tokens can be appended before the one whose append encodes the window's oldest block (at least
        one): the first S tokens go to the sinks, then the fp32 window holds the tokens after them until it first
        reaches R + T, then R + (tokens - R) mod T (CompressedKVStore::append_attend in C++)."""
        R, T, S = self.residual_tokens, self.block_tokens, self.sink_tokens
        sink_room = max(S - length, 0)
        held = max(length - S, 0)
        window = held if held < R else R + (held - R) % T
        return max(R + T - 1 - window + sink_room, 1)

    def _plan(self, layer: int, n_q_heads: int, scale: float, window: int):
        """The layer's CPU decode plan, made at its first decode step (steps reuse its scratch)."""
        key = (n_q_heads, scale, window)
        if layer not in self.plans or self.plans[layer][0] != key:
            self.plans[layer] = (key, self.cache.decode_plan(layer, self.seqs, n_q_heads, scale=scale, window=window))
        return self.plans[layer][1]

    def _as_tensor(self, array) -> torch.Tensor:
        return array if isinstance(array, torch.Tensor) else torch.from_numpy(array)
