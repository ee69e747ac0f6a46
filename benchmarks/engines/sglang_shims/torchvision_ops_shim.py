"""Defines the ``torchvision::nms`` / ``torchvision::qnms`` operator schemas (no kernels) just before
torchvision is first imported, in the rig's SGLang venv only (``setup_sglang.sh`` installs it with a
one-line ``.pth`` that calls ``install()``).

WHY: the package index's torchvision 0.28.0 is a CUDA build, so its ``_C`` extension does not load
next to the CPU torch 2.13.0; torchvision then registers fake (meta) kernels for ``torchvision::nms``
at import and fails with "operator torchvision::nms does not exist". SGLang 0.5.23 imports
``torchvision.transforms`` at start-up (multimodal helpers) and never calls these operators on a text
model, so their schemas are enough. The hook is a ``sys.meta_path`` finder that does nothing until
``import torchvision``: other programs in the venv never import torch for it.
"""
from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBS: list = []      # the Library objects must outlive the import, or their definitions go away


class _DefineBeforeTorchvision:
    """A meta-path finder that finds nothing: on the first ``import torchvision`` it defines the
    missing schemas, removes itself, and lets the normal finders import torchvision."""

    def find_spec(self, name, path=None, target=None):  # noqa: ARG002 - the finder protocol
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch

        spec = importlib.machinery.PathFinder.find_spec("torchvision", path)
        for loc in (spec.submodule_search_locations or []) if spec else []:
            for ext in sorted(Path(loc).glob("_C*.so")):
                try:
                    torch.ops.load_library(str(ext))     # a torchvision built for this torch: no shim
                    return None
                except OSError:
                    pass
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for schema in _SCHEMAS:
            lib.define(schema)
        _LIBS.append(lib)
        return None


def install() -> None:
    if "torchvision" not in sys.modules and not any(isinstance(f, _DefineBeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _DefineBeforeTorchvision())
