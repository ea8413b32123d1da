"""Decode steps timed the profiler's way and the engine's way, on the same model and shapes.

On an H200 (Mistral-7B fp16, transformers 5.17) the profile timed a decode step of 1-16 rows over
512-2,048 tokens at 23-29 ms, and its speed probes during the run agreed (24.7 ms for 4 x 512),
yet the engine's own decode steps in the run took ~70 ms (305 steps: priced/measured median
0.36). The two paths differ in the batch's layout, not in the model:

* profiler: ``prepare`` + ``forward`` over rows of one length (no mask), then ``decode`` and
  ``undo_decode`` at the same length, again and again;
* engine (``realrun/iterations.py``): a rebuilt batch, each layer a buffer with spare rows
  and tokens (``decode_buffer_shape``) whose first rows are the cache (views, not the whole
  buffer), a mask wherever rows differ in length (``decode_step_batch``), and steps that append
  and grow the buffer. Both helpers are the engine's own, so this path follows the engine.

This times each path for a few steps and prints ms per step and the ratios, so a GPU session
can tell which difference costs the time (run it with ``--kernels`` for the top CUDA kernels of
each under torch.profiler). With ``--run N --profile P`` it also serves N sequential requests
for real (``ragsim.simulate(backend="torch")``) under torch.profiler and prints the run's wall
time beside the device time of its kernels: device time near the profile's prices with a wall
time three times longer puts the gap on the host, around the model's calls::

    python benchmarks/decode_paths.py --device cuda --dtype fp16 \
        --run 8 --profile h200-torch-mistral-7b                               # Mistral-7B
    python benchmarks/decode_paths.py --layers 2 --hidden 256 \
        --run 4 --profile cpu-mistral-7b-l2-h256                              # a CPU check
"""

from __future__ import annotations

import argparse
import time

from ragsim.profiles.decode_layout import decode_buffer_shape
from ragsim.profiles.models import resolve_model, scaled_down
from ragsim.profiles.torch_model import Row, TorchModel, decode_step_batch


def profiler_path(model: TorchModel, rows: int, context: int, steps: int) -> float:
    """The profile's decode: one length, no mask, the same step over and over."""
    batch = model.prepare([Row(None, list(range(1, context + 1)), 0) for _ in range(rows)])
    model.forward(batch)
    ids = list(range(rows))
    model.decode(batch, ids)  # warm-up: the buffer grows once, as in the profile's warm-up
    model.undo_decode(batch)
    model.sync()
    started = time.perf_counter()
    for _ in range(steps):
        model.decode(batch, ids)
        model.undo_decode(batch)
    model.sync()
    return (time.perf_counter() - started) / steps


