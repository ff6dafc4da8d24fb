"""precompile vs what users would pick instead (issue 7).

Peers, each measured in fresh processes on the same workloads (tiny
overhead-bound Linear(16,16) batch 1, MLP forward, MLP training step,
conv+BatchNorm forward):

  eager; torch.compile (its own warm cache dir); mega-cache
  (torch.compiler.save_cache_artifacts -> load_cache_artifacts into an empty
  dir); torch._dynamo aot_compile (torch.compile(fn, fullgraph=True).aot_compile)
  + torch.compiler.load_compiled_function; torch._inductor.standalone_compile
  (on a make_fx graph with the parameters as inputs); torch.export + AOTInductor
  package (aoti_compile_and_package / aoti_load_package); TorchScript
  (torch.jit.trace + save / load); torch.compiler.precompile (both backends);
  on torch 2.14, torch's own prototype torch.compiler.precompile (both
  backends: torch_precompile, torch_precompile_eager).

Reported per (workload, peer): build time; warm start (fresh process, after
``import torch``, to the first result) with an empty inductor cache dir and
with the peer's own warm cache where it has one; steady-state time per call
(one process, ``torch.set_num_threads(1)``, interleaved, medians); artifact
size; whether weights are baked in; whether grads accumulate.  Ratios against
eager and against precompile, all from the same run.

Writes benchmarks/results/compare.md and compare.png (matplotlib optional).

Usage:
    python benchmarks/compare.py            # full run (< 25 min on 2 cores)
    python benchmarks/compare.py --quick    # CI smoke: MLP forward, 1 repeat, fast peers only
    # a real model (needs transformers), into results/compare_gpt2.md:
    python benchmarks/compare.py --workloads gpt2_fwd,gpt2_train --peers eager,compile,precompile_eager,precompile --report compare_gpt2
    # against torch 2.14's own precompile (issue 24), into results/compare_torch_precompile.md;
    # --no-compiler-starts adds one start per cache mode with failing stub C++ compilers on PATH:
    python benchmarks/compare.py --workloads mlp_fwd,mlp_train,gpt2_fwd,gpt2_train \
        --peers precompile,precompile_eager,torch_precompile,torch_precompile_eager \
        --repeats 3 --budget-min 20 --no-compiler-starts --no-chart --report compare_torch_precompile
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402  (imports no torch)


# ---------------------------------------------------------------------------
# Peers (methods beyond eager / torch.compile / precompile, which _common has)
# ---------------------------------------------------------------------------


class MegaCache(C.Compile):
    """torch.compile's mega-cache bytes, loaded into an empty cache dir."""

    name, label = "mega", "torch.compile + mega-cache"
    artifact_from = "compile"  # the compile build saves them (torch.compiler.save_cache_artifacts)
    start_modes = ("empty",)
    slow_empty_start = True

    def load(self, wl, model, inputs, art):
        import torch

        torch.compiler.load_cache_artifacts((art / "mega.bin").read_bytes())
        return super().load(wl, model, inputs, art)


class AotCompile(C.Method):
    name, label = "aot_compile", "dynamo aot_compile + load_compiled_function"
    start_modes = ("empty", "own")
    slow_empty_start = True
    # Its guards include torch.get_num_threads(): an artifact built with the
    # default threads fails every call at 1 thread, so steady state (1 thread)
    # loads a second build made with 1 thread.
    steady_artifact = "aot_compile_1t"
    build_threads = None

    def build(self, wl, model, inputs, art):
        import torch

        if self.build_threads:
            torch.set_num_threads(self.build_threads)
        t0 = time.perf_counter()
        # A training step needs Dynamo to trace Tensor.backward().
        with torch._dynamo.config.patch(trace_autograd_ops=wl.train), wl.context():
            compiled = torch.compile(wl.fn, fullgraph=True).aot_compile(((model, *inputs), {}))
        compiled.save_compiled_function(str(art / "fn.bin"))
        return {"build_s": time.perf_counter() - t0, "artifact_bytes": (art / "fn.bin").stat().st_size}

    def load(self, wl, model, inputs, art):
        import torch

        with open(art / "fn.bin", "rb") as f:
            fn = torch.compiler.load_compiled_function(f)
        return C.Runtime(lambda: fn(model, *inputs), list(model.parameters()), wl.context)

    def artifact_bytes(self, art, build_info):
        return build_info["artifact_bytes"]


