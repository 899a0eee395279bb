import os
import sys

# The repository root holds kernels/, our CuTe kernels, which install as parallel_mlp.kernels and
# must never import as a bare `kernels`: PyPI's `kernels` is another package (transformers >= 5.25
# imports it). `python -m pytest` (the README's test command) puts the working directory, the
# root, first on sys.path, where kernels/ would shadow it; take the root off, before anything
# imports transformers (parallel_mlp itself comes from its install, `pip install -e .`).
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _REPO]
if (getattr(sys.modules.get("kernels"), "__file__", None) or "").startswith(
        os.path.join(_REPO, "kernels")):
    del sys.modules["kernels"]

import pytest  # noqa: E402
import torch  # noqa: E402

# Spawned ranks import test modules by name; make the tests folder importable for them.
sys.path.insert(0, os.path.dirname(__file__))


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)
