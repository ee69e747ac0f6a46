"""srtscope: profiling and bottleneck diagnosis for LLM inference engines.

One import name for the whole distribution: ``srtscope.engine`` (reference engine),
``srtscope.probes`` (instrumentation), ``srtscope.analyzers`` (readers, analyses, verdict) and
``srtscope.cli`` (the ``srtscope`` command). In the repository they are the top-level folders
``engine/``, ``probes/``, ``analyzers/`` and ``cli/``, mapped by ``pyproject.toml``.
"""
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent
# NOTE: a source checkout used without installing (PYTHONPATH=<repo>, as the GPU check does):
# the subpackages are the repository's sibling folders. An installed wheel has them inside.
if not (Path(__file__).parent / "engine").is_dir() and (_REPO / "pyproject.toml").is_file() \
        and (_REPO / "analyzers" / "__init__.py").is_file():
    __path__.append(str(_REPO))  # type: ignore[name-defined]  # noqa: F821

try:
    __version__ = version("srtscope")
except PackageNotFoundError:
    __version__ = "0+unknown"