class AotCompile1T(AotCompile):
    """aot_compile built with torch.set_num_threads(1), for the steady-state process only."""

    name, label = "aot_compile_1t", "aot_compile (1-thread build)"
    steady_artifact = None
    build_threads = 1


def _state(model) -> tuple:
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    tensors = [t for _, t in model.named_parameters()] + [t for _, t in model.named_buffers()]
    return names, tensors


class Standalone(C.Method):
    """standalone_compile of a make_fx graph taking (params, buffers, inputs).

    The graph is the forward (for the training step: the loss); training runs
    ``loss.backward()`` through the compiled autograd function, onto the
    parameters passed in.
    """

    name, label = "standalone", "inductor standalone_compile"
    start_modes = ("empty", "own")
    slow_empty_start = True

    def build(self, wl, model, inputs, art):
        import torch
        import torch.nn.functional as F
        from torch.fx.experimental.proxy_tensor import make_fx

        names, state = _state(model)
        n = len(names)

        def flat(*args):
            out = torch.func.functional_call(model, dict(zip(names, args[:n])), args[n : n + 1])
            return (F.mse_loss(out, args[n + 1]) if wl.train else out,)

        t0 = time.perf_counter()
        with wl.context():
            gm = make_fx(flat)(*state, *inputs)
            artifact = torch._inductor.standalone_compile(gm, [*state, *inputs], dynamic_shapes="from_example_inputs")
        artifact.save(path=str(art / "artifact.bin"), format="binary")
        return {"build_s": time.perf_counter() - t0, "artifact_bytes": (art / "artifact.bin").stat().st_size}

    def load(self, wl, model, inputs, art):
        import torch

        artifact = torch._inductor.CompiledArtifact.load(path=str(art / "artifact.bin"), format="binary")
        _, state = _state(model)
        args = [*state, *inputs]
        if wl.train:

            def call():
                loss = artifact(*args)[0]
                loss.backward()
                return loss.detach()

        else:

            def call():
                return artifact(*args)[0]

        return C.Runtime(call, list(model.parameters()), wl.context)

    def artifact_bytes(self, art, build_info):
        return build_info["artifact_bytes"]


class AOTInductor(C.Method):
    name, label = "aoti", "torch.export + AOTInductor package"
    weights_baked = "yes"
    start_modes = ("empty", "own")
    slow_empty_start = True

    def unsupported(self, wl):
        return "inference only (an AOTInductor package has no autograd)" if wl.train else None

    def build(self, wl, model, inputs, art):
        import torch

        t0 = time.perf_counter()
        with torch.no_grad():
            program = torch.export.export(model, inputs)
            torch._inductor.aoti_compile_and_package(program, package_path=str(art / "model.pt2"))
        return {"build_s": time.perf_counter() - t0, "artifact_bytes": (art / "model.pt2").stat().st_size}

    def load(self, wl, model, inputs, art):
        import torch

        runner = torch._inductor.aoti_load_package(str(art / "model.pt2"))
        return C.Runtime(lambda: runner(*inputs), [], torch.no_grad)

    def artifact_bytes(self, art, build_info):
        return build_info["artifact_bytes"]


class TorchScript(C.Method):
    """torch.jit.trace of the model; the step runs fn with the ScriptModule as model."""

    name, label = "torchscript", "TorchScript (jit.trace)"
    weights_baked = "yes"

    def build(self, wl, model, inputs, art):
        import torch

        t0 = time.perf_counter()
        with wl.context():
            traced = torch.jit.trace(model, inputs[:1])
        torch.jit.save(traced, str(art / "model.pt"))
        return {"build_s": time.perf_counter() - t0, "artifact_bytes": (art / "model.pt").stat().st_size}

    def load(self, wl, model, inputs, art):
        import torch

        scripted = torch.jit.load(str(art / "model.pt"))
        fn = wl.fn
        # Training: grads land on the ScriptModule's own (baked) parameters.
        return C.Runtime(lambda: fn(scripted, *inputs), list(scripted.parameters()), wl.context)

    def artifact_bytes(self, art, build_info):
        return build_info["artifact_bytes"]


METHODS = dict(C.BASE_METHODS)
for _peer in (MegaCache(), AotCompile(), AotCompile1T(), Standalone(), AOTInductor(), TorchScript()):
    METHODS[_peer.name] = _peer