def engine_path(model: TorchModel, lengths: list[int], steps: int) -> float:
    """The engine's decode: a rebuilt batch in buffers with spare rows and tokens (views of
    their first rows), a mask when lengths differ, steps that append."""
    torch = model.torch
    n, longest = len(lengths), max(lengths)
    buffer_rows, buffer_tokens = decode_buffer_shape(n, longest)
    heads, dim = model.config.num_key_value_heads, model.config.head_dim
    cache = model.new_cache()
    for layer in range(model.num_layers):
        keys = torch.randn(buffer_rows, heads, buffer_tokens, dim, device=model.device,
                           dtype=model.dtype)
        values = torch.randn_like(keys)
        cache.layers[layer].adopt(keys[:n], values[:n], longest)
    batch = decode_step_batch(model, cache, lengths, longest, list(range(n)))
    model.forward(batch)  # the rebuilt batch's first step
    ids = list(range(n))
    model.sync()
    started = time.perf_counter()
    for _ in range(steps):
        model.decode(batch, ids)
    model.sync()
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads (the shipped CPU profile's engine runs on one)")
    parser.add_argument("--kernels", action="store_true",
                        help="the top kernels of each path (torch.profiler)")
    parser.add_argument("--run", type=int, default=0,
                        help="also serve this many sequential requests for real, profiled")
    parser.add_argument("--profile", default="",
                        help="with --run: the cost profile of the model served")
    args = parser.parse_args()
    if args.run and not args.profile:
        parser.error("--run needs --profile (the model the run serves is the profile's)")
    spec = resolve_model("mistral-7b")
    if args.layers or args.hidden:
        spec = scaled_down(spec, layers=args.layers, hidden=args.hidden)
    dtype = args.dtype or ("fp32" if args.device == "cpu" else spec.dtype)
    model = TorchModel(spec.with_dtype(dtype), device=args.device, dtype=dtype,
                       threads=args.threads if args.device == "cpu" else None)
    print(f"{spec.name}: {spec.num_layers} layers, hidden {spec.hidden_size}, {dtype}, "
          f"{args.device}; ms per decode step ({args.steps} steps)")
    # ragged: rows from the context down to about half of it (a loaded engine's batch), whose
    # step the simulator prices at their mean context; the engine pads them to the longest
    print(f"{'rows':>5} {'context':>8} {'profiler':>9} {'engine':>9} {'ragged':>9} "
          f"{'at mean':>9} {'engine/profiler':>16} {'ragged/profiler':>16} "
          f"{'ragged/at mean':>15}")
    for rows, context in [(1, 512), (1, 2048), (4, 512), (8, 1024), (16, 512), (16, 2048)]:
        a = profiler_path(model, rows, context, args.steps)
        b = engine_path(model, [context] * rows, args.steps)
        ragged = [context - (i * context) // (2 * rows) for i in range(rows)] if rows > 1 \
            else [context]
        c = engine_path(model, ragged, args.steps)
        mean = profiler_path(model, rows, round(sum(ragged) / rows), args.steps) \
            if rows > 1 else a
        print(f"{rows:>5} {context:>8} {a * 1e3:>9.2f} {b * 1e3:>9.2f} {c * 1e3:>9.2f} "
              f"{mean * 1e3:>9.2f} {b / a:>16.2f} {c / a:>16.2f} {c / mean:>15.2f}")
        if args.kernels:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + (
                [ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
            for name, run, shape in (("profiler", profiler_path, (rows, context)),
                                     ("engine", engine_path, (ragged,))):
                with profile(activities=activities) as prof:
                    run(model, *shape, 3)
                key = ("self_cuda_time_total" if args.device.startswith("cuda")
                       else "self_cpu_time_total")
                print(f"-- {name} path, {rows} x {context}:")
                print(prof.key_averages().table(sort_by=key, row_limit=8))
    if args.run:
        served_run(args.device, args.profile, args.run)


def served_run(device: str, profile: str, requests: int) -> None:
    """N sequential requests served for real under torch.profiler: wall time against the
    device time of the kernels, and the kernels that took it."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    import ragsim

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    started = time.perf_counter()
    with torch_profile(activities=activities) as prof:
        run = ragsim.simulate(backend="torch", device=device, profile=profile,
                              requests=requests, arrival="sequential")
    wall_s = time.perf_counter() - started
    from torch.autograd import DeviceType

    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    # the kernels' own time (on CUDA the ops that launch them report it too: counted once)
    device_s = sum(getattr(e, key) for e in events
                   if not cuda or e.device_type == DeviceType.CUDA) / 1e6
    summary = run.summary
    decode = summary.get("cost_model_errors", {}).get("decode", {})
    print(f"served {summary['requests_completed']} requests in {wall_s:.2f} s wall (the "
          f"profiler's own cost included); kernels {device_s:.2f} s of "
          f"{'device' if cuda else 'host'} time; decode steps measured "
          f"{decode.get('measured_s', float('nan')):.2f} s against "
          f"{decode.get('predicted_s', float('nan')):.2f} s priced over "
          f"{decode.get('iterations', 0)} steps")
    print(events.table(sort_by=key, row_limit=12))


if __name__ == "__main__":
    main()
