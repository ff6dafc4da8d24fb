"""Hugging Face ``generate()`` with the model's forward served by precompiled artifacts.

Installed, this is ``torch_precompile.generation``.  ``generate()`` calls
``model(**model_inputs)`` once to prefill the cache and then once per new
token; both calls are captured from a real ``generate()`` and precompiled
with the dims that change between requests left free (Note [precompile
programming model], invariants 3 and 5):

* prefill: batch and prompt length (``input_ids``, a 2-D ``attention_mask``,
  or a ``StaticCache``'s 4-D mask (a dict of them by layer kind) by prompt length);
* decode: batch and, with a ``DynamicCache``, the cache length (each layer's
  keys and values) and the mask, which transformers' masking code requires
  to be one longer than the cache: a size fact the artifact checks.

A ``StaticCache`` (passed as ``past_key_values``) is allocated for one batch
size and cache length, which stay the example's; its prefill allocates a new
cache's tensors, so one reused after ``reset()``, which keeps them, is refused
naming that (pass a new one per request), and a generation longer than its
``max_cache_len`` before the call that would write past its end (eager raises
IndexError there, Inductor's kernel a RuntimeError).  generate() marks a cache the
caller passes (``_is_user_defined``, which only generate() reads but which is
part of the cache's structure): ``serving()`` gives each artifact the mark it
was recorded with and puts the caller's back, so either is served.

``generate()`` drops an all-ones 2-D ``attention_mask`` (no padding) before
calling forward, treating it as no mask, so whether a call has that key
depends on the request's padding, and an artifact maps dict inputs by key.
Both calls are recorded with the mask (an all-ones one where generate()
dropped it), and ``serving()`` passes back the all-ones mask generate()
dropped where an artifact takes a 2-D one: one pair serves padded and
unpadded requests.  With a ``StaticCache`` generate() passes the 4-D mask it
builds, and none for an unpadded prompt's prefill, which serving() does not
make up: its prefill serves prompts padded (or not) as the recorded one.

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
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from . import _precompile_compat as compat
from ._precompile import precompile
from ._precompile_kernel_store import write_atomically
from ._precompile_runtime import SERVES_ARTIFACTS, write_back
from ._precompile_schema import PrecompileError


PHASES = ("prefill", "decode")
_FREE_SIZES = {"prefill": "the batch and the prompt length", "decode": "the batch and the cache length"}
# Inclusive bounds of the free sizes (a request outside them is refused).
DEFAULT_MAX_BATCH = 64


_MASK = "attention_mask"
_USER_DEFINED = "_is_user_defined"  # generate()'s mark on a cache the caller passed
_TOKEN_WATCHERS = ("streamer", "logits_processor", "stopping_criteria")  # generate()'s arguments that see tokens only
# The model inputs prepare_inputs_for_generation() sets before the mask; the keyword
# arguments it forwards (use_cache, logits_to_keep, ...) follow it.
_BEFORE_MASK = frozenset({"input_ids", "inputs_embeds", "past_key_values", "position_ids", "token_type_ids"})


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
    call, with the global RNG restored afterwards (sampling draws from it), on
    a copy of a ``past_key_values`` passed, which the caller gets back unfilled,
    and without a streamer, logits processor or stopping criteria passed.
    Where generate() dropped an all-ones 2-D mask, the calls have it back, as
    ``serving()`` passes it (module docstring).
    """
    calls: list = []
    forward = model.forward
    # The caller's objects generate() would change stay as passed (Note invariant 8): the cache it
    # fills is copied, and what only watches or steers the tokens (a streamer's queue, a logits
    # processor's or stopping criterion's state), not the forward calls' arguments, is left out.
    generate_kwargs = {name: value for name, value in generate_kwargs.items() if name not in _TOKEN_WATCHERS}
    if generate_kwargs.get("past_key_values") is not None:
        generate_kwargs["past_key_values"] = copy.deepcopy(generate_kwargs["past_key_values"])

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
    mask = generate_kwargs.get(_MASK)
    dtype = mask.dtype if isinstance(mask, torch.Tensor) else torch.long  # generate()'s own mask is long
    takes_mask = _MASK in inspect.signature(model.forward).parameters
    recorded = {}
    for phase, kwargs in zip(PHASES, calls):
        cache = kwargs.get("past_key_values")
        # A compileable cache (StaticCache) gets the 4-D mask generate() builds, or none.
        if takes_mask and _MASK not in kwargs and not getattr(cache, "is_compileable", False):
            kwargs = _with_ones_mask(kwargs, _cache_length(cache), dtype, _BEFORE_MASK)
        recorded[phase] = _contiguous(kwargs)
    return recorded


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
    # A model with several kinds of layers (config.layer_types, as Qwen3 has) gets a dict of them.
    for mask in mask.values() if isinstance(mask, dict) else [mask]:
        if not isinstance(mask, torch.Tensor):
            continue
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
    ``max_position_embeddings``, or a ``StaticCache``'s ``max_cache_len`` where
    smaller: no longer sequence fits it); ``max_batch`` the batch.  Free dims need
    backend='inductor' (backend='eager' specializes every size, and the cache
    grows at every step).
    """
    if backend != "inductor":
        raise PrecompileError(
            f"precompile_generate(backend={backend!r}): the decode step's cache length changes at every "
            "token, which only backend='inductor' leaves free; use backend='inductor'"
        )
    register_caches(model)
    recorded = record_forward_calls(model, *args, **generate_kwargs)
    _refuse_sliding_window_layers(recorded["decode"].get("past_key_values"))
    if max_length is None:
        max_length = _default_max_length(model, recorded["decode"].get("past_key_values"))
    pairs = {}
    for phase, kwargs in recorded.items():
        mark_free_dims(kwargs, phase, max_batch, max_length)
        cache = kwargs.pop("past_key_values", None)
        try:
            pairs[phase] = precompile(_call_forward, model, kwargs, cache, backend=backend)
        except PrecompileError as error:
            if not isinstance(error.__cause__, GuardOnDataDependentSymNode):
                raise
            raise PrecompileError(  # the marks are the helper's, not the caller's
                f"precompile_generate: Inductor needs to decide {error.__cause__.cond} about the {phase} call's free "
                f"sizes ({_FREE_SIZES[phase]}) while optimizing this model's graph, which a size that changes between "
                "requests cannot decide. Call model.generate() eagerly for this model, or precompile its forward "
                "calls with precompile() and no mark_unbacked (every size specialized)"
            ) from error
    return pairs


def _default_max_length(model: torch.nn.Module, cache: Any) -> int:
    """The model's ``max_position_embeddings``, or a StaticCache's ``max_cache_len`` where smaller.
    The bound also decides the model's slices of its own tables: GPT-Neo slices its causal mask
    at ``cache_length - prompt``, which the trace knows is not below 0 only for prompts the cache holds."""
    length = getattr(model.config, "max_position_embeddings", None) or 2048
    return min(length, cache.get_max_length()) if getattr(cache, "is_compileable", False) else length


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
    cache is empty, decode after.  A call the artifact does not fit (another kind of cache, a
    sequence past ``max_length``, other keyword arguments, sizes or dtypes) raises a
    PrecompileError (nothing changed) instead of running eagerly."""

    recorded = {phase: _RecordedCall.of(runnable) for phase, runnable in runnables.items()}

    def forward(**kwargs: Any) -> Any:
        cache = kwargs.pop("past_key_values", None)
        put_back = _contiguous_cache(cache)
        try:
            return serve(_contiguous(kwargs), cache)
        except PrecompileError:  # raised before the call changed anything: the caller's cache as passed
            put_back()
            raise

    def serve(kwargs: dict, cache: Any) -> Any:
        cache_length = _cache_length(cache)
        phase = "prefill" if cache_length == 0 else "decode"
        call = recorded[phase]
        if call is None:
            return runnables[phase](model, kwargs, cache)
        call.check(kwargs, cache, cache_length, phase)
        if kwargs.keys() != call.names:
            kwargs = call.conform(kwargs, cache, phase)
        with _marked_as(cache, call.user_defined):
            return runnables[phase](model, kwargs, cache)

    config = getattr(model, "generation_config", None)
    disabled = getattr(config, "disable_compile", None)
    if config is not None:
        config.disable_compile = True  # generate() would torch.compile the forward it is given
    try:
        setattr(forward, SERVES_ARTIFACTS, True)  # the artifacts' own forward check lets it stand for the class's
        with _forward_replaced(model, forward):
            yield
    finally:
        if config is not None:
            config.disable_compile = disabled