ORDER = [
    "eager", "compile", "mega", "aot_compile", "standalone", "aoti", "torchscript",
    "torch_precompile_eager", "torch_precompile", "precompile_eager", "precompile",
]
SLOW = {"mega", "aot_compile", "standalone", "aoti", "torch_precompile"}
# torch's own precompile (torch 2.14) against this package's, same backend.
TORCH_OWN = {"precompile": "torch_precompile", "precompile_eager": "torch_precompile_eager"}
# Peers whose start takes milliseconds: also started with 1 thread, where the
# first call's OpenMP regions cannot stall on a busy second core.
FAST_START = {"eager", "torchscript", "precompile_eager", "precompile"}
WORKLOADS = ["tiny", "mlp_fwd", "mlp_train", "conv_fwd"]
NOTES = {
    "compile": "no separate build: build = cold first call (empty cache dir); empty-dir start = the same",
    "mega": "build = torch.compile's cold first call + save_cache_artifacts; own-cache start = torch.compile's",
    "aot_compile": "fullgraph only; the training step needs trace_autograd_ops=True and guards on `.grad is None`",
    "standalone": "graph from make_fx(functional_call) with params/buffers as inputs; the user passes them",
    "aoti": "weights baked into the package; `runner(x)`",
    "torchscript": "weights baked; training updates the ScriptModule's own parameters, not the user's model",
    "precompile_eager": "captured ATen graph, no kernels",
    "precompile": "load() + call(model, x); no weights, kernels shipped in the cache",
    "torch_precompile_eager": "torch 2.14's own prototype; its load imports torch._dynamo",
    "torch_precompile": "torch 2.14's own prototype; cache = Inductor's save_cache_artifacts bundle, kernels built from python_code at load",
}


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def main() -> None:
    parser = C.base_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--budget-min", type=float, default=24.0, help="wall-clock budget; extra repeats stop when spent")
    parser.add_argument("--workloads", default=None, help="comma-separated subset of " + ",".join(WORKLOADS))
    parser.add_argument("--peers", default=None, help="comma-separated subset of " + ",".join(ORDER))
    parser.add_argument("--no-chart", action="store_true")
    parser.add_argument("--report", default="compare", help="results/REPORT.md (and .json, .png)")
    parser.add_argument("--from-json", default=None, help="re-render a previous run's results JSON; measures nothing")
    parser.add_argument(
        "--no-compiler-starts", action="store_true",
        help="also start every compiled peer once per cache mode with failing stub C++ compilers on PATH",
    )
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    slow_empty_repeats = 1  # an empty-dir start of a compiling peer is a full recompile
    steady_repeats, target_s = (2, 0.005) if args.quick else (15, 0.02)
    workloads = (args.workloads or ("mlp_fwd" if args.quick else ",".join(WORKLOADS))).split(",")
    # torch's own precompile only where torch has one (2.14); elsewhere name it in --peers to see why not.
    own_missing = C.torch_own_precompile_missing()
    default_peers = [m for m in ORDER if not (args.quick and m in SLOW) and not (own_missing and m in TORCH_OWN.values())]
    peers = [m for m in (args.peers.split(",") if args.peers else default_peers) if m]
    budget_s = args.budget_min * 60
    if args.from_json:

        def factory(dump):
            done_w = [w for w in C.WORKLOADS if any(k.startswith(f"{w}/") for k in dump)]  # gpt2_* too
            done_p = [m for m in ORDER if any(k.endswith(f"/{m}") for k in dump)]
            hidden = ["aot_compile_1t"] if "aot_compile" in done_p else []
            return C.Plan(None, METHODS, done_w, done_p + hidden), done_w, done_p

        def render_all(plan, done_w, done_p):
            chart = None if args.no_chart else write_chart(plan, done_w, done_p, args.report)
            return render(plan, done_w, done_p) + (f"\n![compare]({chart.name})\n" if chart else "")

        C.rerender(args, f"{args.report}.md", factory, render_all)
        return
    load_before, mach = C.load_average(), C.machine()
    capped = []

    with C.scratch(args) as workdir:
        runner = C.Runner(__file__, workdir)
        hidden = ["aot_compile_1t"] if "aot_compile" in peers else []
        plan = C.Plan(runner, METHODS, workloads, peers + hidden)
        starts = [(m, mode, None) for m in peers for mode in METHODS[m].start_modes]
        starts += [(m, _main_mode(m), 1) for m in peers if m in FAST_START]
        # Phase 1: one of everything (build, each start once, steady state).
        for w in workloads:
            for m in peers + hidden:
                plan.build(w, m)
            for m, mode, threads in starts:
                plan.start(w, m, mode, threads=threads)
            if args.no_compiler_starts:  # after the starts above, so "own" dirs are warm
                for m, mode, threads in starts:
                    if m != "eager" and threads is None:
                        plan.start(w, m, mode, no_compiler=True)
            plan.steady(w, peers, steady_repeats, target_s)
        # Phase 2: more start repeats, round-robin, while the budget lasts.
        pending = []
        for r in range(1, repeats):
            for w in workloads:
                for m, mode, threads in starts:
                    if mode == "empty" and METHODS[m].slow_empty_start and r >= slow_empty_repeats:
                        continue
                    pending.append((w, m, mode, threads))
        for w, m, mode, threads in pending:
            if runner.elapsed() > budget_s:
                capped.append(f"{w}/{m}/{mode}" + (f"@{threads}" if threads else ""))
                continue
            plan.start(w, m, mode, threads=threads)
        elapsed = runner.elapsed()

    text = C.report_header("precompile vs the alternatives", sys.argv, mach, load_before, C.load_average(), elapsed)
    text += (
        f"- repeats: warm starts {repeats} fresh processes (empty-dir starts of peers that compile on load: "
        f"{slow_empty_repeats}, a full recompile each), builds 1, steady state {steady_repeats} interleaved repeats "
        f"(batches of ~{target_s * 1e3:.0f} ms, 1 thread); medians\n"
    )
    if args.no_compiler_starts:
        text += (
            "- compiler at load: each compiled peer also started once per cache mode with stub `gcc g++ cc c++ clang "
            "clang++` first on PATH (CC=gcc, CXX=g++) that record their call and exit 1\n"
        )
    if capped:
        text += f"- budget ({args.budget_min:.0f} min) spent: {len(capped)} extra repeats skipped ({', '.join(capped[:8])}...)\n"
    text += "\n"
    header = text
    text += render(plan, workloads, peers)
    chart = None if args.no_chart else write_chart(plan, workloads, peers, args.report)
    if chart:
        text += f"\n![compare]({chart.name})\n"
    print(text)
    path = C.write_report(f"{args.report}.md", text, dict(plan.dump(), _header=header))
    print(f"wrote {path}" + (f" and {chart}" if chart else ""), file=sys.stderr)


