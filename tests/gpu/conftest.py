"""GPU tests: collected everywhere, skipped cleanly where there is no sm_90 GPU."""

import pytest


def _sm90() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs an NVIDIA sm_90 GPU (H100/H200)")
    for item in items:
        if "gpu" in item.keywords and not _sm90():
            item.add_marker(skip)