class _RecordedCall:
    """What a served artifact was recorded with: ``_call_forward``'s keyword arguments (args[1])
    and cache class (args[2]), and the longest sequence its free dims allow."""

    def __init__(
        self,
        keys: list,
        mask_dtype: torch.dtype | None,
        cache_type: Any,
        cache_initialized: bool | None,
        user_defined: bool | None,
        max_length: int | None,
        batch: int | None,
    ):
        self.keys = keys
        self.names = frozenset(keys)
        # Of a 2-D attention_mask, put back where generate() dropped an all-ones one (module docstring).
        self.mask_dtype = mask_dtype
        self.before_mask = frozenset(keys[: keys.index(_MASK)]) if mask_dtype is not None else frozenset()
        self.cache_type = cache_type
        self.cache_initialized = cache_initialized  # a StaticCache reset() keeps its tensors, a new one has none
        self.user_defined = user_defined  # generate()'s mark on the recorded cache (_marked_as)
        self.max_length = max_length  # the 2-D mask's bound: the cache and the new tokens
        self.batch = batch  # where it is not free: a StaticCache is allocated for one

    @classmethod
    def of(cls, runnable: Callable) -> "_RecordedCall | None":
        """None for a callable that is not such an artifact (it gets generate()'s arguments as they are)."""
        convention = getattr(runnable, "convention", None)
        children = convention.input_spec.children() if convention is not None else []
        if not children or children[0].type is not dict:
            return None
        spec, cache_spec = children[0], children[1] if len(children) > 1 else None
        keys, mask_dtype, max_length, batch = list(spec.context), None, None, None

        def tensor_of(name: str) -> Any:  # the TensorSpec of the keyword argument ``name``, or None
            if name not in keys:
                return None
            return convention.inputs[sum(child.num_leaves for child in spec.children()[: keys.index(name)])].tensor

        mask, tokens = tensor_of(_MASK), tensor_of("input_ids")
        if mask is not None and len(mask.shape) == 2:
            mask_dtype = getattr(torch, mask.dtype)
            max_length = next((high for dim, _, _, high in mask.free_dims if dim == 1), None)
        if tokens is not None:
            batch = tokens.shape[0]  # None where free
        cache_type, initialized, user_defined = None, None, None
        if cache_spec is not None and not cache_spec.is_leaf():
            cache_type = cache_spec.type
            template = pytree.tree_unflatten([torch.empty(())] * cache_spec.num_leaves, cache_spec)
            initialized = getattr(template, "is_initialized", None)
            user_defined = vars(template).get(_USER_DEFINED) if hasattr(template, "__dict__") else None
        return cls(keys, mask_dtype, cache_type, initialized, user_defined, max_length, batch)

    def check(self, kwargs: dict, cache: Any, cache_length: int, phase: str) -> None:
        """Refuse a call with another kind of cache, or longer than the artifacts' max_length, naming
        generate()'s options (the artifact's own refusal would name a tree structure or a dim)."""
        if self.cache_type is not None and type(cache) is not self.cache_type:
            raise PrecompileError(
                f"generation.serving: generate() passed the {phase} call {_cache_kind(type(cache))} as past_key_values, "
                f"but the {phase} artifact was recorded with {_cache_kind(self.cache_type)}: call generate() with the "
                "cache options the artifacts were recorded with (use_cache, cache_implementation, or a past_key_values "
                "of that class), or precompile_generate again with these"
            )
        if self.cache_initialized is not None and getattr(cache, "is_initialized", None) is not self.cache_initialized:
            states = ("new (its tensors not yet allocated)", "used before (reset() keeps its tensors)")
            raise PrecompileError(
                f"generation.serving: generate() passed the {phase} call a {type(cache).__name__} "
                f"{states[not self.cache_initialized]}, but the {phase} artifact was recorded with one "
                f"{states[self.cache_initialized]}: pass generate() a {type(cache).__name__} as the recorded one (a new "
                "one per request where it was recorded new), or precompile_generate again with such a cache"
            )
        tokens = kwargs.get("input_ids")
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")
        if self.batch is not None and tokens is not None and tokens.shape[0] != self.batch:
            raise PrecompileError(
                f"generation.serving: generate() passed the {phase} call a batch of {tokens.shape[0]}, but the {phase} "
                f"artifact was recorded for a batch of {self.batch} (a {type(cache).__name__} keeps the batch size it "
                f"was allocated for): serve batches of {self.batch}, or precompile_generate again with a batch of "
                f"{tokens.shape[0]}"
            )
        length = cache_length + (tokens.shape[1] if tokens is not None else 0)
        # Eager's write past a StaticCache's end raises IndexError; Inductor's kernel a RuntimeError.
        if getattr(cache, "is_compileable", False) and length > cache.get_max_length():
            raise PrecompileError(
                f"generation.serving: the {phase} call has a sequence of {int(length)} tokens ({int(cache_length)} in the "
                f"cache and {int(length - cache_length)} new), more than its {type(cache).__name__} holds "
                f"({cache.get_max_length()}, its max_cache_len): give generate() a larger cache, or fewer new tokens"
            )
        if self.max_length is not None and length > self.max_length:
            raise PrecompileError(
                f"generation.serving: the {phase} call has a sequence of {length} tokens ({cache_length} in the cache and "
                f"{length - cache_length} new), more than the {self.max_length} the artifacts were made for: "
                "precompile_generate(..., max_length=N) bounds the prompt and the cache (by default, by the model's "
                "max_position_embeddings, or a StaticCache's max_cache_len where smaller); precompile_generate again "
                "with a larger max_length, or give generate() a shorter prompt or fewer new tokens"
            )

    def conform(self, kwargs: dict, cache: Any, phase: str) -> dict:
        """``kwargs`` with the all-ones mask generate() dropped, where the artifact takes one; refused
        where the keys still differ, naming both (the artifact's own refusal would name only its input)."""
        passed = list(kwargs)
        if _MASK not in kwargs and self.mask_dtype is not None:
            kwargs = _with_ones_mask(kwargs, _cache_length(cache), self.mask_dtype, self.before_mask)
            if kwargs.keys() == self.names:
                return kwargs
        if _MASK in self.names.symmetric_difference(kwargs):
            if getattr(cache, "is_compileable", False):
                fix = (
                    f"with a {type(cache).__name__} generate() passes the 4-D mask it builds, and none for an unpadded "
                    "prompt's prefill, which serving() cannot make up: serve prompts padded (or not) as the recorded "
                    "one, or call generate() eagerly"
                )
            else:
                fix = (
                    "these artifacts were recorded without a mask (an unpadded prompt, by an earlier version): "
                    "precompile_generate again, which records the mask whatever the prompt's padding"
                )
            why = f"generate() passes an attention_mask only for a padded prompt (it drops an all-ones one); {fix}"
        else:
            why = "pass generate() the options the artifacts were recorded with, or precompile_generate again"
        raise PrecompileError(
            f"generation.serving: generate() passed the {phase} call the keyword arguments {passed}, but the "
            f"{phase} artifact was recorded with {self.keys}: {why}"
        )