def _main_mode(m: str) -> str:
    """The start mode a peer's headline warm start uses: its own cache when it has one."""
    return "own" if "own" in METHODS[m].start_modes else "empty"


def _warm(cell: C.Cell, m: str) -> float | None:
    """The peer's best honest warm start: own warm cache where it has one, else empty dir."""
    own = cell.start_s("own")
    return own if own is not None else cell.start_s("empty")


def render(plan: C.Plan, workloads: list, peers: list) -> str:
    out = []
    legend = (
        "Columns: **build** = time to produce the artifact in a fresh process with an empty inductor cache dir "
        "(torch.compile: its cold first call); **start, empty dir** / **start, own cache** = fresh process, from "
        "after `import torch` to the first result (model + input creation included for all), with an empty "
        "TORCHINDUCTOR_CACHE_DIR / with the dir a previous run of this peer warmed (default threads); **start, 1 thread** = "
        "the same (own cache where it has one) with `torch.set_num_threads(1)`, for the peers that start in milliseconds, "
        "where a busy machine's scheduling of the second OpenMP thread otherwise dominates the first call; ratios use the "
        "default-thread own-cache start; **steady** = per call, 1 thread, "
        "interleaved, median +- its ~95% notch (forward under `torch.no_grad()`; training: `.grad = None` then the "
        "step; differences inside the notches are noise); ratios are "
        "peer / eager and peer / precompile (> 1: precompile is faster). Artifact = what must be shipped "
        "(torch.compile: its cache dir)."
    )
    out.append(legend + "\n")
    if any(TORCH_OWN.get(m) in peers for m in peers):
        out.append(_vs_torch_own(plan, workloads, peers))
    for w in workloads:
        wl = C.WORKLOADS[w]
        out.append(f"\n## {w}: {wl.label}\n")
        eager_start = plan.cell(w, "eager").start_s("empty") if "eager" in peers else None
        pc = plan.cell(w, "precompile") if "precompile" in peers else None
        pc_start = _warm(pc, "precompile") if pc else None
        eager_steady = plan.steady_s(w, "eager") if "eager" in peers else None
        pc_steady = plan.steady_s(w, "precompile") if pc else None
        rows = []
        for m in peers:
            cell, method = plan.cell(w, m), METHODS[m]
            if cell.skipped:
                rows.append([method.label] + ["not supported: " + cell.skipped] + [""] * 11)
                continue
            owner = plan.cell(w, method.artifact_dir_name)
            build = owner.ok_builds()
            build_s = C.median(b["build_s"] + b.get("mega_save_s", 0.0) * (m == "mega") for b in build) if build else None
            if m == "eager":
                build_s = 0.0
            empty = cell.start_s("empty")
            if m == "compile":
                empty_txt = f"= build ({C.fmt_time(build_s)})"
            else:
                empty_txt = C.fmt_time(empty)
            own = cell.start_s("own")
            if m == "mega":
                own_txt = "= torch.compile"
            elif "own" in method.start_modes:
                own_txt = C.fmt_time(own)
            else:
                own_txt = "no cache"
            one = cell.start_s(f"{_main_mode(m)}@1")
            warm = _warm(cell, m)
            steady = plan.steady_s(w, m)
            steady_info = cell.steady or {}
            size = C.median(b.get("artifact_bytes") for b in build) if build else None
            if m == "mega":
                size = C.median(b.get("mega_bytes") for b in build) if build else None
            grads = steady_info.get("grads_accumulate", "-") if wl.train else "-"
            error = cell.error()
            rows.append([
                method.label,
                C.fmt_time(build_s) if m != "eager" else "-",
                empty_txt,
                own_txt,
                C.fmt_time(one) if one is not None else "-",
                C.fmt_ratio(warm, eager_start),
                C.fmt_ratio(warm, pc_start),
                C.fmt_steady(steady_info),
                C.fmt_ratio(steady, eager_steady),
                C.fmt_ratio(steady, pc_steady),
                C.fmt_bytes(size) if m != "eager" else "-",
                method.weights_baked,
                grads,
                "; ".join(x for x in (NOTES.get(m, ""), f"ERROR: {error[:200]}" if error else "",
                                      "result differs from eager!" if steady_info.get("correct") is False else "") if x),
            ])
        out.append(C.markdown_table(
            ["peer", "build", "start, empty dir", "start, own cache", "start, 1 thread", "start / eager", "start / precompile",
             "steady", "steady / eager", "steady / precompile", "artifact", "weights baked", "grads accumulate", "notes"],
            rows,
        ))
        out.append(_split_table(plan, w, peers))
        out.append(_compiler_table(plan, w, peers))
        # Who wins.
        compiled = [m for m in peers if m != "eager"]
        best_start = _best(plan, w, compiled, lambda c, m: _warm(c, m))
        best_steady = _best(plan, w, peers, lambda c, m: plan.steady_s(w, m))
        out.append(
            f"\nfastest warm start (eager aside, which loads nothing): {best_start}; "
            f"fastest steady state: {best_steady}.\n"
        )
    return "\n".join(out) + "\n"


