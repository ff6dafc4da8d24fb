"""Serving a language model: generate() from precompiled artifacts against torch.compile and eager.

Models (random-initialised from configs, fixed seed): ``llama`` (Llama-style
decoder, 4 layers x 256, 8 query / 2 key-value heads) and ``gpt2`` (GPT-2,
4 layers x 256).  Request: greedy ``generate()`` of 32 new tokens after an
8-token prompt, batch 1, a DynamicCache.

Rows, all measured in this run on this machine:

* first token from a fresh process: the wall time from launching the
  process to ``generate(max_new_tokens=1)`` returning, median of
  ``--repeats`` processes; imports and model build, which every method pays
  alike, are reported apart, and the row's key number is the rest (load /
  compile + first token):
    precompile   generation.load of the artifact files + first token
    compile      ``model.forward = torch.compile(model.forward)`` + first token,
                 with an Inductor cache directory a first process filled
                 (torch.compile's warm-cache start)
    eager        eager's first token
* steady per-token decode: one process, the three methods interleaved in
  rounds; per method the median over rounds of (generate 33 tokens -
  generate 1 token) / 32; ratios against eager and torch.compile.
* whether each method's 32 tokens equal eager's.

Children import from cached bytecode (``PYTHONDONTWRITEBYTECODE`` unset), as a
normal install does.

Goals: load + first token >= 50x faster than torch.compile's warm start;
steady per-token decode <= torch.compile's and <= 0.8x eager.

Usage:  python benchmarks/serving_bench.py [--repeats 3] [--rounds 5] [--models llama,gpt2] [--out FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time


MODELS = ("llama", "gpt2")
PROMPT, NEW_TOKENS = 8, 32

# Shared by the parent and every child: build(name) -> (model, ids, mask).
SETUP = textwrap.dedent(
    """
    import time
    T0 = time.perf_counter()
    import torch, transformers
    T_IMPORT = time.perf_counter() - T0
    torch.set_num_threads(max(1, torch.get_num_threads()))

    def build(name):
        torch.manual_seed(0)
        if name == "llama":
            config = transformers.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688,
                num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=128,
                bos_token_id=1, eos_token_id=None, pad_token_id=0)
            model = transformers.LlamaForCausalLM(config)
        else:
            config = transformers.GPT2Config(vocab_size=1024, n_embd=256, n_layer=4, n_head=4, n_positions=128,
                bos_token_id=1, eos_token_id=None, pad_token_id=0)
            model = transformers.GPT2LMHeadModel(config)
        ids = torch.randint(3, 1024, (1, %(prompt)d), generator=torch.Generator().manual_seed(1))
        return model.eval(), ids, torch.ones_like(ids)

    def generate(model, ids, mask, tokens):
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                                  do_sample=False)
    """
) % {"prompt": PROMPT}

# A fresh process's first token; prints a JSON line.  argv: method model directory
FIRST_TOKEN = SETUP + textwrap.dedent(
    """
    import json, os, sys
    method, name, directory = sys.argv[1:4]
    t = time.perf_counter()
    model, ids, mask = build(name)
    t_build = time.perf_counter() - t
    t = time.perf_counter()
    if method == "precompile":
        from torch_precompile import generation
        runnables = generation.load(directory, model)
        with generation.serving(model, runnables):
            generate(model, ids, mask, 1)
    else:
        if method == "compile":
            model.forward = torch.compile(model.forward)
        generate(model, ids, mask, 1)
    t_first = time.perf_counter() - t
    print(json.dumps({"import": T_IMPORT, "build": t_build, "first": t_first, "end": time.time()}))
    """
)

# Steady decode of the three methods, interleaved; prints a JSON line.  argv: model directory rounds
STEADY = SETUP + textwrap.dedent(
    """
    import json, statistics, sys
    import logging
    logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)
    name, directory, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from torch_precompile import generation
    model, ids, mask = build(name)
    runnables = generation.load(directory, model)
    compiled = build(name)[0]
    compiled.forward = torch.compile(compiled.forward)

    def eager(n):
        return generate(model, ids, mask, n)

    def served(n):
        with generation.serving(model, runnables):
            return generate(model, ids, mask, n)

    def compile_(n):
        return generate(compiled, ids, mask, n)

    methods = {"eager": eager, "precompile": served, "compile": compile_}
    tokens = {label: run(%(new)d).tolist() for label, run in methods.items()}  # warm-up, and the tokens
    for label in methods:  # every length the timed runs use, compiled before timing
        methods[label](1)
    per_token = {label: [] for label in methods}
    for _ in range(rounds):
        for label, run in methods.items():
            t = time.perf_counter(); run(1); one = time.perf_counter() - t
            t = time.perf_counter(); run(%(new)d + 1); many = time.perf_counter() - t
            per_token[label].append((many - one) / %(new)d)
    print(json.dumps({
        "per_token": {k: statistics.median(v) for k, v in per_token.items()},
        "same_tokens": {k: tokens[k] == tokens["eager"] for k in methods},
    }))
    """
) % {"new": NEW_TOKENS}


def run_child(code: str, args: list, env: dict) -> tuple:
    launched = time.time()
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{result.stderr[-4000:]}")
    return launched, json.loads(result.stdout.strip().splitlines()[-1])


def precompile_model(name: str, directory: str) -> float:
    """Precompile prefill and decode from a batch-2 left-padded example and save them; seconds taken."""
    namespace: dict = {}
    exec(SETUP, namespace)
    import torch
    from torch_precompile import generation

    model = namespace["build"](name)[0]
    ids = torch.randint(3, 1024, (2, PROMPT), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    start = time.perf_counter()
    generation.save(generation.precompile_generate(model, ids, attention_mask=mask, max_new_tokens=3), directory)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per first-token row")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the steady decode")
    parser.add_argument("--out", help="write the markdown report here")
    options = parser.parse_args()
    rows_first, rows_steady, notes = [], [], []
    scratch = tempfile.mkdtemp(prefix="serving-bench-")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(scratch, "inductor-cache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # children import from cached bytecode, as a normal install does
    for name in options.models.split(","):
        directory = os.path.join(scratch, name)
        notes.append(f"{name}: precompile_generate + save {precompile_model(name, directory):.1f} s")
        run_child(FIRST_TOKEN, ["compile", name, directory], env)  # fills torch.compile's cache
        run_child(FIRST_TOKEN, ["precompile", name, directory], env)  # writes the package's bytecode
        first = {}
        for method in ("precompile", "compile", "eager"):
            samples = [run_child(FIRST_TOKEN, [method, name, directory], env) for _ in range(options.repeats)]
            first[method] = {
                "wall": statistics.median(result["end"] - launched for launched, result in samples),
                "import": statistics.median(result["import"] for _, result in samples),
                "build": statistics.median(result["build"] for _, result in samples),
                "first": statistics.median(result["first"] for _, result in samples),
            }
        for method, row in first.items():
            speedup = first["compile"]["first"] / row["first"]
            rows_first.append(
                f"| {name} | {method} | {row['wall']:.2f} s | {row['import']:.2f} s | {row['build'] * 1e3:.0f} ms | "
                f"{row['first'] * 1e3:.0f} ms | {speedup:.1f}x |"
            )
        _, steady = run_child(STEADY, [name, directory, str(options.rounds)], env)
        per_token, same = steady["per_token"], steady["same_tokens"]
        for method, seconds in per_token.items():
            rows_steady.append(
                f"| {name} | {method} | {seconds * 1e3:.2f} ms | {seconds / per_token['eager']:.2f}x | "
                f"{seconds / per_token['compile']:.2f}x | {'yes' if same[method] else 'no'} |"
            )
    report = "\n".join(
        [
            f"# Serving: generate() from artifacts (`python benchmarks/serving_bench.py {' '.join(sys.argv[1:])}`)",
            "",
            f"Greedy generation of {NEW_TOKENS} tokens after an {PROMPT}-token prompt, batch 1, DynamicCache; "
            f"{os.cpu_count()} CPUs, torch {__import__('torch').__version__}, load average {os.getloadavg()[0]:.1f}; "
            "children import from cached bytecode (PYTHONDONTWRITEBYTECODE unset), as a normal install does.",
            "",
            "| model | method | process start to first token | imports | model build | load/compile + first token | vs torch.compile |",
            "|---|---|---|---|---|---|---|",
            *rows_first,
            "",
            "| model | method | per-token decode | vs eager | vs torch.compile | same tokens as eager |",
            "|---|---|---|---|---|---|",
            *rows_steady,
            "",
            *(f"- {note}" for note in notes),
        ]
    )
    print(report)
    if options.out:
        with open(options.out, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