@contextlib.contextmanager
def _marked_as(cache: Any, recorded: bool | None):
    """``cache`` with generate()'s mark on a cache the caller passed (``_is_user_defined``) as the
    artifact's was recorded, which is part of its structure, and the caller's mark back after the
    call: only generate() reads it (a DynamicCache the caller passes was otherwise refused)."""
    state = vars(cache) if type(getattr(cache, "__dict__", None)) is dict else None
    mark = state.get(_USER_DEFINED) if state is not None else recorded
    if mark == recorded:
        yield
        return
    _set_mark(state, recorded)
    try:
        yield
    finally:
        _set_mark(state, mark)


def _set_mark(state: dict, mark: bool | None) -> None:
    if mark is None:
        state.pop(_USER_DEFINED, None)
    else:
        state[_USER_DEFINED] = mark


def _cache_kind(cache_type: type) -> str:
    return "None (no cache)" if cache_type is type(None) else f"a {cache_type.__name__}"


def _with_ones_mask(kwargs: dict, cache_length: int, dtype: torch.dtype, before: frozenset) -> dict:
    """``kwargs`` with the all-ones 2-D mask of the sequence so far (the cache and the new tokens)
    after its leading keys in ``before``, as generate() would have passed it: fn's ``model(**kwargs)``
    observes the order."""
    tokens = kwargs.get("input_ids")
    if tokens is None:
        tokens = kwargs["inputs_embeds"]
    batch, new = tokens.shape[:2]
    items = list(kwargs.items())
    at = next((index for index, (name, _) in enumerate(items) if name not in before), len(items))
    mask = torch.ones(batch, cache_length + new, dtype=dtype, device=tokens.device)
    return dict(items[:at] + [(_MASK, mask)] + items[at:])


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
    the cache's are rebound in place (``_contiguous_cache``)."""
    _contiguous_cache(kwargs.get("past_key_values"))
    return {name: value.contiguous() if isinstance(value, torch.Tensor) else value for name, value in kwargs.items()}


