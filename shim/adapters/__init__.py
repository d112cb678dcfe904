"""The guard's hook bodies over live SGLang objects (`common.V2Adapter`). Which release line's adapter runs is the
release layer's choice (shim/releases/: each line module holds its `Adapter`, the registry picks it)."""
