"""The distribution installs one import name, ``srtscope``, from a wheel or an sdist."""
from __future__ import annotations

import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GENERIC = ("engine", "cli", "probes", "analyzers")


def _tracked_copy(dst: Path) -> Path:
    """The repository's tracked and untracked-but-not-ignored files, without build leftovers."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                           cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for f in filter(None, files):
        src = REPO / f.decode()
        if src.is_file():
            (dst / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            (dst / f.decode()).write_bytes(src.read_bytes())
    return dst


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(wheel, sdist) built from a clean copy of the tree."""
    if not (REPO / ".git").exists():
        pytest.skip("needs the git checkout to list the project's files")
    src = _tracked_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("dist")
    # NOTE: one process per build; a second build in the same process writes to the first's folder
    for kind in ("wheel", "sdist"):
        code = f"import setuptools.build_meta as b, sys; b.build_{kind}(sys.argv[1])"
        res = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
    return next(out.glob("*.whl")), next(out.glob("*.tar.gz"))


def test_wheel_has_one_top_level_name(built):
    wheel, _ = built
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"srtscope", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    names = zipfile.ZipFile(wheel).namelist()
    for sub in GENERIC:
        assert f"srtscope/{sub}/__init__.py" in names
    assert "srtscope/__main__.py" in names
    assert "srtscope/engine/model/llama.py" in names and "srtscope/analyzers/readers/kineto.py" in names
    # the C extensions, where this machine can compile them (setup.py makes them optional)
    for ext in ("probes/_fastrange", "analyzers/readers/_sqlite_pages"):
        if shutil.which("gcc") or shutil.which("cc"):
            assert any(n.startswith(f"srtscope/{ext}.") and n.endswith(".so") for n in names), names
        assert f"srtscope/{ext}.c" not in names
    assert not [n for n in names if n.startswith("srtscope/probes/_fastrange") and n.endswith((".c", ".h"))]
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "srtscope = srtscope.cli.app:main" in entry


def test_sdist_builds_the_same_packages(built):
    _, sdist = built
    members = tarfile.open(sdist).getnames()
    root = members[0].split("/")[0]
    for sub in GENERIC:
        assert f"{root}/{sub}/__init__.py" in members
    assert f"{root}/srtscope/__init__.py" in members and f"{root}/pyproject.toml" in members
    assert f"{root}/probes/_fastrange.c" in members and f"{root}/setup.py" in members
    for part in ("_fastrange.h", "_fastrange_method.c", "_fastrange_null.c", "_fastrange_range.c"):
        assert f"{root}/probes/{part}" in members
    assert f"{root}/analyzers/readers/_sqlite_pages.c" in members


def test_wheel_installs_into_an_empty_venv(built, tmp_path):
    """Installed alone (dependencies borrowed from this environment), it gives ``import srtscope``
    and the CLI, and no generic top-level name."""
    wheel, _ = built
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    "--disable-pip-version-check", str(wheel)], check=True, capture_output=True)
    # NOTE: a path in a .pth file is added without processing that folder's own .pth files, so
    # this environment's editable install of srtscope stays invisible to the new venv
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "borrowed_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    probe = ("import importlib.util as u, srtscope, srtscope.cli.app, srtscope.engine.engine; "
             "from srtscope.probes import ranges; "
             "print(srtscope.__file__); "
             f"print([n for n in {GENERIC!r} if u.find_spec(n) is not None]); "
             "print(ranges.implementation())")
    res = subprocess.run([str(py), "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    where, generic, probes = res.stdout.strip().splitlines()
    assert Path(where).is_relative_to(venv), where
    assert generic == "[]"
    if shutil.which("gcc") or shutil.which("cc"):
        assert probes == "C"   # the wheel's extension loads from the installed package
    cli = subprocess.run([str(venv / "bin" / "srtscope"), "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert cli.returncode == 0 and "diagnose" in cli.stdout
    mod = subprocess.run([str(py), "-m", "srtscope", "--version"], cwd=tmp_path, capture_output=True, text=True)
    assert mod.returncode == 0 and mod.stdout.strip() == "srtscope 0.1.0", mod.stderr
