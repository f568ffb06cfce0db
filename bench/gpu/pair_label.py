"""The codec pair, head dimension and key group shift of a mangled decode_split_kernel name (sass_stats.py and
ptxas-report.sh), e.g. 'int4/turbo_mse:2 d=128 g=1', with ' fast' for the int keys' integer path (KVQ_ATTENTION=fast),
' fast-values' for the int4 values' fast path and ' window-start' for the sliding window's variant; None for other
kernels."""
import re

_TRAITS = r"(Float|Int|Kivi|TurboMse|TurboProd|TurboRvq|Qjl|VecInfer)TraitsIL[bi](\d+)E(?:Li(\d+)E)?E"
_NAMES = {"Float0": "f16", "Float1": "bf16", "Int4": "int4", "Int8": "int8", "Qjl0": "qjl"}
_FAMILIES = {"TurboMse": "turbo_mse", "TurboProd": "turbo_prod", "TurboRvq": "turbo_rvq", "VecInfer": "vecinfer"}


def _codec(family, arg, arg2=None):
    if family + arg in _NAMES:
        return _NAMES[family + arg]
    name = _FAMILIES.get(family, family.lower())
    return f"{name}:{arg}/{arg2}" if arg2 else f"{name}:{arg}"


def pair_label(name):
    m = re.search(_TRAITS + r"3KeyE(\w*?)5ValueELi(\d+)ELi(\d+)ELb([01])E(?:Lb([01])E)?(?:Lb([01])E)?", name)
    if not m:
        return None
    key = _codec(m.group(1), m.group(2), m.group(3))
    # The value's traits: a family of its own, the key's family (a substitution) with another argument, or the key's
    # traits themselves.
    v = re.search(_TRAITS + "$", m.group(4))
    arg = re.search(r"S\w*_IL[bi](\d+)EE$", m.group(4))
    value = _codec(v.group(1), v.group(2), v.group(3)) if v else _codec(m.group(1), arg.group(1)) if arg else key
    return (f"{key}/{value} d={m.group(5)} g={m.group(6)}" + (" fast" if m.group(8) == "1" else "") +
            (" fast-values" if m.group(9) == "1" else "") + (" window-start" if m.group(7) == "1" else ""))
