"""precompile on a CUDA GPU against torch.compile and eager (issue 25).

Workloads (random-initialised, fixed seeds):
  gpt2_fwd    Hugging Face GPT-2, 4 layers x 256, ids 4x128 with a padded attention mask, logits
  gpt2_train  the same model's training step (LM loss + backward), grads on .grad
  mlp_fwd     MLP 1024-4096-4096-1024, batch 512, forward under no_grad

Reported per workload, all measured in this one run on the same GPU:
  warm start: a fresh process, timed from after ``import torch`` and the model
    and inputs being on the GPU, to the first result (synchronized):
      precompile   torch_precompile.load(python_code, cache) + first call
      compile      torch.compile(fn) + first call, with the Inductor cache directory
                   a first process filled (its warm-cache start)
      eager        eager's own first call
    median of --repeats fresh processes each; whether the precompile process
    imported Triton or Inductor at all;
  steady state: one process, the three side by side, interleaved rounds,
    median per-call time (synchronized) of each.
Goals (issue 25): warm start >= 10x faster than torch.compile's, steady state
no slower than torch.compile's.

Usage (on a GPU machine):  python benchmarks/cuda_bench.py --out benchmarks/results/cuda.md
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time


WORKLOADS = ("gpt2_fwd", "gpt2_train", "mlp_fwd")

# Shared by the parent (build) and every child: defines build(name) -> (model, inputs, fn, no_grad).
SETUP = textwrap.dedent(
    """
    import torch, torch.nn as nn

    def forward(model, *inputs):
        return model(*inputs)

    def train_step(model, *inputs):
        loss = model(*inputs, labels=True)
        loss.backward()
        return loss.detach()

    class GPT2(nn.Module):
        # Children define this class as __main__.GPT2, the parent by exec: one name for both, since
        # an artifact refuses a module of another class than the one it was captured with.
        __module__ = "cuda_bench"

        def __init__(self):
            super().__init__()
            import transformers
            config = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=1000, n_positions=128,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                             eos_token_id=0, bos_token_id=0)
            self.model = transformers.GPT2LMHeadModel(config)

        def forward(self, ids, mask, labels=False):
            out = self.model(input_ids=ids, attention_mask=mask, labels=ids if labels else None)
            return out.loss if labels else out.logits

    def build(name):
        torch.manual_seed(0)
        if name.startswith("gpt2"):
            model = GPT2().cuda()
            ids = torch.randint(1, 1000, (4, 128), device="cuda")
            mask = torch.ones(4, 128, dtype=torch.long, device="cuda")
            mask[1, 96:] = 0  # a padded row
            if name == "gpt2_train":
                return model.train(), (ids, mask), train_step, False
            return model.eval(), (ids, mask), forward, True
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                              nn.Linear(4096, 1024)).cuda()
        return model.eval(), (torch.randn(512, 1024, device="cuda"),), forward, True
    """
)

CHILD = {
    "precompile": """
import torch_precompile
f = torch_precompile.load(open(paths["code"]).read(), open(paths["cache"], "rb").read())
out = f(model, *inputs)
""",
    "compile": """
f = torch.compile(fn)
out = f(model, *inputs)
""",
    "eager": """
