"""CPU stand-in start-up for SGLang 0.5.16's source under .venv's transformers. NOT part of specflip.

SGLang 0.5.16 registers its own `qwen3_asr` config with transformers (`sglang/srt/configs/qwen3_asr.py`:
`AutoConfig.register("qwen3_asr", ...)`); .venv's transformers (5.19) already ships one and refuses a second
("'qwen3_asr' is already used by a Transformers config"), while the GPU host's bundle carries transformers 5.12.1,
which has none. Python imports this module at start-up when `stand_ins/cpu_sglang_0_5_16` is on PYTHONPATH
(only `bench/gpu/lint_matrix.py --cpu-0516` puts it there): it lets such a registration replace the shipped entry
(exist_ok), as it does on the host. lint reads no qwen3_asr model.
"""

from __future__ import annotations

from typing import Any

try:
    from transformers.models.auto import configuration_auto as _auto
except Exception:  # pragma: no cover - no transformers: nothing to adapt
    _auto = None

if _auto is not None:
    _mapping_cls = type(_auto.CONFIG_MAPPING)
    _register = _mapping_cls.register

    def _register_replacing(self: Any, key: str, value: Any, exist_ok: bool = False) -> None:
        _register(self, key, value, exist_ok=True)

    _mapping_cls.register = _register_replacing
