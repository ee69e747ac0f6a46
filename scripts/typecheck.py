"""mypy over the package as it is imported, ``srtscope.*`` (`make lint`; configured in pyproject.toml).

The repository's folders engine/, probes/, analyzers/ and cli/ are the subpackages
srtscope.engine/.probes/.analyzers/.cli (pyproject's package-dir). mypy follows neither the
editable install's import hook nor srtscope/__init__.py's ``__path__``, and checking the folders
by path would name them ``engine``, ``cli``... and leave every ``srtscope.*`` import unresolved.
So this links them, as package-dir maps them, into build/typecheck/srtscope (the ``mypy_path``
in pyproject), runs mypy on the package and reports the repository's own paths.

    python scripts/typecheck.py [extra mypy arguments]
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TREE = REPO / "build" / "typecheck"
# as [tool.setuptools.package-dir] in pyproject.toml; "srtscope" itself is linked file by file
SUBPACKAGES = ("engine", "probes", "analyzers", "cli")


def link_tree() -> Path:
    pkg = TREE / "srtscope"
    pkg.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in (REPO / "srtscope").glob("*.py")}
    wanted.update({name: REPO / name for name in SUBPACKAGES})
    for entry in pkg.iterdir():                         # stale links (a removed module)
        if entry.name not in wanted and entry.is_symlink():
            entry.unlink()
    for name, target in wanted.items():
        link = pkg / name
        rel = os.path.relpath(target, pkg)
        if link.is_symlink() and os.readlink(link) == rel:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(rel, target_is_directory=target.is_dir())
    return pkg


def main(argv: list[str]) -> int:
    from mypy import api

    link_tree()
    os.chdir(REPO)
    out, err, status = api.run(argv)                    # files, paths and options: pyproject.toml
    prefix = re.escape(str(Path("build", "typecheck", "srtscope"))) + r"[\\/]"
    subs = "|".join(SUBPACKAGES)

    def real_path(m: re.Match[str]) -> str:
        return m.group(1) if m.group(1) else "srtscope/"

    out = re.sub(rf"(?m)^{prefix}(?:((?:{subs})[\\/]))?", real_path, out)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
