"""Hugging Face ``generate()`` with the model's forward served by precompiled artifacts.

Installed, this is ``torch_precompile.generation``.  ``generate()`` calls
``model(**model_inputs)`` once to prefill the cache and then once per new
token; both calls are captured from a real ``generate()`` and precompiled
with the dims that change between requests left free (Note [precompile
programming model], invariants 3 and 5):

* prefill: batch and prompt length (``input_ids``, a 2-D ``attention_mask``,
  or a ``StaticCache``'s 4-D mask by prompt length);
* decode: batch and, with a ``DynamicCache``, the cache length (each layer's
  keys and values) and the mask, which transformers' masking code requires
  to be one longer than the cache: a size fact the artifact checks.

A ``StaticCache`` (passed as ``past_key_values``) is allocated for one batch
size and cache length, which stay the example's.

Each mark's ``min``/``max`` is an inclusive bound on that size, checked at
every call; the graph may need more of the sizes than the bounds say (sdpa's
``q_length > 1`` branch makes prefill require a prompt of at least 2 tokens):
such size facts are taken from the example's sizes, listed in the artifact's
calling convention (``runnable.convention.size_facts``) and checked at every
call, so a request outside them is refused with a ``PrecompileError`` naming
the dims and the model's line, never computed differently.

Usage (decoder-only models; the model is an argument, as everywhere)::

    pairs = generation.precompile_generate(model, input_ids, attention_mask=mask, max_new_tokens=32)
    generation.save(pairs, "artifacts/")
    # in the serving process:
    runnables = generation.load("artifacts/", model)
    with generation.serving(model, runnables):
        tokens = model.generate(input_ids, attention_mask=mask, max_new_tokens=32)

The cache classes are registered as pytree nodes with transformers' own
``register_cache_pytrees_for_model`` (what ``torch.export`` needs too), by
``precompile_generate`` and by ``load``.
"""

import contextlib
import copy
import inspect
import os
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from . import _precompile_compat as compat
from ._precompile import precompile
from ._precompile_kernel_store import write_atomically
from ._precompile_runtime import write_back
from ._precompile_schema import PrecompileError


PHASES = ("prefill", "decode")
# Inclusive bounds of the free sizes (a request outside them is refused).
DEFAULT_MAX_BATCH = 64


class _Recorded(Exception):
    """Stops the recording generate() once the forward calls it needs were seen."""


def _call_forward(model: torch.nn.Module, kwargs: dict, cache: Any) -> Any:
    """What ``generate()`` runs for each step: fn of every artifact this module makes.  The
    cache is an argument of its own: the same object at every step, which a call that left it
    unchanged since the last one's write does not flatten again."""
    return model(**kwargs, past_key_values=cache)


def register_caches(model: torch.nn.Module) -> None:
    """Register transformers' cache classes (and the model's own) as pytree nodes."""
    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    register_cache_pytrees_for_model(model)


def record_forward_calls(model: torch.nn.Module, *args: Any, **generate_kwargs: Any) -> dict:
    """The keyword arguments of generate()'s prefill and first decode call of ``model``.

    Runs ``model.generate(*args, **generate_kwargs)`` until its second forward
    call, with the global RNG restored afterwards (sampling draws from it).
    """
    calls: list = []
    forward = model.forward

    def record(**kwargs: Any) -> Any:
        calls.append(copy.deepcopy(kwargs))  # before the call: the cache is updated in place
        if len(calls) == len(PHASES):
            raise _Recorded
        return forward(**kwargs)

    with torch.random.fork_rng(), torch.no_grad(), _forward_replaced(model, record):
        try:
            model.generate(*args, **generate_kwargs)
        except _Recorded:
            pass
    if len(calls) != len(PHASES):
        raise PrecompileError(
            f"model.generate() called the model's forward {len(calls)} time(s); precompile_generate needs a "
            "prefill and a decode step: pass max_new_tokens >= 2"
        )
    return {phase: _contiguous(kwargs) for phase, kwargs in zip(PHASES, calls)}