def _without_compiler(cell: C.Cell, mode: str, short: bool = False) -> str | None:
    """How the start in ``mode`` went with failing stub compilers (None: not run)."""
    results = cell.starts.get(mode + C.NO_COMPILER, [])
    if not results:
        return None
    r = results[-1]
    calls = r.get("compiler_calls") or 0
    first_call = " ".join([Path((r.get("compiler_first_call") or "?").split()[0]).name] + (r.get("compiler_first_call") or "").split()[1:])
    tried = f"{calls} compiler call{'s' * (calls != 1)}, first `{first_call}`" if calls else ""
    if not r.get("ok"):
        error = (r.get("error") or "?").strip().splitlines()[0]
        error = error.split(":")[0] if short else error[:140]
        return f"**fails** ({tried}; {error})" if tried else f"**fails** ({error})"
    if r.get("correct") is False:
        return "runs, wrong result"
    if short:
        return "works" + (f" ({tried}, all failed)" if calls else ", no compiler run")
    return f"works, {C.fmt_time(r.get('first_result_s'))}" + (f" (but {tried}, all failed)" if calls else ", no compiler run")


def _compiler_table(plan: C.Plan, w: str, peers: list) -> str:
    rows = []
    for m in peers:
        cell = plan.cell(w, m)
        if cell.skipped:
            continue
        modes = [(mode, _without_compiler(cell, mode)) for mode in METHODS[m].start_modes]
        if any(text for _, text in modes):
            rows.append([METHODS[m].label] + [
                dict(modes).get(mode) or ("-" if mode not in METHODS[m].start_modes else "not run") for mode in ("own", "empty")
            ])
    if not rows:
        return ""
    return (
        "\nC++ compiler at load: one fresh-process start per cache mode with stub compilers that always fail first on "
        "PATH (the time is that one start's, default threads).\n\n"
        + C.markdown_table(["peer", "own warm cache dir", "empty cache dir"], rows)
        + "\n"
    )


