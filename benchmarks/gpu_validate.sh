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
#    at overload, 90%, 50% of the measured capacity and idle (REQUESTS requests each, default
#    300), with --replay-decisions (the TTFT error split into cost model and decisions) and,
#    on a trace built with its text (TRACE), --search-latency trace (its faiss search run for
#    real on both sides' terms);
# 3. checks --overlap-swap on CUDA (layer-wise copies on their own stream);
# 4. where vLLM's CUDA build is installed, profiles vLLM and validates its three systems (vllm,
#    vllm-apc, and ragcache: the knowledge tree inside vLLM as its host tier) on the same loads,
#    each printing one JSON object whose `loads` rows carry the raw ttft_mean_error,
#    ttft_p90_abs_error, throughput_error and hit_agreement; validate sets vLLM's terms itself
#    (no --config) and says what it set.
set -euo pipefail

OUT=${1:?usage: benchmarks/gpu_validate.sh OUT_DIR [REQUESTS] [TRACE]}
REQUESTS=${2:-300}
TRACE=${3:-mmlu}  # a trace built with its text searches for real (--search-latency trace)
LOADS=over,90,50,idle
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" - <<'EOF'
import platform
print("python:", platform.python_version())
missing = []
for module in ("torch", "transformers", "numpy", "pandas", "pyarrow", "scipy", "matplotlib",
               "simpy", "typer", "rich", "tomli_w", "cython"):
    try:
        m = __import__(module)
        print(f"{module}: {getattr(m, '__version__', '?')}")
    except ImportError:
        missing.append(module)
if missing:
    raise SystemExit(f"missing Python packages: {', '.join(missing)}")
import torch
print("cuda:", torch.version.cuda, "available:", torch.cuda.is_available())
if not torch.cuda.is_available():
    raise SystemExit("no CUDA device visible to torch")
print("device:", torch.cuda.get_device_name(0))
EOF
} > "$OUT/machine.txt" 2>&1 || { cat "$OUT/machine.txt"; exit 3; }
cat "$OUT/machine.txt"

PROFILE="$OUT/cuda-mistral-7b-fp16.json"
echo "== profile (quick plan) =="
time "$PY" -m ragsim profile --model mistral-7b --device cuda --dtype fp16 --quick \
  --name h200-mistral-7b-measured --out "$PROFILE" 2>&1 | tee "$OUT/profile.txt"

echo "== derived vs measured =="
"$PY" - "$PROFILE" "$OUT/derived_vs_measured.json" <<'EOF'
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

echo "== validate on CUDA =="
time "$PY" -m ragsim validate --backend torch --device cuda --profile "$PROFILE" \
  --trace "$TRACE" --system ragcache --requests "$REQUESTS" --loads "$LOADS" \
  --search-latency trace --replay-decisions --json --out "$OUT/validate" \
  > "$OUT/validate.json" 2> "$OUT/validate.txt"
cat "$OUT/validate.json"

echo "== --overlap-swap on CUDA: layer-wise copies on their own stream =="
# tight GPU memory, room on the host: host hits every few requests; the same run with and without
# the overlap must cache the same tokens (decisions) and the overlap's prefills must not be slower
for overlap in "" "--overlap-swap"; do
  "$PY" -m ragsim run --backend torch --device cuda --profile "$PROFILE" --trace mmlu \
    --system ragcache --requests 60 --arrival sequential --gpu-mem 2GiB --host-mem 16GiB \
    $overlap --json > "$OUT/overlap${overlap:+-on}.json"
done
"$PY" - "$OUT" <<'EOF'
import json, sys
off, on = (json.load(open(f"{sys.argv[1]}/{name}.json")) for name in ("overlap", "overlap-on"))
keys = ("token_hit_rate", "token_hit_rate_host", "engine_layerwise_swap_ins", "engine_swap_in_s",
        "ttft_mean_s")
print(json.dumps({k: [off.get(k), on.get(k)] for k in keys}, indent=1))
EOF

echo "== vLLM on CUDA (when the machine has vLLM's CUDA build) =="
if "$PY" -c "import vllm, vllm.engine" >/dev/null 2>&1; then
  VPROFILE="$OUT/cuda-vllm-mistral-7b.json"
  "$PY" -m ragsim profile --engine vllm --model mistral-7b --device cuda --dtype fp16 --quick \
    --block-tokens 16 --out "$VPROFILE" 2>&1 | tee "$OUT/profile-vllm.txt" || true
  # validate gives both sides vLLM's terms by itself (no speculation, FCFS, its block, batch
  # KV sharing, the mixed scheduler) and prints what it set
  for system in vllm vllm-apc ragcache; do
    "$PY" -m ragsim validate --backend vllm --device cuda --profile "$VPROFILE" \
      --trace "$TRACE" --system "$system" --requests "$REQUESTS" --loads "$LOADS" \
      --search-latency trace --replay-decisions --json --out "$OUT/validate-vllm-$system" \
      > "$OUT/validate-vllm-$system.json" 2> "$OUT/validate-vllm-$system.txt" || true
    cat "$OUT/validate-vllm-$system.json"
  done
else
  echo "vLLM is not installed here: the vLLM lane is skipped (nothing can be installed on it)"
fi