def mark_free_dims(kwargs: dict, phase: str, max_batch: int, max_length: int) -> None:
    """Mark the dims that change between requests (module docstring) on a recorded call's tensors."""
    free = compat.mark_free_dim
    cache = kwargs.get("past_key_values")
    # A StaticCache is allocated for one batch size, which its layers keep as an int.
    static = getattr(cache, "is_compileable", False)
    for name in ("input_ids", "position_ids", "token_type_ids"):
        if isinstance(kwargs.get(name), torch.Tensor):
            if not static:
                free(kwargs[name], 0, "batch", 1, max_batch)
            if phase == "prefill":
                free(kwargs[name], 1, "prompt", 1, max_length)
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        if not static:
            free(mask, 0, "batch", 1, max_batch)
        if mask.dim() == 2:  # the whole sequence so far: the prompt, or the cache and the new token
            free(mask, 1, "prompt" if phase == "prefill" else None, 1, max_length)
        elif phase == "prefill":  # a static cache's 4-D mask: (batch, 1, prompt, cache length)
            free(mask, 2, "prompt", 1, max_length)
    if not static:
        for tensor in _cache_tensors(cache):  # (batch, heads, cache length, head dim)
            free(tensor, 0, "batch", 1, max_batch)
            if phase == "decode":
                free(tensor, 2, "kv", 1, max_length - 1)


def precompile_generate(
    model: torch.nn.Module,
    *args: Any,
    backend: str = "inductor",
    max_batch: int = DEFAULT_MAX_BATCH,
    max_length: int | None = None,
    **generate_kwargs: Any,
) -> dict:
    """``{"prefill": (python_code, cache), "decode": (python_code, cache)}`` for ``model``'s forward
    as ``model.generate(*args, **generate_kwargs)`` calls it.

    ``max_length`` bounds the prompt and cache lengths (default: the model's
    ``max_position_embeddings``); ``max_batch`` the batch.  Free dims need
    backend='inductor' (backend='eager' specializes every size, and the cache
    grows at every step).
    """
    if backend != "inductor":
        raise PrecompileError(
            f"precompile_generate(backend={backend!r}): the decode step's cache length changes at every "
            "token, which only backend='inductor' leaves free; use backend='inductor'"
        )
    register_caches(model)
    if max_length is None:
        max_length = getattr(model.config, "max_position_embeddings", None) or 2048
    recorded = record_forward_calls(model, *args, **generate_kwargs)
    _refuse_sliding_window_layers(recorded["decode"].get("past_key_values"))
    pairs = {}
    for phase, kwargs in recorded.items():
        mark_free_dims(kwargs, phase, max_batch, max_length)
        cache = kwargs.pop("past_key_values", None)
        pairs[phase] = precompile(_call_forward, model, kwargs, cache, backend=backend)
    return pairs


def _refuse_sliding_window_layers(cache: Any) -> None:
    """A cache with sliding-window layers (Gemma 2/3, Mistral, hybrid caches): such a layer keeps
    at most its window and counts the tokens it saw in a Python int, neither of which follows the
    free cache length the helper marks, so the marks it placed would be refused, not the user's."""
    for index, layer in enumerate(getattr(cache, "layers", None) or ()):
        if getattr(layer, "is_sliding", False):
            raise PrecompileError(
                f"precompile_generate: generate() uses a {type(cache).__name__} whose layer {index} is a "
                f"{type(layer).__name__} (sliding window), which this helper does not support: it leaves the "
                "prompt and cache lengths free, and a sliding-window layer keeps at most its window of tokens. Call "
                "model.generate() eagerly for this model, or precompile its forward calls with precompile() "
                "and no mark_unbacked (every size specialized)"
            )