def _vs_torch_own(plan: C.Plan, workloads: list, peers: list) -> str:
    """This package's precompile against torch 2.14's own, same backend, same run: the issue-24 goals."""
    rows, verdicts = [], []
    for w in workloads:
        for ours, theirs in TORCH_OWN.items():
            if ours not in peers or theirs not in peers:
                continue
            a, b = plan.cell(w, ours), plan.cell(w, theirs)
            if a.skipped or b.skipped:
                rows.append([w, METHODS[ours].backend, f"not measured: {a.skipped or b.skipped}"] + [""] * 4)
                continue
            failed = next((c for c in (a, b) if c.builds and not c.ok_builds()), None)
            if failed is not None:  # a capture refused: nothing to load
                who = "this package's" if failed is a else "torch's own"
                error = (failed.error() or "?").split(". ")[0]
                rows.append([w, METHODS[ours].backend, f"{who} precompile fails at capture: {error}"] + [""] * 4)
                verdicts.append(f"- {w}, {METHODS[ours].backend}: no comparison, {who} precompile refuses this workload ({error})")
                continue

            def pair(x, y):
                return f"{C.fmt_time(x)} / {C.fmt_time(y)} = {C.fmt_ratio(y, x)}"

            starts = {mode: (a.start_s(mode), b.start_s(mode)) for mode in ("own", "empty")}
            steady_a, steady_b = a.steady or {}, b.steady or {}
            sa, sb = steady_a.get("median_s"), steady_b.get("median_s")
            compiler = " / ".join(
                f"{_without_compiler(c, 'own', True) or 'not run'}; {_without_compiler(c, 'empty', True) or 'not run'}"
                for c in (a, b)
            )
            rows.append([
                w,
                METHODS[ours].backend,
                pair(a.build_s(), b.build_s()),
                pair(*starts["own"]),
                pair(*starts["empty"]),
                f"{C.fmt_steady(steady_a)} / {C.fmt_steady(steady_b)} = {C.fmt_ratio(sb, sa)}",
                compiler,
            ])
            ratios = [y / x for x, y in starts.values() if x and y]
            start_ok = len(ratios) == 2 and min(ratios) >= 50
            if sa is None or sb is None:
                steady_ok = "steady state not measured"
            elif sa <= sb:
                steady_ok = "steady state no slower: met"
            elif sa - sb <= (steady_a.get("ci95_s") or 0) + (steady_b.get("ci95_s") or 0):
                steady_ok = f"steady state {C.fmt_ratio(sa, sb)} of torch's, inside the notches (noise)"
            else:
                steady_ok = f"steady state no slower: **not met** ({C.fmt_ratio(sa, sb)} of torch's)"
            verdicts.append(
                f"- {w}, {METHODS[ours].backend}: warm start >= 50x: "
                + ("met" if start_ok else "**not met**")
                + (f" (min {min(ratios):.0f}x)" if ratios else "")
                + f"; {steady_ok}"
            )
    return (
        "\n## Against torch 2.14's own precompile\n\n"
        "Each cell: this package / torch's own `torch.compiler.precompile` = torch's / ours (> 1: ours is faster). "
        "**capture** = `precompile()` in a fresh process with an empty Inductor cache dir; **warm start** = fresh "
        "process, from after `import torch` to the first result (`load()` + first call; model + inputs included), with "
        "an Inductor cache dir that this peer's capture or an earlier start warmed (warm dir) or a new empty one; **steady** = per call, 1 thread, interleaved; **compiler at load** = the "
        "same start with stub compilers that always fail (ours / torch's).\n\n"
        + C.markdown_table(
            ["workload", "backend", "capture", "warm start, warm dir", "warm start, empty dir", "steady (1 thread)",
             "without a C++ compiler, warm dir; empty dir (ours / torch's)"],
            rows,
        )
        + "\n\nGoals (issue 24): warm start >= 50x faster than torch's own with both cache dirs, steady state no slower.\n\n"
        + "\n".join(verdicts)
        + "\n"
    )


