"""Calibration files for the tests, written in the format `kvq calibrate` writes (kvq/detail/calibration.hpp,
version 5) with its CRC-32C computed here, so that kvq's reader checks a file this module wrote independently."""

from __future__ import annotations

from dataclasses import dataclass, field


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # the Castagnoli polynomial, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ _TABLE[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C (src/core/crc32c.hpp)


@dataclass
class Layer:
    key: str
    value: str
    centered: bool = False
    key_state: bytes = b""
    value_state: bytes = b""


@dataclass
class CalibrationFile:
    layers: list[Layer]
    architecture: str = "llama"
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    model_crc32c: int = 0x1234ABCD
    channel_layout: str = "rope_halves"
    budget_bits: float = 4.0
    block_tokens: int = 64
    calibration_tokens: int = 256
    sink_tokens: int = 0
    predicted_kld: float = 0.01
    extra_lines: list[str] = field(default_factory=list)  # after the states, before the checksum (a bad file)

    def text(self) -> str:
        lines = ["kvq-calibration 5", f"architecture {self.architecture}", f"layers {len(self.layers)}",
                 f"heads {self.heads}", f"kv_heads {self.kv_heads}", f"head_dim {self.head_dim}",
                 f"model_crc32c {self.model_crc32c:08x}", f"channel_layout {self.channel_layout}",
                 f"budget_bits {self.budget_bits}", f"block_tokens {self.block_tokens}",
                 f"calibration_tokens {self.calibration_tokens}", f"sink_tokens {self.sink_tokens}",
                 f"predicted_kld {self.predicted_kld}"]
        lines += [f"layer {i} {l.key} {l.value} {'centered' if l.centered else 'plain'}"
                  for i, l in enumerate(self.layers)]
        states = [(i, role, state) for i, l in enumerate(self.layers)
                  for role, state in (("key", l.key_state), ("value", l.value_state)) if state]
        lines.append(f"trained_states {len(states)}")
        lines += [f"state {i} {role} {len(state)} {state.hex()}" for i, role, state in states]
        lines += self.extra_lines
        body = "".join(line + "\n" for line in lines)
        return body + f"crc32c {crc32c(body.encode()):08x}\n"

    def write(self, path) -> str:
        with open(path, "w", encoding="ascii", newline="\n") as f:
            f.write(self.text())
        return str(path)