out = fn(model, *inputs)
""",
}

CHILD_FRAME = """
import sys, time, json
import torch
{setup}
paths = {paths!r}
model, inputs, fn, no_grad = build({name!r})
torch.cuda.synchronize()
start = time.perf_counter()
with torch.no_grad() if no_grad else torch.enable_grad():
{body}
torch.cuda.synchronize()
elapsed = time.perf_counter() - start
heavy = sorted(k for k in sys.modules if k.split(".")[0] == "triton" or k.startswith(("torch._inductor", "torch._dynamo")))
print("RESULT " + json.dumps({{"seconds": elapsed, "heavy_imported": len(heavy)}}))
"""


def _child(name, method, paths, env):
    body = textwrap.indent(CHILD[method].strip(), "    ")
    code = CHILD_FRAME.format(setup=SETUP, paths=paths, name=name, body=body)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=900)
    for line in result.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{name}/{method} child failed:\n{result.stderr[-3000:]}")


def _steady(name, code, cache, rounds, calls):
    """Median per-call seconds of eager, torch.compile and precompile, interleaved in this process."""
    import torch
    import torch_precompile

    namespace = {}
    exec(SETUP, namespace)
    model, inputs, fn, no_grad = namespace["build"](name)
    runners = {
        "eager": lambda: fn(model, *inputs),
        "compile": (lambda f: lambda: f(model, *inputs))(torch.compile(fn)),
        "precompile": (lambda f: lambda: f(model, *inputs))(torch_precompile.load(code, cache)),
    }
    times = {method: [] for method in runners}
    with torch.no_grad() if no_grad else torch.enable_grad():
        for run in runners.values():  # warm up (compiles torch.compile's graph)
            for _ in range(3):
                run()
        for _ in range(rounds):
            for method, run in runners.items():
                model.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(calls):
                    run()
                torch.cuda.synchronize()
                times[method].append((time.perf_counter() - start) / calls)
    return {method: statistics.median(values) for method, values in times.items()}


def _environment():
    import torch

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip()
    try:
        import importlib.metadata

        triton = importlib.metadata.version("triton")
    except Exception:
        triton = "?"
    return {
        "gpu": smi,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton,
        "python": sys.version.split()[0],
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _ms(seconds):
    return "–" if seconds is None else (f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.2f} s")


def _us(seconds):
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-2 else f"{seconds * 1e3:.2f} ms"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "cuda.md"))
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("cuda_bench.py needs a CUDA GPU")
    env = _environment()
    rows, raw = [], {"environment": env, "workloads": {}}
    with tempfile.TemporaryDirectory() as tmp:
        # torch.compile's cache directory, shared by this process's steady-state run and the
        # children timing its warm start (a first child fills it); precompile's children get an empty one.
        compile_env = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor")}
        os.environ.update(compile_env)
        namespace = {}
        exec(SETUP, namespace)
        for name in args.workloads.split(","):
            try:
                rows.append(_measure(name, namespace, tmp, compile_env, args, raw))
            except Exception as error:  # one broken workload must not hide the others' rows
                print(f"{name} failed: {error}", file=sys.stderr, flush=True)
                rows.append(f"| {name} | failed: {type(error).__name__}: {str(error)[:200]} |" + " |" * 9)
            with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
                json.dump(raw, f, indent=1)
    _write(args, env, rows, raw)


def _measure(name, namespace, tmp, compile_env, args, raw):
    """Build, time and compare one workload; returns its table row."""
    import torch_precompile

    paths = {"code": os.path.join(tmp, f"{name}.py"), "cache": os.path.join(tmp, f"{name}.cache")}
    model, inputs, fn, _ = namespace["build"](name)
    start = time.perf_counter()
    code, cache = torch_precompile.precompile(fn, model, *inputs)
    build_s = time.perf_counter() - start
    with open(paths["code"], "w") as f:
        f.write(code)
    with open(paths["cache"], "wb") as f:
        f.write(cache)
    _child(name, "compile", paths, compile_env)  # fills torch.compile's cache directory
    warm = {}
    for method in ("precompile", "compile", "eager"):
        method_env = compile_env if method == "compile" else {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "empty")}
        results = [_child(name, method, paths, method_env) for _ in range(args.repeats)]
        warm[method] = {
            "seconds": statistics.median(r["seconds"] for r in results),
            "heavy_imported": max(r["heavy_imported"] for r in results),
        }
    steady = _steady(name, code, cache, args.rounds, args.calls)
    raw["workloads"][name] = {"build_s": build_s, "warm": warm, "steady": steady, "cache_bytes": len(cache)}
    print(name, json.dumps(raw["workloads"][name]), flush=True)
    return (
        f"| {name} | {_ms(build_s)} | {_ms(warm['precompile']['seconds'])} "
        f"(+{warm['precompile']['heavy_imported'] - warm['eager']['heavy_imported']}) | {_ms(warm['compile']['seconds'])} | "
        f"{_ms(warm['eager']['seconds'])} | **{warm['compile']['seconds'] / warm['precompile']['seconds']:.0f}x** | "
        f"{_us(steady['precompile'])} | {_us(steady['compile'])} | {_us(steady['eager'])} | "
        f"{steady['compile'] / steady['precompile']:.2f}x |"
    )


def _write(args, env, rows, raw):
    text = "\n".join(
        [
            "# precompile on CUDA: warm start and steady state against torch.compile and eager",
            "",
            f"Measured {env['date']} on {env['gpu']} (GPU, driver), torch {env['torch']} (CUDA {env['cuda']}), "
            f"Triton {env['triton']}, Python {env['python']}; `python benchmarks/cuda_bench.py` "
            f"(repeats {args.repeats}, steady {args.rounds} rounds x {args.calls} calls).",
            "",
            "Warm start: a fresh process, from after `import torch` with the model and inputs on the GPU, to the first "
            "result (synchronized), median of the fresh processes. precompile: `load()` + first call (in brackets: "
            "how many more Triton, Inductor or Dynamo modules that process imported than eager's, whose imports "
            "of the model library, e.g. transformers, pull some in); torch.compile: its warm-cache start "
            "(a first process filled its Inductor cache directory); eager: its own first call. Steady: median "
            "per-call time in one process, the three interleaved; last column torch.compile's time over precompile's.",
            "",
            "| workload | precompile build | precompile warm start | torch.compile warm start | eager first call "
            "| warm start vs torch.compile | precompile steady | torch.compile steady | eager steady | steady vs torch.compile |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