def _contiguous_cache(cache: Any) -> Callable[[], None]:
    """Rebind ``cache``'s tensors that are not contiguous to contiguous copies, in place (it is the
    caller's object, which the call updates); returns what puts them back, for a call refused."""
    layers = getattr(cache, "layers", None)
    if type(layers) is list:  # transformers' caches: each layer's keys and values, without a flatten per token
        replaced = []
        for layer in layers:
            for name in ("keys", "values"):
                tensor = getattr(layer, name, None)
                if isinstance(tensor, torch.Tensor) and not tensor.is_contiguous():
                    replaced.append((layer, name, tensor))
                    setattr(layer, name, tensor.contiguous())

        def put_back() -> None:
            for layer, name, tensor in replaced:
                setattr(layer, name, tensor)

        return put_back
    if cache is not None:
        leaves, spec = pytree.tree_flatten(cache)
        if not all(leaf.is_contiguous() for leaf in leaves if isinstance(leaf, torch.Tensor)):
            copies = [leaf.contiguous() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
            write_back(cache, pytree.tree_unflatten(copies, spec))
            return lambda: write_back(cache, pytree.tree_unflatten(leaves, spec))
    return lambda: None


def _cache_tensors(cache: Any) -> list:
    """Each layer's keys and values (3+ dims: batch first); a cache's counters are left alone."""
    if cache is None:
        return []
    return [leaf for leaf in pytree.tree_leaves(cache) if isinstance(leaf, torch.Tensor) and leaf.dim() >= 3]


def _cache_length(cache: Any) -> int:
    return 0 if cache is None else cache.get_seq_length()
