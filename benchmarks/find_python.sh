# Sourced by the GPU scripts: sets PY to $PYTHON, else .venv/bin/python, else python3 or python on the PATH; exits 3
# (incomplete) naming the script ($1) when there is none.
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in .venv/bin/python python3 python; do
    if command -v "$candidate" >/dev/null 2>&1; then PY="$candidate"; break; fi
  done
fi
if [ -z "$PY" ]; then
  echo "$1: INCOMPLETE: no python here (set PYTHON=...)" >&2
  exit 3
fi
