import pytest
import torch


def sm90_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


requires_sm90 = pytest.mark.skipif(not sm90_available(), reason="needs an sm_90 GPU (H100/H200)")
