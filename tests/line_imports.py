"""What a test on any SGLang line imports first (tests/launch_probe.py, tests/test_release_conformance.py)."""

from __future__ import annotations


def import_tp_worker_or_stand_ins() -> None:
    """Import SGLang's tp_worker; on 0.5.12, whose host KV pool imports sgl_kernel (CUDA kernels), install the
    import-only CPU stand-in for it instead (tests/sglang12_cpu.py)."""
    try:
        import sglang.srt.managers.tp_worker  # noqa: F401
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("sgl_kernel"):
            raise
        __import__("sglang12_cpu").install_import_stand_ins()  # sgl_kernel as an import-only CPU stand-in
