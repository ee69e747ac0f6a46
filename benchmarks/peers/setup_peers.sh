#!/usr/bin/env bash
# Create benchmarks/.peer-venv and install the peer tools srtscope is compared with.
#
# Peers live in their own virtual environment so the project's dependencies stay clean.
#   nsys-ai        (PyPI nsys-ai)                 — duckdb/pyarrow based nsys SQLite analyses
#   HTA            (PyPI traceinsight, the newer releases of HolisticTraceAnalysis;
#                   falls back to HolisticTraceAnalysis) — Kineto idle/temporal breakdown
#   Nsight Systems analysis recipes need the `nsys` binary: not installable here, reported as unavailable.
#
# Neither peer depends on torch (checked with `pip download --no-deps` + METADATA). If a future release
# pulls torch, we pin the CPU build of torch==2.13.0 first so an unpinned CUDA torch is never pulled.
# HTA's `jupyterlab` requirement is only for its notebooks; by default we install HTA --no-deps plus
# its runtime imports (numpy pandas<3 plotly networkx pydot pyyaml psutil). PEER_FULL=1 installs all deps.
#
# Usage: benchmarks/peers/setup_peers.sh            (idempotent; prints one status line per peer)
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="$ROOT/benchmarks/.peer-venv"
PY="${PYTHON:-python3}"
STATUS="$VENV/peer_status.json"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" || { echo "peer-venv: FAILED to create $VENV"; exit 1; }
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true

needs_torch() {  # $1 = requirement; 0 if its metadata lists torch
  local tmp; tmp="$(mktemp -d)"
  "$VPY" -m pip download -q --no-deps "$1" -d "$tmp" >/dev/null 2>&1 || { rm -rf "$tmp"; return 1; }
  local rc=1
  for w in "$tmp"/*.whl; do
    [ -f "$w" ] || continue
    if "$VPY" - "$w" <<'PYEOF'
import sys, zipfile, re
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
reqs = [l for l in z.read(meta).decode().splitlines() if l.startswith("Requires-Dist:") and "extra ==" not in l]
sys.exit(0 if any(re.match(r"Requires-Dist:\s*torch\b", l) for l in reqs) else 1)
PYEOF
    then rc=0; fi
  done
  rm -rf "$tmp"; return $rc
}

pin_torch_if_needed() {
  if needs_torch "$1"; then
    echo "peer-venv: $1 depends on torch -> installing CPU torch==2.13.0 first"
    "$VPY" -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
      || "$VPY" -m pip install -q torch==2.13.0
  fi
}

nsys_ai="failed"; hta="failed"
pin_torch_if_needed nsys-ai
# nsys-ai reads SQLite through DuckDB's sqlite_scanner extension, which DuckDB downloads at first use from
# extensions.duckdb.org — unreachable here. The same official extension binary is on PyPI
# (duckdb-extension-sqlite-scanner), built for one DuckDB release, so DuckDB is pinned to that release
# (nsys-ai asks for duckdb>=1.0) and the binary is placed in a DuckDB home private to the peer venv.
# The drivers run with HOME=$VENV/home (see benchmarks/peers/common.py).
DUCKDB_VER=1.5.5
if "$VPY" -m pip install -q nsys-ai "duckdb==$DUCKDB_VER" "duckdb-extension-sqlite-scanner==$DUCKDB_VER" \
     >/tmp/peer_nsys_ai_install.log 2>&1 \
   && EXT="$("$VPY" -c 'import duckdb_extension_sqlite_scanner as m, os; print(os.path.dirname(m.__file__))')/extensions/v$DUCKDB_VER/sqlite_scanner.duckdb_extension" \
   && mkdir -p "$VENV/home/.duckdb/extensions/v$DUCKDB_VER/linux_amd64" \
   && cp "$EXT" "$VENV/home/.duckdb/extensions/v$DUCKDB_VER/linux_amd64/" \
   && HOME="$VENV/home" "$VPY" -c "import nsys_ai, duckdb; duckdb.connect().execute('LOAD sqlite_scanner')" 2>>/tmp/peer_nsys_ai_install.log; then
  nsys_ai="ok $("$VPY" -c 'import importlib.metadata as m; print(m.version("nsys-ai"))')"
else
  nsys_ai="failed (see /tmp/peer_nsys_ai_install.log)"
fi

# pandas<3: HTA (traceinsight 0.6.1) breaks on pandas 3 — "TypeError: Invalid value ... for dtype 'int16'"
# in hta/common/trace.py (an in-place assignment into a downcast column); pandas 2 only warns.
for pkg in traceinsight HolisticTraceAnalysis; do
  pin_torch_if_needed "$pkg"
  if [ "${PEER_FULL:-0}" = 1 ]; then
    "$VPY" -m pip install -q "$pkg" "pandas<3" >/tmp/peer_hta_install.log 2>&1
  else
    "$VPY" -m pip install -q --no-deps "$pkg" >/tmp/peer_hta_install.log 2>&1 \
      && "$VPY" -m pip install -q numpy "pandas<3" plotly networkx pydot pyyaml psutil >>/tmp/peer_hta_install.log 2>&1
  fi
  if "$VPY" -c "from hta.trace_analysis import TraceAnalysis" 2>>/tmp/peer_hta_install.log; then
    hta="ok $pkg $("$VPY" -c "import importlib.metadata as m; print(m.version('$pkg'))")"
    break
  fi
  "$VPY" -m pip uninstall -q -y "$pkg" >/dev/null 2>&1
  hta="failed (see /tmp/peer_hta_install.log)"
done

if command -v nsys >/dev/null 2>&1; then nsys_recipes="ok $(nsys --version 2>/dev/null | head -1)"; else
  nsys_recipes="unavailable (nsys binary not installed; not pip-installable)"; fi

"$VPY" - "$STATUS" "$nsys_ai" "$hta" "$nsys_recipes" <<'PYEOF'
import json, sys
out, n, h, r = sys.argv[1:5]
json.dump({"nsys-ai": n, "hta": h, "nsys-recipes": r}, open(out, "w"), indent=1)
PYEOF
echo "peer nsys-ai:      $nsys_ai"
echo "peer HTA:          $hta"
echo "peer nsys recipes: $nsys_recipes"