def save(pairs: dict, directory: str) -> None:
    """Write each phase's pair as ``<phase>.py`` and ``<phase>.cache`` in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    for phase, (python_code, cache) in pairs.items():
        write_atomically(directory, os.path.join(directory, f"{phase}.py"), python_code.encode())
        write_atomically(directory, os.path.join(directory, f"{phase}.cache"), cache)


def load(directory: str, model: torch.nn.Module) -> dict:
    """``{"prefill": runnable, "decode": runnable}`` from the files ``save`` wrote (only load what you trust)."""
    register_caches(model)  # their structures name the cache classes
    runnables = {}
    for phase in PHASES:
        with open(os.path.join(directory, f"{phase}.py")) as f:
            python_code = f.read()
        with open(os.path.join(directory, f"{phase}.cache"), "rb") as f:
            cache = f.read()
        runnables[phase] = precompile.load(python_code, cache)
    return runnables


@contextlib.contextmanager
def serving(model: torch.nn.Module, runnables: dict):
    """Inside, ``model``'s forward calls (``generate()``'s) run the artifacts: prefill while the
    cache is empty, decode after.  A call the artifact does not fit raises a PrecompileError
    (nothing changed) instead of running eagerly."""

    def forward(**kwargs: Any) -> Any:
        kwargs = _contiguous(kwargs)
        cache = kwargs.pop("past_key_values", None)
        return runnables["prefill" if _cache_length(cache) == 0 else "decode"](model, kwargs, cache)

    config = getattr(model, "generation_config", None)
    disabled = getattr(config, "disable_compile", None)
    if config is not None:
        config.disable_compile = True  # generate() would torch.compile the forward it is given
    try:
        with _forward_replaced(model, forward):
            yield
    finally:
        if config is not None:
            config.disable_compile = disabled


@contextlib.contextmanager
def _forward_replaced(model: torch.nn.Module, forward: Callable):
    """``model.forward`` is ``forward`` inside (an instance attribute; the class is untouched),
    with the model's signature: generate() inspects it to decide what to pass (``position_ids``,
    a mask made from pad tokens, ``logits_to_keep``), and must pass what it passes eagerly."""
    if "forward" in vars(model):
        raise PrecompileError(
            f"{type(model).__name__}.forward is already replaced on this instance (a serving() or "
            "recording that did not end, or a patch of your own): remove it first"
        )
    forward.__signature__ = inspect.signature(model.forward)
    model.forward = forward
    try:
        yield
    finally:
        del model.forward


def _contiguous(kwargs: dict) -> dict:
    """Tensor arguments contiguous: generate() slices them (``input_ids[:, -1:]``), a DynamicCache
    keeps prefill's transposed keys, and backend='inductor' specializes on layout.  The forward
    only reads the arguments and rebinds the cache's tensors, so contiguous copies compute the same;
    the cache's are rebound in place (it is the caller's object, which the call updates)."""
    cache = kwargs.get("past_key_values")
    layers = getattr(cache, "layers", None)
    if type(layers) is list:  # transformers' caches: each layer's keys and values, without a flatten per token
        for layer in layers:
            for name in ("keys", "values"):
                tensor = getattr(layer, name, None)
                if isinstance(tensor, torch.Tensor) and not tensor.is_contiguous():
                    setattr(layer, name, tensor.contiguous())
    elif cache is not None:
        leaves, spec = pytree.tree_flatten(cache)
        if not all(leaf.is_contiguous() for leaf in leaves if isinstance(leaf, torch.Tensor)):
            leaves = [leaf.contiguous() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
            write_back(cache, pytree.tree_unflatten(leaves, spec))
    return {name: value.contiguous() if isinstance(value, torch.Tensor) else value for name, value in kwargs.items()}


def _cache_tensors(cache: Any) -> list:
    """Each layer's keys and values (3+ dims: batch first); a cache's counters are left alone."""
    if cache is None:
        return []
    return [leaf for leaf in pytree.tree_leaves(cache) if isinstance(leaf, torch.Tensor) and leaf.dim() >= 3]


def _cache_length(cache: Any) -> int:
    return 0 if cache is None else cache.get_seq_length()
