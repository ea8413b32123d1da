#!/usr/bin/env bash
# One short run on a CUDA machine: what only a GPU can show.
#
#   benchmarks/gpu_validate.sh OUT_DIR [REQUESTS] [TRACE]
#
# Fails fast (exit 3, before any GPU time is spent) when torch sees no CUDA device or a package
# is missing. The protocol is the CPU one (benchmarks/validate_at_rest.sh, docs/validation.md):
# raw errors are the verdict, the speed probe a diagnostic beside them.
#
# 1. measures `ragsim profile --device cuda` for Mistral-7B in fp16 (the architecture of the
#    derived h200-mistral-7b profile; the quick plan) and compares it with the derived profile
#    at a few points (derived_vs_measured.json);
# 2. runs `ragsim validate --backend torch --device cuda` on that measured profile for ragcache
#    at overload, 90% and 50% of the measured capacity (REQUESTS requests each, default 300)
#    and idle (IDLE_REQUESTS, default 60: sequential requests take minutes), with --replay-decisions (the TTFT error split into cost model and decisions) and,
#    on a trace built with its text (TRACE, a path), --search-latency trace (its faiss search
#    run for real on both sides' terms; a built-in trace has no measured search times, so both
#    sides model its search alike);
# 3. checks --overlap-swap on CUDA (layer-wise copies on their own stream);
# 4. where vLLM's CUDA build is installed, profiles vLLM and validates its three systems (vllm,
#    vllm-apc, and ragcache: the knowledge tree inside vLLM as its host tier) on the same loads,
#    each printing one JSON object whose `loads` rows carry the raw ttft_mean_error,
#    ttft_p90_abs_error, throughput_error and hit_agreement; validate sets vLLM's terms itself
#    (no --config) and says what it set.
#
# validate and run fit the torch engine's pool and batch limit to the GPU by themselves and say
# what they set (ragsim/realrun/memory.py: its padded decode batch lives beside the pool).
#
# Device time is scarce, so every stage has its own time limit (seconds, below) and a stage that
# fails or runs out leaves the next ones to run: stages.tsv says how each ended and how long it
# took. The same script dry-runs on a CPU with a small model, to find its mistakes before a GPU
# is spent on them:
#   DEVICE=cpu DTYPE=fp32 MODEL_ARGS="--layers 2 --hidden 256" benchmarks/gpu_validate.sh OUT 40
set -uo pipefail

OUT=${1:?usage: benchmarks/gpu_validate.sh OUT_DIR [REQUESTS] [TRACE]}
REQUESTS=${2:-300}
TRACE=${3:-mmlu}  # a trace built with its text searches for real (--search-latency trace)
# idle is sequential, each request alone to its last token: 300 of them took minutes a load on
# the first H200 run, so idle runs apart with fewer requests (IDLE_REQUESTS; 0: none)
LOADS=${LOADS:-over,90,50}
IDLE_REQUESTS=${IDLE_REQUESTS:-60}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-fp16}
MODEL=${MODEL:-mistral-7b}
MODEL_ARGS=${MODEL_ARGS:-}  # e.g. "--layers 2 --hidden 256" for a dry run on a CPU
LIMIT_PROFILE_S=${LIMIT_PROFILE_S:-200}  # the quick plan took 118 s on an H200
LIMIT_VALIDATE_S=${LIMIT_VALIDATE_S:-270}
LIMIT_IDLE_S=${LIMIT_IDLE_S:-150}
LIMIT_OVERLAP_S=${LIMIT_OVERLAP_S:-60}
LIMIT_VLLM_S=${LIMIT_VLLM_S:-600}
OVERLAP_REQUESTS=${OVERLAP_REQUESTS:-40}  # 0: no overlap check
VALIDATE_ARGS=${VALIDATE_ARGS:-}  # more options for validate, e.g. "--gpu-mem 48GiB"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
printf "stage\trc\tseconds\n" > "$OUT/stages.tsv"
exec 3>&1  # the stages' own notes, whatever their commands' output is redirected to
# a trace built with its text (a path) searches its faiss index for real; a built-in one has no
# measured search times, so both sides model its search alike
SEARCH=()
[ -e "$TRACE" ] && SEARCH=(--search-latency trace)

