"""torch.compiler.precompile end to end: precompile here, run in a fresh process.

1. This process precompiles two computations of a small MLP with the default
   backend ("inductor"): inference ``model(x)`` and a whole training step
   (forward, cross-entropy loss, backward), and writes each ``(python_code,
   cache)`` pair to a directory, with the model's initial weights and the data.
2. A fresh interpreter (``sys.executable``) that never compiles anything loads
   the pairs with ``torch_precompile.load``, runs inference and a few
   SGD steps (zero_grad, precompiled step, optimizer.step()) next to eager
   PyTorch, and checks the numerics with ``torch.testing.assert_close``.

It prints what it did and how long each stage took: precompile, load in the
fresh process, first call, steady-state per call.

    python examples/demo.py             # temp directory, removed afterwards
    python examples/demo.py --out DIR   # keep the artifacts in DIR
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


T_START = time.perf_counter()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_precompile  # noqa: E402


T_IMPORT_TORCH = time.perf_counter() - T_START

BATCH, IN, HIDDEN, CLASSES = 32, 64, 128, 10
TRAIN_STEPS = 5
LR = 0.1


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.fc2(F.relu(self.fc1(x)))))


def infer(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach()


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.2f} ms"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f} us"


def _per_call(fn, repeat: int) -> float:
    """Median wall time of one call over ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------------------
# Part 1: precompile (this process)
# ---------------------------------------------------------------------------


def precompile_to(directory: str) -> None:
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(BATCH, IN)
    y = torch.randint(0, CLASSES, (BATCH,))
    torch.save({"state_dict": model.state_dict(), "x": x, "y": y}, os.path.join(directory, "data.pt"))

    print(f"[precompile] torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"MLP {IN}->{HIDDEN}->{HIDDEN}->{CLASSES}, batch {BATCH}")
    for name, fn, example in (
        ("infer", infer, (model, x)),
        ("train_step", train_step, (model, x, y)),
    ):
        t0 = time.perf_counter()
        python_code, cache = torch_precompile.precompile(fn, *example)  # backend="inductor"
        elapsed = time.perf_counter() - t0
        with open(os.path.join(directory, f"{name}.py"), "w") as f:
            f.write(python_code)
        with open(os.path.join(directory, f"{name}.cache"), "wb") as f:
            f.write(cache)
        print(f"[precompile] {name:<10} precompile {_ms(elapsed)}   "
              f"python_code {len(python_code) / 1024:7.1f} KiB, cache {len(cache) / 1024:7.1f} KiB")
    # precompile traces on clones: the caller's model has no .grad afterwards.
    assert all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------------------
# Part 2: load and run (a fresh process that compiles nothing)
# ---------------------------------------------------------------------------


def load_pair(directory: str, name: str):
    with open(os.path.join(directory, f"{name}.py")) as f:
        python_code = f.read()
    with open(os.path.join(directory, f"{name}.cache"), "rb") as f:
        cache = f.read()
    t0 = time.perf_counter()
    runnable = torch_precompile.load(python_code, cache)
    return runnable, time.perf_counter() - t0


def run_loaded(directory: str) -> None:
    # load() logs a "trust" warning at every load; the demo trusts its own files.
    import logging

    logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)

    print(f"[fresh process] pid {os.getpid()}, import torch {_ms(T_IMPORT_TORCH)}")
    data = torch.load(os.path.join(directory, "data.pt"), weights_only=True)
    x, y = data["x"], data["y"]

    def fresh_model() -> MLP:
        model = MLP()
        model.load_state_dict(data["state_dict"])
        return model

    # -- inference --------------------------------------------------------
    model = fresh_model()
    infer_pc, load_s = load_pair(directory, "infer")
    t0 = time.perf_counter()
    out = infer_pc(model, x)  # pass the model again: the artifact holds no weights
    first_s = time.perf_counter() - t0
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(out, expected)
    with torch.no_grad():
        steady_pc = _per_call(lambda: infer_pc(model, x), 200)
        steady_eager = _per_call(lambda: model(x), 200)
    print(f"[fresh process] infer      load {_ms(load_s)}   first call {_ms(first_s)}   "
          f"steady {_us(steady_pc)}/call (eager {_us(steady_eager)})   matches eager: yes")

    # -- training: same loop as eager, the step is precompiled --------------
    step_pc, load_s = load_pair(directory, "train_step")
    # Checked before torch.optim runs: creating an optimizer imports torch._dynamo
    # and torch._inductor itself (torch 2.13), whatever precompile does.
    inductor_imported = "torch._inductor" in sys.modules
    model_pc, model_eager = fresh_model(), fresh_model()
    opt_pc = torch.optim.SGD(model_pc.parameters(), lr=LR)
    opt_eager = torch.optim.SGD(model_eager.parameters(), lr=LR)
    losses, step_times = [], []
    for step in range(TRAIN_STEPS):
        opt_pc.zero_grad()
        t0 = time.perf_counter()
        loss_pc = step_pc(model_pc, x, y)  # forward + backward; grads land on model_pc
        step_times.append(time.perf_counter() - t0)
        opt_pc.step()

        opt_eager.zero_grad()
        loss_eager = train_step(model_eager, x, y)
        opt_eager.step()

        torch.testing.assert_close(loss_pc, loss_eager, rtol=1e-5, atol=1e-6)
        losses.append(loss_pc.item())
    for (name, p_pc), p_eager in zip(model_pc.named_parameters(), model_eager.parameters()):
        torch.testing.assert_close(p_pc, p_eager, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(p_pc.grad, p_eager.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}.grad: {m}")

    def timed_step_pc():
        opt_pc.zero_grad()
        step_pc(model_pc, x, y)

    def timed_step_eager():
        opt_eager.zero_grad()
        train_step(model_eager, x, y)

    steady_pc = _per_call(timed_step_pc, 100)
    steady_eager = _per_call(timed_step_eager, 100)
    print(f"[fresh process] train_step load {_ms(load_s)}   first call {_ms(step_times[0])}   "
          f"steady {_us(steady_pc)}/step (eager {_us(steady_eager)})   matches eager: yes")
    print(f"[fresh process] {TRAIN_STEPS} SGD steps (lr {LR}): loss "
          + " -> ".join(f"{v:.4f}" for v in losses)
          + "; parameters and .grad equal to eager's")
    print(f"[fresh process] torch._inductor imported by the two loads and the inference calls: "
          f"{inductor_imported} (the cache's compiled kernels load directly, no compiler runs)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory to write the artifacts to (kept)")
    parser.add_argument("--load", metavar="DIR", help=argparse.SUPPRESS)  # the fresh process
    args = parser.parse_args()

    if args.load:
        run_loaded(args.load)
        return 0

    directory = args.out or tempfile.mkdtemp(prefix="precompile_demo_")
    os.makedirs(directory, exist_ok=True)
    try:
        precompile_to(directory)
        print(f"[precompile] wrote {sorted(os.listdir(directory))} to {directory}")
        print(f"[precompile] starting a fresh process: {os.path.basename(sys.executable)} "
              f"{os.path.basename(__file__)} --load {directory}")
        t0 = time.perf_counter()
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--load", directory])
        print(f"[demo] fresh process exited {child.returncode} after {_ms(time.perf_counter() - t0)} "
              f"(including interpreter start and import torch); total "
              f"{time.perf_counter() - T_START:.1f} s")
        return child.returncode
    finally:
        if not args.out:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
