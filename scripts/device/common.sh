# Sourced by the device scripts: the environment (server wheels installed in /tmp/site), $OUT, the work
# folder $W, the model $M, and `run NAME LIMIT CMD...`: CMD under `timeout LIMIT` with its output in
# $W/NAME.log; prints the exit code, the seconds and the log's last $TAILN (3) lines.
# SRC: the source tree to run (a branch's, carried under .br/; default src)
export PYTHONPATH=/tmp/site:${SRC:-src} PYTHONUNBUFFERED=1
# A fresh machine has no server wheels; the carried .whl folder has them (README "On the H200").
if [ ! -d /tmp/site/fastapi ] && ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > /dev/null 2>&1
fi
# httptools is a dependency (pyproject) the image lacks: without its wheel uvicorn falls back to h11, ~0.45 ms more
# to the first token at 1024 ids (docs/performance.md, 2026-12-06), as every H200 table from then to 2026-12-07 ran
python3 -c "import httptools" 2> /dev/null ||
  echo "WARNING: no httptools: the server runs h11 (../shared/tools/gpu-wheels httptools uvloop, then carry .whl)"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/w; mkdir -p $W
M=configs/Qwen3.6-35B-A3B
run() { local name=$1 limit=$2; shift 2; echo "== $name"; local s=$SECONDS
  timeout "$limit" "$@" > "$W/$name.log" 2>&1; echo "rc=$? in $((SECONDS - s)) s"; tail -n "${TAILN:-3}" "$W/$name.log"; }
# `start_server PORT LOG [hyserve serve flags...]`: `hyserve serve` on dummy weights in the background (its pid in
# $SERVER_PID, its output in LOG), then wait until it answers /v1/models; 1 (and LOG's tail) if it dies first or is
# not up after ~2 minutes.
start_server() {
  local port=$1 log=$2; shift 2
  python3 -m hyserve serve --model $M --load-format dummy --port "$port" --disable-uvicorn-access-log "$@" \
    > "$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 240); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/v1/models', timeout=2)" \
      2> /dev/null && return 0
    kill -0 $SERVER_PID 2> /dev/null || { echo "server died"; tail -n 30 "$log"; return 1; }
    sleep 0.5
  done
  echo "server not up"; tail -n 30 "$log"; return 1
}
# `depth_model L`: Qwen3.6-35B-A3B's config.json cut to its first L layer types (full widths: every kernel at its
# production shape) in /tmp/qwen-depth-L, for runs where the whole model does not fit (an H100); prints the folder.
depth_model() {
  local d=/tmp/qwen-depth-$1
  mkdir -p $d
  python3 - "$M/config.json" "$d/config.json" "$1" <<'PY'
import json, sys
raw = json.load(open(sys.argv[1]))
text = raw.get("text_config", raw)
n = int(sys.argv[3])
text["layer_types"] = text["layer_types"][:n]
text["num_hidden_layers"] = n
json.dump(raw, open(sys.argv[2], "w"), indent=1)
PY
  echo $d
}
# `variant NAME SED-SCRIPT...`: .v/NAME/src = a copy of src with the file $F (a path under src) edited by each sed
# script in turn (the probes of the *_anatomy.sh scripts: timing only); says so if the edits changed nothing.
variant() {
  local name=$1; shift
  rm -rf .v/$name; mkdir -p .v/$name && cp -r src .v/$name/
  for e in "$@"; do sed -i "$e" .v/$name/src/$F; done
  if cmp -s src/$F .v/$name/src/$F; then echo "variant $name: the edit did not apply"; fi
}