# stage NAME LIMIT_S COMMAND...: runs COMMAND under a time limit, notes how it ended, and never
# stops the script (a later stage may still have something to show)
stage() {
  local name=$1 limit=$2 started rc
  shift 2
  echo "== $name (at most ${limit}s) ==" >&3
  started=$(date +%s)
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  printf "%s\t%s\t%s\n" "$name" "$rc" "$(( $(date +%s) - started ))" >> "$OUT/stages.tsv"
  [ "$rc" = 124 ] && echo "$name: stopped at its limit of ${limit}s" >&3
  return 0
}

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  DEVICE=$DEVICE "$PY" - <<'EOF'
import os, platform
print("python:", platform.python_version())
missing = []
for module in ("torch", "transformers", "numpy", "pandas", "pyarrow", "scipy", "matplotlib",
               "simpy", "typer", "rich", "tomli_w", "cachetools"):
    try:
        m = __import__(module)
        print(f"{module}: {getattr(m, '__version__', '?')}")
    except ImportError:
        missing.append(module)
if missing:
    raise SystemExit(f"missing Python packages: {', '.join(missing)}")
import torch
print("cuda:", torch.version.cuda, "available:", torch.cuda.is_available())
if os.environ["DEVICE"].startswith("cuda"):
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch")
    print("device:", torch.cuda.get_device_name(0))
EOF
} > "$OUT/machine.txt" 2>&1 || { cat "$OUT/machine.txt"; exit 3; }
cat "$OUT/machine.txt"

PROFILE="$OUT/$DEVICE-$MODEL-$DTYPE.json"
# REUSE_PROFILE: a profile file or a shipped name, instead of measuring one (a dry run's second
# try; or h200-torch-mistral-7b on an H200, which saves the quick plan's two minutes)
if [ -f "${REUSE_PROFILE:-}" ]; then
  cp "$REUSE_PROFILE" "$PROFILE"
elif [ -n "${REUSE_PROFILE:-}" ]; then
  PROFILE=$REUSE_PROFILE
else
# shellcheck disable=SC2086  # MODEL_ARGS is a list of options
stage profile "$LIMIT_PROFILE_S" "$PY" -m ragsim profile --model "$MODEL" $MODEL_ARGS \
  --device "$DEVICE" --dtype "$DTYPE" --quick --name "$DEVICE-$MODEL-measured" \
  --out "$PROFILE" > "$OUT/profile.txt" 2>&1
tail -40 "$OUT/profile.txt"
fi
if [ -z "${REUSE_PROFILE:-}" ] && [ ! -f "$PROFILE" ]; then
  # still worth the device time already spent: the derived profile's raw errors on the GPU
  echo "no profile was measured: the stages below price with the derived h200-$MODEL"
  PROFILE="h200-$MODEL"
fi

stage derived-vs-measured 60 "$PY" - "$PROFILE" "$OUT/derived_vs_measured.json" <<'EOF'
import json, sys
from ragsim.profiles.profile import load_profile
measured, derived = load_profile(sys.argv[1]), load_profile("h200-mistral-7b")
points = [(0, 128), (0, 1024), (1024, 256), (2048, 1024), (0, 4096)]
rows = [{"cached": a, "new": b, "measured_s": measured.prefill_s(a, b),
         "derived_s": derived.prefill_s(a, b),
         "derived_over_measured": derived.prefill_s(a, b) / measured.prefill_s(a, b)}
        for a, b in points]
decode = [{"batch": n, "context": c, "measured_s": measured.decode_s(n, c),
           "derived_s": derived.decode_s(n, c),
           "derived_over_measured": derived.decode_s(n, c) / measured.decode_s(n, c)}
          for n, c in [(1, 512), (16, 2048)]]
report = {"prefill": rows, "decode": decode,
          "h2d_bytes_per_s": {"measured": measured.transfers.host_to_device_bytes_per_s,
                              "derived": derived.transfers.host_to_device_bytes_per_s}}
json.dump(report, open(sys.argv[2], "w"), indent=1)
print(json.dumps(report, indent=1))
EOF

# the profiler's decode path against the engine's (buffer layout, mask, appending) on the same
# shapes: on the first H200 run the engine's steps took ~3x what the profile timed
# shellcheck disable=SC2086
stage decode-paths 150 "$PY" benchmarks/decode_paths.py --device "$DEVICE" --dtype "$DTYPE" \
  $MODEL_ARGS --kernels --run 8 --profile "$PROFILE" > "$OUT/decode_paths.txt" 2>&1
head -8 "$OUT/decode_paths.txt"