def _split_table(plan: C.Plan, w: str, peers: list) -> str:
    """The headline warm start split into model + input creation, load and first call (medians)."""
    rows = []
    for m in peers:
        cell = plan.cell(w, m)
        if cell.skipped:
            continue
        for mode in (_main_mode(m), f"{_main_mode(m)}@1"):
            if not any(s.get("ok") for s in cell.starts.get(mode, [])):
                continue
            fields = [cell.start_field(mode, f) for f in ("setup_s", "load_s", "first_call_s", "first_result_s")]
            load_call = None if None in fields[1:3] else fields[1] + fields[2]
            runs = sum(1 for s in cell.starts[mode] if s.get("ok"))
            threads = "1" if mode.endswith("@1") else "default"
            rows.append([METHODS[m].label, mode.split("@")[0], threads, runs,
                         *(C.fmt_time(v) for v in fields[:3]), C.fmt_time(load_call), C.fmt_time(fields[3])])
    if not rows:
        return ""
    return (
        "\nWarm start split (medians of each part over the fresh processes, so the parts need not add up to the "
        "total's median): **model + inputs** = building the model and its inputs (the same for every peer; "
        "random init of the weights), **load** = the peer's load / wrap (precompile: with the first access of `torch.compiler.precompile`, which imports it), **first call** = to the first result.\n\n"
        + C.markdown_table(
            ["peer", "cache", "threads", "runs", "model + inputs", "load", "first call", "load + first call", "total start"],
            rows,
        )
        + "\n"
    )


def _best(plan, w, peers, value) -> str:
    scored = [(value(plan.cell(w, m), m), m) for m in peers if not plan.cell(w, m).skipped]
    scored = [(v, m) for v, m in scored if v is not None]
    if not scored:
        return "n/a"
    v, m = min(scored)
    return f"{METHODS[m].label} ({C.fmt_time(v)})"


def write_chart(plan: C.Plan, workloads: list, peers: list, report: str):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping compare.png (pip install matplotlib)", file=sys.stderr)
        return None
    fig, axes = plt.subplots(len(workloads), 2, figsize=(13, 2.2 + 2.1 * len(workloads)), squeeze=False)
    for row, w in enumerate(workloads):
        for col, (title, value) in enumerate((
            ("warm start to first result (own cache if any), s", lambda m: _warm(plan.cell(w, m), m)),
            ("steady state per call, us (1 thread)", lambda m: None if plan.steady_s(w, m) is None else plan.steady_s(w, m) * 1e6),
        )):
            ax = axes[row][col]
            labels, values, colors = [], [], []
            for m in peers:
                if plan.cell(w, m).skipped:
                    continue
                v = value(m)
                if v is None:
                    continue
                labels.append(METHODS[m].label)
                values.append(v)
                colors.append("tab:red" if m == "precompile" else ("tab:orange" if m == "precompile_eager" else "tab:gray"))
            ax.barh(range(len(values)), values, color=colors)
            ax.set_yticks(range(len(values)))
            ax.set_yticklabels(labels, fontsize=7)
            ax.invert_yaxis()
            if col == 0:
                ax.set_xscale("log")  # milliseconds to tens of seconds
            else:
                ax.set_xlim(0, max(values, default=1) * 1.25)  # linear from 0: ratios stay visible
            ax.set_title(f"{w}: {title}", fontsize=8)
            ax.tick_params(axis="x", labelsize=7)
            for i, v in enumerate(values):
                ax.text(v, i, f" {v:.3g}", va="center", fontsize=6)
    fig.suptitle("torch.compiler.precompile vs alternatives (lower is better; starts on a log scale)", fontsize=10)
    fig.tight_layout()
    C.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = C.RESULTS_DIR / f"{report}.png"
    fig.savefig(path, dpi=110)
    return path


if __name__ == "__main__":
    if "--child" in sys.argv:
        C.child_main(METHODS)
    else:
        main()
