"""Hugging Face generate() served by precompiled artifacts, loaded in a fresh process.

1. This process builds a small random Llama from a config (no hub access),
   precompiles the two forward calls ``model.generate()`` makes -- prefill
   (batch and prompt length free) and decode (batch and cache length free) --
   with ``torch_precompile.generation.precompile_generate``, and writes the
   artifact pairs and the model's weights to a directory.
2. A fresh interpreter loads the pairs (``generation.load``; nothing is
   compiled) and runs ``model.generate()`` inside ``generation.serving``:
   greedy and seeded sampling, a left-padded batch, another batch size and
   prompt length, a DynamicCache (the default) -- and checks that every
   token equals eager ``generate()``'s.

    python examples/generate.py             # temp directory, removed afterwards
    python examples/generate.py --out DIR   # keep the artifacts in DIR
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
import transformers


def build_model() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(config).eval()


def prompts(batch: int, length: int, seed: int) -> tuple:
    """A left-padded batch: row 0 has ``length // 3`` pad tokens."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 256, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    ids[0, : length // 3], mask[0, : length // 3] = 0, 0
    return ids, mask


def precompile_here(directory: str) -> None:
    from torch_precompile import generation

    model = build_model()
    ids, mask = prompts(2, 8, seed=0)
    start = time.perf_counter()
    pairs = generation.precompile_generate(model, ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    print(f"precompiled prefill and decode in {time.perf_counter() - start:.1f} s")
    generation.save(pairs, directory)
    torch.save(model.state_dict(), os.path.join(directory, "weights.pt"))
    for phase, (python_code, cache) in pairs.items():
        print(f"  {phase}: python_code {len(python_code):,} chars, cache {len(cache):,} bytes")


def serve_in_this_process(directory: str) -> None:
    """The fresh process: load, then generate() served by the artifacts next to eager generate()."""
    from torch_precompile import generation

    model = build_model()
    model.load_state_dict(torch.load(os.path.join(directory, "weights.pt")))
    start = time.perf_counter()
    runnables = generation.load(directory, model)
    print(f"fresh process: loaded both artifacts in {(time.perf_counter() - start) * 1e3:.0f} ms, compiling nothing")
    cases = [
        ("greedy, batch 2, prompt 8", prompts(2, 8, seed=1), {"do_sample": False}),
        ("greedy, batch 3, prompt 13", prompts(3, 13, seed=2), {"do_sample": False}),
        ("seeded sampling, batch 4, prompt 5", prompts(4, 5, seed=3), {"do_sample": True, "top_k": 50}),
    ]
    for name, (ids, mask), options in cases:
        torch.manual_seed(7)
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=24, **options)
        torch.manual_seed(7)
        start = time.perf_counter()
        with generation.serving(model, runnables):
            tokens = model.generate(ids, attention_mask=mask, max_new_tokens=24, **options)
        seconds = time.perf_counter() - start
        assert torch.equal(tokens, expected), f"{name}: tokens differ from eager generate()"
        print(f"  {name}: {tokens.shape[1] - ids.shape[1]} new tokens, same as eager ({seconds * 1e3:.0f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="keep the artifacts in this directory")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # the fresh process's entry
    options = parser.parse_args()
    if options.serve:
        serve_in_this_process(options.serve)
        return
    directory = options.out or tempfile.mkdtemp(prefix="precompile-generate-")
    try:
        precompile_here(directory)
        subprocess.run([sys.executable, __file__, "--serve", directory], check=True)
    finally:
        if not options.out:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