stage validate "$LIMIT_VALIDATE_S" "$PY" -m ragsim validate --backend torch --device "$DEVICE" \
  --profile "$PROFILE" --trace "$TRACE" --system ragcache --requests "$REQUESTS" \
  --loads "$LOADS" "${SEARCH[@]}" --replay-decisions --json --out "$OUT/validate" $VALIDATE_ARGS \
  > "$OUT/validate.json" 2> "$OUT/validate.txt"
tail -30 "$OUT/validate.txt"
if [ "$IDLE_REQUESTS" != 0 ]; then
  # shellcheck disable=SC2086
  stage validate-idle "$LIMIT_IDLE_S" "$PY" -m ragsim validate --backend torch \
    --device "$DEVICE" --profile "$PROFILE" --trace "$TRACE" --system ragcache \
    --requests "$IDLE_REQUESTS" --loads idle "${SEARCH[@]}" --replay-decisions --json \
    --out "$OUT/validate-idle" $VALIDATE_ARGS > "$OUT/validate-idle.json" \
    2> "$OUT/validate-idle.txt"
  tail -5 "$OUT/validate-idle.txt"
fi
"$PY" - "$OUT/validate.json" "$OUT/validate-idle.json" <<'EOF' || true
import json, sys
keys = ("load", "ttft_mean_error", "ttft_p90_abs_error", "throughput_error", "hit_agreement",
        "cost_model_error", "decision_error", "dominant_component")
for name in sys.argv[1:]:
    try:
        report = json.load(open(name))
    except (OSError, ValueError):
        continue
    for row in report.get("loads", []):
        print({k: row.get(k) for k in keys})
EOF

# tight GPU memory, room on the host: host hits every few requests; the same run with and without
# the overlap must cache the same tokens (decisions) and the overlap's prefills must not be slower
[ "$OVERLAP_REQUESTS" = 0 ] || for overlap in "" "--overlap-swap"; do
  stage "run${overlap:+-overlap}" "$LIMIT_OVERLAP_S" "$PY" -m ragsim run --backend torch \
    --device "$DEVICE" --profile "$PROFILE" --trace mmlu --system ragcache \
    --requests "$OVERLAP_REQUESTS" \
    --arrival sequential --gpu-mem 1GiB --host-mem 16GiB $overlap --json \
    > "$OUT/overlap${overlap:+-on}.json" 2> "$OUT/overlap${overlap:+-on}.txt"
done
[ "$OVERLAP_REQUESTS" = 0 ] || "$PY" - "$OUT" <<'EOF' || true
import json, sys
off, on = (json.load(open(f"{sys.argv[1]}/{name}.json")) for name in ("overlap", "overlap-on"))
keys = ("token_hit_rate", "token_hit_rate_host", "engine_layerwise_swap_ins", "engine_swap_in_s",
        "ttft_mean_s")
print(json.dumps({k: [off.get(k), on.get(k)] for k in keys}, indent=1))
EOF

echo "== vLLM on CUDA (when the machine has vLLM's CUDA build) =="
if [ "$DEVICE" != cpu ] && "$PY" -c "import vllm, vllm.engine" >/dev/null 2>&1; then
  VPROFILE="$OUT/cuda-vllm-$MODEL.json"
  # validate gives both sides vLLM's terms by itself (no speculation, FCFS, its block, batch
  # KV sharing, the mixed scheduler) and prints what it set
  vllm_lane() {
    "$PY" -m ragsim profile --engine vllm --model "$MODEL" --device cuda --dtype "$DTYPE" \
      --quick --block-tokens 16 --out "$VPROFILE" > "$OUT/profile-vllm.txt" 2>&1 || return
    for system in vllm vllm-apc ragcache; do
      "$PY" -m ragsim validate --backend vllm --device cuda --profile "$VPROFILE" \
        --trace "$TRACE" --system "$system" --requests "$REQUESTS" --loads "$LOADS" \
        ${SEARCH_OPTION:-} --replay-decisions --json --out "$OUT/validate-vllm-$system" \
        > "$OUT/validate-vllm-$system.json" 2> "$OUT/validate-vllm-$system.txt"
      cat "$OUT/validate-vllm-$system.json"
    done
  }
  export -f vllm_lane
  SEARCH_OPTION="${SEARCH[*]}"
  export PY MODEL DTYPE OUT VPROFILE TRACE REQUESTS LOADS SEARCH_OPTION
  stage vllm "$LIMIT_VLLM_S" bash -c vllm_lane
else
  echo "vLLM's CUDA build is not installed here: the vLLM lane is skipped"
fi
cat "$OUT/stages.tsv"
