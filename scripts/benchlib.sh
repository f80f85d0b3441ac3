# shellcheck shell=bash
# benchlib.sh - shell pieces the benchmark scripts share (sourced, not run).

# The median of the numbers on stdin, one per line (the mean of the middle two
# for an even count).
median() {
  sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# The mpirun of the MPI benchmarks, into the array `mpi`: ranks oversubscribed
# on this machine, TCP over loopback (the transport between machines), allowed
# as root (CI containers run as root). Callers add -np N.
mpi_init() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  mpi=(mpirun --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo
       --mca oob_tcp_if_include lo)
}

# A TCP port on 127.0.0.1 that nothing listens on right now.
free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# serve_start LLMSERVE LOG ARGS...: runs `LLMSERVE serve --port P ARGS...` in
# the background, its output in LOG; sets `server` (its pid) and `port`, and
# returns once /health answers. If the server dies first, prints LOG and
# exits 1. Callers set `trap serve_stop EXIT` before calling it.
serve_start() {
  local bin=$1 log=$2
  shift 2
  port=$(free_port)
  "$bin" serve --port "$port" "$@" >"$log" 2>&1 &
  server=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
    kill -0 "$server" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null
}

# Stops the server serve_start began, if any.
serve_stop() {
  if [ -n "${server:-}" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
}

# plot_md OUT.svg MD NOTE "XCOL YCOL..." PLOT-TABLE-OPTIONS...: draws MD's
# table with scripts/plot-table into OUT.svg (the -o of the bench scripts);
# does nothing when OUT.svg is empty. NOTE (the command and the machine) goes
# under the plot.
plot_md() {
  local out=$1 md=$2 note=$3 cols
  read -r -a cols <<< "$4"
  shift 4
  [ -n "$out" ] || return 0
  scripts/plot-table --out "$out" --note "$note" "$@" "$md" "${cols[@]}"
}

# The CPU's model name, core count and the load average now, for the notes
# under tables and plots (a shared machine's figures say how shared it was).
machine() {
  echo "$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores," \
    "load average $(cut -d' ' -f1 /proc/loadavg)"
}

# weight_macs MODEL.gguf: "MACS QUANTIZED": the weight products' multiply-adds
# per token (every matrix but the embedding, a lookup, unless it is also the
# classifier; attention not counted) and 1 when a matrix is quantized (the
# int8 path), else 0 (the f32 path: F32 and F16 weights).
weight_macs() {
  /usr/bin/python3 - "$1" <<'PY'
import sys
sys.path.insert(0, "scripts")
import gguflib
r = gguflib.Reader(sys.argv[1])
mats = [t for t in r.tensors.values() if len(t.ne) >= 2 and t.ne[1] > 1 and
        not (t.name == "token_embd.weight" and "output.weight" in r.tensors)]
macs = sum(t.ne[0] * t.ne[1] for t in mats)
print(macs, int(any(t.ggml_type not in (0, 1) for t in mats)))  # GGML types 0, 1: F32, F16
PY
}

# peak_of ROOFLINE-OUTPUT QUANTIZED: "GMAC/S NAME" of the ceiling the weight
# products run on: the first int8 (quantized) or f32 line of scripts/roofline,
# which lists the levels the engine dispatches to best first.
peak_of() {
  local kind=f32
  [ "$2" = 1 ] && kind=int8
  echo "$1" | awk -v k="$kind" '$1 == k {print $4, k " " $2; exit}'
}
