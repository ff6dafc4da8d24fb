"""torch.compiler.precompile: ahead-of-time capture of a whole computation.

Where it lives: installed (torch 2.11-2.14), this file is
``torch_precompile._precompile`` and the API is ``torch_precompile.precompile``
/ ``torch_precompile.load`` / ``torch_precompile.PrecompileError``, also
attached as ``torch.compiler.precompile`` / ``PrecompileError`` on torch that
has no precompile of its own (2.11-2.13; torch 2.14's own is left alone).  In
a PyTorch checkout with ``patches/torch_compiler_init.patch`` it is
``torch._precompile`` and ``torch.compiler.precompile``.  The modules import
each other relatively and downward only: ``_precompile_files`` (torch 2.15's
file-based front-end, ``torch_precompile.files``) over ``_precompile`` (this API
and load, which import the rest at their first call) over
``_precompile_capture`` / ``_precompile_artifact`` (writing and running a pair)
/ ``_precompile_inspect`` over ``_precompile_format`` (the artifact format) over
``_precompile_runtime`` (the driver) and ``_precompile_compat``, and both over
``_precompile_schema`` (the calling convention's records and codec) over
``_precompile_error`` (``PrecompileError``).

Note [precompile programming model]
===================================

``precompile(fn, *example_inputs)`` captures ``fn`` -- the whole computation,
taking its model(s) as explicit arguments -- into ``(python_code, cache)``;
``precompile.load(python_code, cache)`` turns the pair back into a runnable
with fn's calling convention.  The contract, invariant by invariant; each
says who guarantees it and, where it is enforced, which tests (in
``test/``) prove it:

1. Modules are arguments, not state.  Every ``nn.Module`` argument has its
   parameters and buffers lifted to graph inputs (parameters of all modules,
   then buffers; tied tensors collapse to one input by identity), so the
   artifact holds no weights and the model is passed again at every call.
   Enforced at every call: module positions, parameter/buffer names, shapes,
   dtypes, devices and tying (test_precompile.py TestRuntimeChecks,
   TestCapture; test_precompile_zoo.py TestNoWeightsLeave).
2. No live state.  A tensor fn reads that is neither derived from its
   arguments nor created inside fn (a global, a captured local, an
   unregistered module attribute) is refused at capture; tensor literals
   created inside fn are code and are baked bit-exactly.  A module argument,
   or a submodule of one, that fn also reaches through a closure cell, a
   global its code names, a bound ``self`` or a ``functools.partial``'s
   arguments (``clip_grad_norm_(model.parameters())`` on the global
   ``model``) is refused too: at capture it is the argument itself, whose
   tensors the trace swaps for its own, but eager fn would keep reading it
   when called with another module (a parameter held there is the caller's
   tensor, refused as above when read) (test_precompile_capture_soundness.py
   test_module_arguments_reached_around_fn_are_refused); so is a container
   there holding a module argument's parameter or buffer (a dict keyed by
   parameters would miss every lookup of the trace's stand-ins)
   (test_module_tensors_held_in_containers_fn_reaches_are_refused).  An
   ``nn.Parameter`` made inside fn (by fn or a module it builds) is refused:
   the trace cannot follow it (test_a_parameter_made_inside_fn_is_refused_saying_so).
   Enforced (TestCaptureContract).
3. Specialization.  Capture is a non-strict make_fx trace: Python control
   flow follows the example inputs, and every size, dtype and device is baked
   and checked at every call.  During the trace (only),
   ``torch.compiler.is_compiling()`` and ``is_exporting()`` are true, as in
   torch.export's non-strict capture, so model libraries take their
   trace-friendly paths (a padding mask stays a runtime input instead of a
   data-dependent shortcut) (test_precompile_real_models.py).  Where a
   library branches on it, results can therefore differ from eager's in
   the last bits (about 1 ulp): transformers applies a causal mask where
   eager sdpa runs ``is_causal=True`` without one, and attends over a whole
   ``StaticCache`` with a mask where eager slices it to the used length.  Strides are
   specialized too, on both backends (except empty tensors, and an
   input's size-1 dims; a module's tensors' size-1 dims are compared, torch
   picks memory formats from them:
   test_module_tensors_strides_are_checked_on_size_one_dims):
   the trace bakes layout-dependent decisions (``.contiguous()`` of a
   contiguous example is an alias a later in-place write would send to the
   caller's input, ``reshape`` / ``flatten`` become ``view``,
   ``x.is_contiguous()`` branches), and Inductor compiles its kernels for
   them; the driver checks them before every call
   (test_precompile_soundness.py test_strides_are_checked), so
   Inductor's own graph-input size/stride asserts, which would repeat that
   check, are dropped from its module (its asserts on extern kernels' outputs
   stay).  An eager artifact written before strides were recorded on both
   backends has none in its convention and its calls check none.  Non-tensor input leaves are baked and a
   different value is refused.  The one exception: a user-input dim marked
   with ``mark_unbacked`` (inductor only) is an unbacked symint -- its bounds
   and the equalities the graph needs between marked dims are checked at
   every call.  A mark's ``min=`` / ``max=`` are inclusive bounds on that
   size, checked at every call.  Where the trace must decide something about
   marked sizes that the bounds do not (sdpa's ``q_length > 1``; a mask one
   longer than the cache, ``mask - kv - 1 == 0``), a linear requirement is
   taken from the example's sizes as a size fact (``convention.size_facts``,
   naming the line that needed it), the trace is redone with it assumed, and
   the driver checks it at every call, refusing a call that breaks it; a
   guard that is not linear in the marked sizes is refused at capture
   (test_precompile_llm.py TestSizeFacts, TestGenerate).  A marked size the
   trace sets to a linear function of others without a guard (a broadcast
   of that mask with the cache grown by one) becomes that size fact too,
   refused at capture where the example's sizes break it
   (test_precompile.py test_a_free_size_tied_to_others_becomes_a_size_fact).
   What Inductor's lowering asks of the marked sizes is decided the same way
   (a CPU bmm's layout choice asks whether its rows are 1: Falcon's prefill):
   a linear question becomes the size fact the example decides and fn is
   captured again with it assumed, where the lowering can decide it; the FX
   graph cache keys a graph by the facts it was captured with (test_precompile.py
   test_what_inductors_lowering_asks_of_a_marked_dim_becomes_a_size_fact;
   another question is refused: test_a_question_inductor_asks_not_linear_in_marked_dims_is_refused_where_asked).
   A squeeze of a
   marked dim (``x.squeeze()``) is decided without a guard -- the trace keeps
   the dim, eager drops one of size 1 -- so it gives the size fact
   ``size != 1`` (``== 1`` where the example's is 1) the same way
   (test_precompile.py test_squeezed_marked_dim_becomes_a_size_fact).
   Marks sharing a ``shape_id`` are one size, unbounded unless a mark
   bounds it, with the tightest of their bounds (min= on one input, max= on
   another), checked by the driver (test_precompile_hook_guards.py
   test_marks_sharing_a_shape_id_are_one_unbounded_size,
   test_shape_id_bounds_from_two_marks_are_merged).  Marked dims the graph
   needs equal (an elementwise op between them: the trace never broadcasts
   a free size as a 1) must be equal in the example too; an example that
   broadcasts them is refused at capture
   (test_precompile.py test_marked_dims_the_example_broadcasts_are_refused).
   A marked input's strides vary with its sizes, so its layout is
   pinned as a memory format instead (``contiguous_format``,
   ``channels_last``); the graph's outputs are then dense but may be in
   another memory format than eager's (values are equal).  Input and output
   pytree structures are recorded with treespec_dumps, else by import path:
   each node type, and a class context (a plain namedtuple's), as
   ``module:qualname``, imported at load; a context that is a literal as
   itself; an input's other context by its repr (an output's must be
   rebuilt: refused).  The call compares the caller's structure with it,
   contexts included, and a context holding numbers as baked values are
   (``1`` is not ``1.0`` nor ``True``, ``-0.0`` is not ``0.0``, which
   TreeSpec's ``==`` takes as equal; test_nodes_without_keys_or_a_json_context).  Refused at capture, by argument: a class load could
   not import (defined inside a function), a repr with an address.  A plain
   dict input with the same keys in another order is mapped by key, unless
   fn observed the order (iterated over it, ``model(**batch)`` included: a
   probe dict records it during the trace): then, like other keys, refused
   naming both.  Arguments may be
   passed by keyword: fn's signature is recorded as literals and a call
   binds like Python; a parameter the capture left to its default (its
   value baked) is refused by name.
   Enforced (TestRuntimeChecks, TestFreeDims, test_precompile_fuzz.py,
   test_precompile_real_models.py TestFreeDims, TestStructures;
   test_precompile_structures.py).
4. The whole step.  If fn calls ``.backward()``, forward and backward are one
   graph; the runnable writes parameter gradients onto the runtime model's
   ``.grad`` exactly like eager (assign when None, else add; invariant 13).  Which
   parameters receive a gradient is fixed at capture.  A buffer or user input
   that would receive a gradient is refused.  The runnable's outputs carry no
   autograd history: backward must happen inside fn.  An output that is a view
   of a tensor argument requiring grad (``m.weight.t()``) is made again from
   that argument after the graph, in the caller's grad mode, so a backward
   through it reaches the parameter as through eager's view (its node is
   ``AsStridedBackward0``; test_a_backward_through_a_returned_view_of_a_parameter_reaches_it),
   one fn detached (``m.weight.detach()``, ``.data``) without history, as
   eager's (test_a_returned_view_fn_detached_from_a_parameter_has_no_history),
   and one fn made under its own ``no_grad()`` under no_grad, requiring grad
   without history as eager's
   (test_a_returned_view_made_under_fns_no_grad_has_no_history);
   one as_strided cannot make again that autograd follows back to it (a lazy
   ``.conj()``, ``.real``, ``view_as_real``) is refused at capture
   (test_a_returned_view_as_strided_cannot_rebuild_is_eagers_or_refused).
   Enforced (TestTraining, test_precompile_zoo.py).
5. Side effects.  Effectful ops and control-flow higher-order ops are refused
   at capture, and so is rebinding a module attribute instead of updating it
   in place; in-place updates of buffers and inputs (BatchNorm running stats,
   a StaticCache) are part of the graph and happen at every call, also where
   fn discards the op's output (a pass that only refreshes BatchNorm's
   statistics, whose ATen schema hides the write: the eager backend's
   dead-code pass keeps it; test_batch_norm_whose_output_is_discarded_updates_running_stats).  An input
   object fn changes beyond its tensors' values (an attribute rebound, as a
   DynamicCache's update does; an element or key added) is recorded as it is
   after fn (``convention.rebound_inputs``: its tree becomes part of the
   output) and written back into the caller's object after every call,
   objects of the same type updated in place (``write_back``), so the
   caller's references stay valid as in eager; one that cannot be (a tuple,
   an object without ``__dict__``) is refused at capture.  The trace rebuilds
   each argument from its pytree, so a mutable container (a list, a dict, a
   registered node object) at two places of the arguments, across or within
   them, would be two: where fn changes an input object such sharing is
   REFUSED at capture and at every call (checked as the call flattens, where
   the captured structure has two such containers), naming both paths
   (test_precompile_llm.py
   test_a_container_at_two_places_is_refused_where_fn_changes_inputs).
   Where fn changes none, sharing is only read, as in eager, except by
   identity (``a is b`` between containers fn did not change reads False in
   the trace): the caller's responsibility, unchecked.  So is an attribute
   fn sets on a registered node object outside what its flatten records
   (``box.seen = True`` where the flatten keeps ``box.t``): pytree cannot
   see it, the call does not repeat it.  Where fn leaves
   its structure as it was (only tensors rebound), each new tensor is
   written where the old one sat (``leaf_places``), and the next call that
   finds the argument as that write left it (``LeftAsWritten``: dict
   versions, classes, list elements; the argument held weakly) reads its
   leaves there instead of flattening it again.  A pytree node of
   fn's result that was one of its input objects (a cache it returns) is the
   caller's object (``convention.returned_inputs``), and a tensor fn returns
   twice is one tensor.  Enforced (TestCaptureContract, TestCapture;
   test_precompile_llm.py TestCacheObjects, TestInputTrees).
6. The code is the contract.  ``python_code`` is self-contained (it runs with
   only torch installed, compiling kernels on first use) and is the single
   source of truth for the calling convention; ``cache`` only accelerates and
   is bound to the code by its sha256, its payload by another, each kernel
   and the sections' compiled Python (marshalled for the Python that built
   them) by the sha256 python_code records for it.  A damaged, foreign or
   other-version cache is ignored with a warning; one bound to other code
   raises.  python_code with CRLF line endings or a byte-order mark, which
   precompile never writes, is refused naming them; ``files.load`` and the
   inspector read a file as Python reads source, undoing both
   (test_precompile_kernel_store.py
   test_crlf_line_endings_and_a_byte_order_mark_are_named).  Kernels run only from verified files in a private store, checked
   at every load (nothing on the way to it another user's, symlinks included).
   Enforced (TestArtifact, TestLoad, test_precompile_fuzz.py TestFuzzLoad,
   test_precompile_kernel_store.py).  Layout: a header of literal constants
   (the calling convention, whose ``format_version`` and ``backend`` are the
   artifact's, stored nowhere else; bytecode and kernel hashes), then code sections in
   reading order -- ``graph`` (the eager ATen graph, each node annotated with
   its dtype[shape] and the line of fn or the model that produced it
   (test_eager_graph_names_the_source_line_of_each_node), or Inductor's module),
   ``driver`` (``torch/_precompile_runtime.py``'s core verbatim, and of its
   optional parts -- gradients, data_parallel, sharded, optimizer,
   input_objects, inductor, library_hooks -- those the convention uses:
   ``driver_parts``)
   and ``forward`` (binds them) -- each opened by a marker line.  Run alone
   they share one namespace, so the driver may not rebind the other sections'
   names (checked at render).  ``load``
   takes the graph and forward from the cache when it holds this Python's code
   objects and python_code pins their bytes (BYTECODE_SHA256, which pins the
   header's constants too, so a warm load parses no header; otherwise it
   compiles them) under ``<precompile artifact sha[:12]>.py``, named after the
   text, registered lazily with ``linecache`` so tracebacks and pdb show the
   artifact's lines, and reuses the installed driver when the section is its
   exact text (the cache carries no driver: otherwise the section is compiled)
   (TestArtifact test_traceback_shows_artifact_lines,
   test_warm_load_compiles_no_python, test_driver_parts,
   test_cached_bytecode_is_used_only_when_python_code_pins_it).
7. Trust.  ``load`` executes ``python_code`` and loads compiled kernels from
   ``cache``: only load pairs you trust.  It reads the calling convention with
   ``ast`` (or, warm, takes the cache's copy that python_code pins) and the
   cache's JSON envelope and raw entries (no unpickling) before executing
   anything but the imports of the classes an input/output structure names
   by import path (invariant 3; the inspector, for pairs not yet trusted,
   imports none: test_named_classes_are_not_imported), and warns at every
   load (TestLoad).  A header statement other than those constants' literal
   assignments, which a standalone ``exec`` would run and ``load`` would
   not, is refused as an edit
   (test_header_statements_other_than_the_constants_are_refused).
   Trusting the pair is the caller's responsibility.  The convention's records
   (``_precompile_schema.CallingConvention`` and the specs it holds) are
   their own schema: each field is decoded by its annotation, then the
   cross-references are checked (``validate_convention``); an artifact whose
   ``format_version`` is outside ``MIN_CONVENTION_VERSION..CONVENTION_VERSION``
   is refused before that, by ``_check_format_version``, naming both
   (TestConventionSchema), and a cache outside its own versions
   (``MIN_CACHE_VERSION..CACHE_VERSION``) is ignored.  Pairs written by
   earlier versions are checked in and called against eager
   (test_precompile_golden.py): the minimums are tested, not declared.
8. Capture has no side effects on the caller.  ``precompile`` traces on
   clones, so the caller's parameters, buffers, ``.grad`` and inputs are
   bit-identical afterwards, also when fn raises (TestCaptureContract); fn
   rebinding the caller's ``.grad`` through a closure is undone and refused.
   The global RNG (CPU, and CUDA when initialized) that tracing and lowering
   draw from is restored, so ``torch.manual_seed(s); precompile(...)`` and a
   call reproduce eager's ``torch.manual_seed(s); fn(...)``
   (test_precompile_capture_soundness.py test_rng_untouched_*,
   test_rebinding_caller_grad_refused_and_restored).
   An optimizer argument's param_groups and state are restored too
   (invariant 15).  The module arguments' Python state is restored before
   each trace and on every exit of capture, refused or not, from a snapshot
   taken before the first trace: each submodule's ``__dict__`` (attributes
   set, rebound or deleted) and the contents of the containers nn.Module
   keeps there (every hook dict, children, parameters, buffers;
   ``compat.module_containers``), and the ``__dict__`` of each plain
   object fn reaches through them (a config), from a snapshot taken at fn's
   first read of it.  A refusal thus leaves no hook or flag a
   library installed at fn's first call (transformers' output capturing for
   ``output_hidden_states``, which would make every artifact of that model
   refuse its calls), and no trace's tensor in a module (an RNN's
   ``_flat_weights``).  What fn itself changes during a trace (compared
   with its modules as the trace began, the trace's stand-ins for their
   tensors counting as the caller's) and no other check refuses -- an
   attribute fn sets without reading it (on a module or on such an object:
   ``config.calls = 1``), a hook or submodule it registers -- is refused
   naming it: eager's call leaves it on the model, the
   artifact's would not (test_hooks_fn_installs_are_removed_when_capture_refuses,
   test_module_changes_no_other_check_refuses_are_refused_and_undone,
   test_precompile_read_guards.py test_config_writes_fn_makes_without_reading_are_refused_and_undone,
   test_what_the_trace_leaves_in_a_module_is_undone;
   test_precompile_llm.py test_hidden_states_hooks_are_removed_when_capture_refuses).
9. Kernels are machine code.  Cached kernels load only when the cache's build
   environment (torch, Python, platform, CPU capability and, as the kernels
   are built with -march=native, the CPU's extensions; for Triton kernels
   also the GPU architecture and Triton version) equals this process's;
   otherwise ``load`` warns once and compiles from python_code.  Warm loads
   run no compiler and import neither ``torch._inductor`` nor
   ``torch._dynamo`` (TestInductorCache); on a GPU they import no Triton
   either: each cubin is launched from the record precompile kept of its
   autotuned config (test_precompile_cuda.py).  A CUDA artifact is refused
   before anything runs where the process has no such GPU.  Inductor's C++
   is written for the capturing host's vector ISA (its width sets the loops'
   step), which the header records (INDUCTOR_VEC_ISA): compiled from
   python_code, by load or run alone, it is compiled for that ISA, or refused
   where this machine does not run it (test_precompile.py TestVectorISA).  An
   artifact older than that record, whose own driver compiles for this
   machine's ISA, is refused by ``load`` where a kernel must be compiled and
   its cache names another CPU capability, or none
   (test_a_pair_older_than_the_isa_record_is_refused_where_the_capability_differs).
10. Threads.  An inference runnable may be called from several threads at
   once (test_precompile_concurrency.py); a training step writes ``.grad``
   and must not run concurrently on the same model: caller's responsibility.
   Another thread changing a model while a call checks it races as in eager
   (the call sees the old or the new value), but what the driver caches as
   checked is what it checked: the cached snapshot is taken before its
   values are checked again, the tensor guard records the tensors before they
   are checked, and a hook probe's handle and its count are one step under a
   process-wide lock, so a write landing inside a call is refused then or at
   the next call (test_precompile_concurrency.py TestWritesDuringACall,
   TestHookEpoch).  ``precompile()`` calls run one at a time (a process-wide reentrant lock,
   ``_PRECOMPILE_LOCK``), because capture and lowering change process-global
   state, not per-thread state: capture disables MKLDNN
   (``torch.backends.mkldnn.flags``), sets torch.compiler's compiling and
   exporting flags, runs selective activation checkpointing as in eager
   (``compat.checkpoint_regions_as_in_eager``), swaps the module arguments' tensors for traced leaves
   (``_reparametrize_module``), points optimizer arguments at traced state and
   forks the global RNG; lowering patches Inductor's global config and its C++
   codegen (divisors checked; tiled kernels indexed as torch 2.14's are,
   where torch 2.11-2.13 added a scatter-add's gradient into the wrong
   elements: test_a_scatter_add_in_a_tiled_kernel_adds_where_eager_does).  All of it
   is restored on exit, also when fn raises
   (test_two_threads_capture_one_at_a_time,
   test_two_threads_lower_one_at_a_time).  Other threads are not locked out:
   eager code, torch.compile or an artifact call running meanwhile sees that
   state; using the module or optimizer arguments from another thread while
   precompile() runs is the caller's responsibility.  The driver's one piece of
   process-global state is its structure counter, not moved while Dynamo
   traces (torch.compile in the same process would guard on it and recompile
   at every call of a model that registers modules in its forward, as HF
   decoders do; test_precompile_llm.py TestTorchCompileCoexists), registered once per process
   on nn.Module's global registration hooks and shared by every artifact.
   Called inside torch.compile, a loaded artifact is a graph break: Dynamo
   runs it eagerly with its checks instead of inlining them as guards, and
   ``fullgraph=True`` refuses it.  ``copy.copy`` and ``copy.deepcopy`` give
   the runnable itself, as for a function (it holds code and caches valid
   for any caller), so a model holding one deep-copies; pickling it is
   refused: save the pair (test_precompile.py TestLoadedRunnable).  The
   private torch internals all this relies on (a path per release, 2.11-2.14) are listed in
   ``torch/_precompile_compat.py`` (the driver's in its own marked section) and
   pinned by test_precompile_compat.py.
11. Nothing baked goes unchecked.  A call either computes what eager fn
   computes on it, or raises a PrecompileError naming the argument, what was
   captured and what was passed, before any state changes (no buffer update,
   no ``.grad``, no input written).  The ledger: everything fn can observe,
   and whether it is LIFTED (a graph input, read at every call), CHECKED at
   every call, or REFUSED at capture.  The runnable lists what it checks,
   one line each (``PrecompiledFunction.checks``; ``TORCH_LOGS=precompile_checks``
   at load; the inspector's ``--checks``), every line enforced naming its
   subject (test_precompile.py TestChecksListing).  Tests are in
   test_precompile_soundness.py TestSoundness unless named otherwise; the
   fuzzer (test_precompile_fuzz.py test_fuzzed_soundness_call,
   test_fuzzed_read_values) flips modes, aliasing, requires_grad, module
   structure and classes, hooks, plain values fn reads (private and class
   attributes, list elements, config fields), an existing ``.grad`` and
   global state between calls.

   Argument tensors
   - values: LIFTED.  Shape, dtype, device, strides: CHECKED (invariants 1,
     3; on both backends).  Types: CHECKED (the tensor guard compares
     the Python type); a subclass with its own ``__torch_function__`` is
     REFUSED at capture and at a call, its Python logic would run only once
     (test_torch_function_subclasses_are_refused).
   - requires_grad: recorded for every lifted and user-input tensor and
     CHECKED when the graph runs autograd (fn calls ``backward()`` or
     ``torch.autograd.grad``): a frozen parameter, a swapped-in
     ``requires_grad=False`` Parameter or an input that now requires grad is
     refused (test_frozen_parameter_is_refused,
     test_input_requiring_grad_is_refused_by_a_training_step).  A forward
     computes the same values either way: honoured, outputs carry no history
     (invariant 4; test_forward_with_an_input_that_requires_grad_runs_under_no_grad),
     unless fn or a module's code reads ``.requires_grad``: an argument
     tensor's is then CHECKED, and an intermediate's, which follows grad mode
     and the arguments', counts as a grad mode read with every argument's
     requires_grad CHECKED (test_requires_grad_reads_are_checked); and
     except an input it writes in place, which eager refuses or records in
     autograd: REFUSED when it requires grad
     (test_written_input_that_requires_grad_is_refused).
   - Aliasing: capture traces every distinct tensor on its own clone, so the graph
     assumes distinct memory.  Where the graph writes a tensor input in
     place, example tensors sharing memory with it are REFUSED at capture,
     and at every call a user input sharing memory (``torch._C._is_alias_of``,
     i.e. the same storage, overlapping or not) with a written tensor, or a
     written user input sharing memory with any parameter/buffer or other
     input, is refused; parameters/buffers among themselves are CHECKED at
     every call of a graph that writes one (one pass over their storages'
     data pointers: ``p.set_(buf)``, parametrize's ``m.weight = buf`` and
     ``swap_tensors`` share memory past every registration hook;
     test_precompile_hook_guards.py
     test_state_made_to_share_memory_past_the_hooks_is_refused).  On backend='inductor', an
     incoming ``.grad`` the graph takes (fn reads it) sharing memory
     (overlapping spans) with another ``.grad`` or tensor input, where the
     graph writes either, is refused (``m.a.grad = m.b.grad = g`` before a
     ``zero_grad(set_to_none=False)`` step; views of one flat buffer are
     fine), checked again when a ``.grad`` or parameter is another object
     (test_grads_sharing_memory_read_inside_the_graph).  Graphs that write no input do not
     care about memory (test_aliased_inputs_are_refused_when_written); identity
     they may: one tensor passed for several arguments (``fn(x, x)``), written
     or not, is LIFTED as one and traced as one clone, so a write through one
     reaches the other and ``a is b`` is what eager sees
     (nn.MultiheadAttention branches on ``query is key``).  The user tensors'
     identity partition is CHECKED at every call (``convention.same_inputs``):
     one object where capture had one, distinct objects where it had distinct
     ones, a call that differs refused naming both paths (with two or more
     tensor inputs; one count of distinct ids per call;
     test_precompile_hook_guards.py test_one_tensor_passed_twice_and_written,
     test_identity_between_tensor_inputs_is_as_captured,
     test_multihead_self_attention_is_captured_as_self_attention).  With
     marked dims it is REFUSED at capture: the symbolic trace takes each leaf
     as its own tensor
     (test_one_tensor_passed_twice_with_marked_dims_is_refused_at_capture).
     Artifacts written before this recorded only written groups and run their
     own driver, which checks only those.  The module arguments' identity
     partition (``fn(m, m)``) is CHECKED alike (``convention.same_modules``,
     when the module cache entry, keyed on their ids, is built: a module
     with no tensor has no tie to show it; older artifacts check none;
     test_precompile_hook_guards.py
     test_identity_between_module_arguments_is_as_captured).  Containers (lists, dicts, node
     objects) at two places: invariant 5.  A module's own
     parameter or buffer passed again as an input (``fn(m, x, list(m.parameters()))``)
     is REFUSED at capture: its gradient and writes would not reach the module's
     (test_state_passed_again_as_an_input_is_refused).
     Outputs that are an input (or a buffer) or a view of one: the eager
     graph returns the views itself; backend='inductor' returns fresh
     buffers, so the driver rebuilds each from the runtime input after the
     graph ran (``convention.output_views``: the input itself, or
     ``as_strided`` with the captured static size/stride/offset), and writes
     through them reach the input as in eager; a view with another dtype or
     sizes depending on a marked dim is REFUSED at capture
     (test_precompile_hook_guards.py test_outputs_aliasing_inputs_stay_views,
     test_views_inductor_cannot_rebuild_are_refused_at_capture), and so, on
     backend='inductor', are a lazily conjugated or negated view
     (``x.conj()``, ``x.mH``; test_lazily_conjugated_views) and a view of a
     ``.grad`` or of optimizer state (``m.weight.grad[0]``; the ``.grad``
     itself is returned as eager returns it; test_views_of_a_grad).  An
     output fn computes is a new tensor, never an input's memory (Inductor's
     folding of uniform constants, which gave ``x + zeros`` back as ``x``
     itself, is off: test_outputs_fn_computes_are_new_tensors), with eager's
     strides where those are dense and static (Inductor's decompositions gave
     ``cat``, ``index_select`` and ``linalg.cross`` others; each such output's
     layout is required of Inductor: test_outputs_have_eagers_layout).  A copy fn
     makes of an input stays a copy where the input is written after it or
     the copy becomes an input's storage (``t = a.clone(); a.copy_(b);
     b.copy_(t)``, ``p.set_(q.clone())``), which Inductor's no-op removal,
     torch.compile's too, would read through the written input
     (test_copies_of_inputs_are_kept_where_inductor_would_drop_them).
     ``unsafe_split`` / ``unsafe_chunk`` pieces are views as eager returns
     them, though their schema declares none (traced as ``split``:
     test_writes_through_unsafe_split_pieces_reach_the_input); a write
     through one moves the input's version counter, which eager's unsafe
     ops (and writes through ``x.data``) leave as it was.
   - Layout changes in place (``resize_``, ``squeeze_``, ``as_strided_``,
     ``t_``, an ``out=`` that resizes): honoured by backend='eager', which
     runs the ops; REFUSED at capture by backend='inductor', whose kernels
     would keep writing the old memory (test_precompile.py
     test_input_layout_changes).
   - Version counters: every parameter, buffer and input tensor the graph
     writes (``convention.mutated``) has its counter moved, as eager's
     in-place ops move it, so a backward that saved it is refused as in
     eager (test_written_tensors_version_counters_move); the ``.grad`` and
     optimizer state an Inductor graph writes are not.  Called outside
     ``torch.inference_mode()``, a tensor the graph writes that is an
     inference tensor (a cache filled under it) is REFUSED, on both backends:
     eager refuses that in-place update, Inductor's kernels would not
     (test_written_inference_tensors_are_refused); so is an inference tensor
     in an optimizer's state, which the step updates
     (test_an_optimizer_step_refuses_inference_state_outside_inference_mode).
     An artifact that runs backward REFUSES every inference tensor it takes
     (parameters, buffers, inputs, optimizer state, incoming ``.grad``, a
     ``.grad`` backward adds to: test_a_grad_backward_cannot_add_to_is_refused_before_anything_changes) and a
     call under ``inference_mode()``: eager's autograd refuses to save one for
     backward or update one in place there, and records nothing under it
     (test_inference_tensors_a_training_step_takes_are_refused,
     test_a_training_step_under_inference_mode_is_refused).  This also
     refuses the rare fn eager would run (an inference tensor only added):
     refuse or honour.  Checked on the slow path only (``.grad`` at every
     call; one backward only adds to, once per tensor object): the guards compare dispatch keys with the thread's
     local ones applied, which differ for an inference tensor and under
     ``inference_mode()``, so such a call misses them; an inference
     artifact keeps the written-tensors rule
     (test_an_inference_artifact_takes_inference_tensors).
   - How the caller made a tensor and where it sits (``is_leaf``,
     ``grad_fn``, ``_version``, ``_base``, ``_is_view()``,
     ``is_inference()``, ``storage_offset()``, ``data_ptr()``): no call
     checks them; a read by fn's or its modules' own code (not torch's) is
     REFUSED at capture (test_tensor_facts_fn_reads_are_refused).
   - Python attributes fn reads on a tensor argument that a plain tensor
     lacks (``getattr(p, "no_wd", False)``; ``_is_param``, found absent, for
     ``isinstance(x, nn.Parameter)``): read from the caller's tensor (capture's
     stand-ins lack them), a plain value or absent, and CHECKED at every call
     (``convention.tensor_attributes``); another value, and fn setting or
     deleting one, REFUSED at capture (test_precompile_read_guards.py TestTensorAttributes).
   - Lazy conjugate / negative bits (``x.conj()``, ``torch._neg_view``):
     CHECKED; refused by backend='inductor', whose kernels read raw memory,
     honoured by backend='eager' (test_lazy_conj_and_neg_bits).
   Modules
   - Parameters and buffers: LIFTED; names, tying and layouts CHECKED
     (invariant 1).  A buffer that is a parameter itself
     (``register_buffer("w", self.l.weight)``) and an uninitialized lazy
     module's parameter (run one eager forward first) are REFUSED at capture
     (test_precompile_capture_soundness.py
     test_a_buffer_that_is_a_parameter_is_refused_at_capture,
     test_an_uninitialized_lazy_module_says_to_run_it_once).  Tying both ways: names tied at capture must be one
     tensor, and distinct tensors at capture tied since
     (``m[2].weight = m[0].weight``) are REFUSED naming both, whenever the
     module cache is rebuilt (test_precompile_hook_guards.py
     test_weights_tied_after_capture_are_refused).
   - Structure: submodule names and classes CHECKED (a ReLU swapped for a
     Tanh is refused), classes by import path (module and qualname).  Edits
     that bypass nn.Module's registration hooks are still seen:
     ``del model.fc2``, ``del model.layers[1]``, ``del`` + ``insert``
     reorders, ``del model.lin.bias`` (a reorder with equal names and
     shapes is honoured; a missing one is refused), and a
     submodule replaced by a write into ``_modules`` (as Dynamo's replay of
     ``model[2] = ...`` in a torch.compile'd function does): each
     ``_modules`` dict's submodules are compared by identity
     (test_module_edits_bypassing_hooks_are_seen,
     test_module_classes_and_read_attributes_are_checked;
     test_precompile_llm.py test_a_submodule_replaced_inside_torch_compile_is_seen).
   - Mode: capture records which submodules' ``training`` flag fn reads
     (BatchNorm, Dropout, user code); those flags are CHECKED, however they
     were set.  A flag never read cannot have shaped the graph: a Linear in
     eval mode is honoured.  fn changing a mode (``model.eval()`` inside fn)
     is REFUSED (test_module_mode_is_checked,
     test_capture_refuses_fn_that_changes_a_mode).
   - Plain values fn reads (``LayerNorm.eps``, ``self._scale``, a class-level
     default, ``self.scales[0]``, ``self.config.rope.theta``): every
     non-tensor value read from a submodule's ``vars()`` or class (private
     names too), or from a plain object reached through such attributes (a
     config, transformers' included), is recorded at capture by its attribute
     path with the value the trace saw -- ints, floats, str, None, dtype,
     Size, device, Enum (class and member name) and numpy scalars (dtype and
     value), and tuples, lists and dicts of them, as typed literals; an
     attribute found absent (``getattr(config, "sliding_window", None)``)
     as absent, and so is a name a module's own ``__getattr__`` computes
     (an instance attribute would shadow it; test_name_a_class_getattr_computes_is_read_absent)
     and a method read from the class, ``forward`` included (one set on
     the instance later, as accelerate's prepare() wraps forward, would run
     instead; test_a_forward_set_on_an_instance_after_capture_is_refused); a name a config's own ``__getattribute__`` resolves
     (transformers' ``attribute_map``) through it -- and CHECKED at every
     call: a changed value (an instance override of a class attribute, a
     class attribute changed on the class, an element written into a list or
     dict, an absent attribute set) is refused; an unread one
     (``Linear.in_features``, a config field never read) cannot matter.  The
     fast path re-verifies each step by the identity of the value in its
     ``vars()`` (and on the class) and each list or dict by the ids of its
     elements, in a few C-level passes.  Functions, methods, modules and
     loggers read are code (submodules are checked structurally); any other
     value read (a set, an ndarray, a list holding an object) is REFUSED at
     capture, naming its path, and so is fn writing a value it read
     (``self.calls += 1``) (test_precompile_read_guards.py,
     test_module_classes_and_read_attributes_are_checked).  Any other change
     fn makes to its modules' Python state (an attribute set without being
     read, a hook, submodule or buffer registered) is REFUSED at capture and
     undone (invariant 8).
   - A torch.compile'd module (``OptimizedModule``, at the top or inside):
     REFUSED at capture, naming ``._orig_mod`` to pass instead: its calls run
     Dynamo and its ``training`` forwards to the module it wraps
     (test_a_torch_compiled_module_is_refused_at_capture).  So is a
     TorchScript module (``torch.jit.trace`` / ``script``), before capture
     touches any module: pass the original nn.Module
     (test_torchscript_modules_are_refused_before_capture_touches_them);
     and fn deep-copying a module argument (``copy.deepcopy``, as
     ``fuse_conv_bn_eval`` does): copy or fuse it before precompile
     (test_fn_deep_copying_a_module_argument_is_refused).
   - Hooks (module forward/backward hooks and pre-hooks, global module
     hooks, parameter gradient and post-accumulate hooks; for a step whose
     backward accumulates a parameter's gradient, Python hooks and pre-hooks
     on its AccumulateGrad node, as Horovod-style reducers register them,
     found by ``_precompile_runtime.accumulate_grad_hooks``): REFUSED at
     capture and CHECKED at a call, the refusal naming the hook's function
     (``module.qualname``, as ``transformers.utils.output_capturing...``) for
     a caller who holds no handle to it, and, for a library's hook
     (``_precompile_runtime.LIBRARY_HOOK_FIXES``, which an artifact carries
     in the driver's library_hooks part where a module argument has a class
     of ``_precompile_schema.HOOK_LIBRARIES``: test_driver_parts), how to take it off:
     transformers' ``gradient_checkpointing_enable()`` hook by
     ``model.disable_input_require_grads()``; its output capturing's by hand
     (README), fn asking for ``output_hidden_states`` / ``output_attentions``
     being refused either way (test_precompile_llm.py
     test_gradient_checkpointing_hook_refusal_names_its_fix,
     test_asking_for_hidden_states_is_refused_naming_a_way_through).  Each module-cache entry (per model
     instance; rebuilt when a submodule or parameter is swapped in) is
     scanned when built and again only when a hook was registered anywhere
     since its last clean scan, so a second instance or a submodule hooked
     before an earlier clean call is seen; every module hook dict and the
     global ones are also watched empty, so a hook written straight into one
     (no handle) is seen too (test_hooks_are_refused;
     test_precompile_hook_guards.py test_hooks_written_into_the_hook_dicts_are_refused;
     test_precompile_hook_guards.py
     test_hooks_on_another_instance_or_a_swapped_submodule_are_refused,
     test_accumulate_grad_node_hooks_are_refused).  A gradient hook on a
     tensor input that requires grad, for a graph that runs autograd (a
     gradient with respect to it would run it): REFUSED at capture and
     CHECKED at every call of such an artifact
     (test_gradient_hooks_on_a_differentiated_input_are_refused).  Not seen: hooks added
     to an AccumulateGrad node from C++, as DDP's Reducer adds them; for a
     DDP argument the graph does the Reducer's averaging (next bullet).
   - A DistributedDataParallel argument (invariant 16): its gradient
     averaging and buffer broadcast are part of the graph; its world size,
     default process group, ``no_sync()`` state, find_unused_parameters,
     static_graph, comm hook, buffer broadcast (the flag and
     ``require_forward_param_sync``), the parameters its reducer averages and
     its ``parameters_to_ignore`` CHECKED at every call
     (test_precompile_distributed.py TestDataParallel
     test_other_world_size_is_refused, test_no_sync_must_match_capture,
     test_buffers_are_broadcast_where_ddp_would,
     test_plain_module_for_ddp_is_refused); FSDP1, other comm
     hooks, mixed_precision, a non-default process group, broadcast buffers
     with a step captured inside no_sync(), parameters frozen or unfrozen
     after wrapping, and parameters without a
     gradient unless find_unused_parameters=True REFUSED at capture
     (test_capture_refuses_what_it_cannot_reproduce).  Caller's
     responsibility: a built-in C++ comm hook registered with
     ``_register_builtin_comm_hook`` after the first call (the driver sees
     ``register_comm_hook`` at every call, the private one only when the
     DDP object is first checked).
   - A model fully_shard (FSDP2) sharded (invariant 17): each sharded
     parameter is CHECKED at every call as a DTensor of the captured shape
     placed ``Shard(0)`` on a 1-D mesh over the captured process group and
     world size (its local shard's layout by the tensor check), and its
     ``requires_grad``; fully_shard's settings (each module's mixed precision
     policy, the offload policy, gradient sync, resharding after backward,
     divide factor, unused-parameter reduction, all-reduce hook, custom
     all-gather / reduce-scatter) are CHECKED and watched by the module cache; fully_shard's
     own forward hooks are expected, any other hook is refused as above
     (test_precompile_distributed.py TestFullyShard
     test_calls_refuse_other_shardings_before_changing_anything).
   Non-tensor values
   - Python leaves of the inputs: baked and CHECKED by type and, for floats,
     sign: ``-0.0`` is not ``0.0``, ``True`` is not ``1``, ``nan`` equals
     ``nan`` (test_baked_floats_compare_bitwise, test_same_value); numpy
     scalars, Enum members, dtypes and devices by their typed literal
     (test_precompile_read_guards.py test_numpy_and_enum_arguments).
   - Input structure: CHECKED at every call against the captured one,
     pytree contexts included; a dict's key order only where fn observed
     it, keyword arguments bound by fn's signature, defaulted parameters
     REFUSED when passed (invariant 3; test_precompile_structures.py).
     Any class registered as a pytree node is an input or output (a
     transformers cache, registered by transformers'
     ``register_cache_pytrees_for_model``): its tensors LIFTED, the rest of
     its state its context, CHECKED (a cache's lengths, layer kinds, sliding
     windows; a refusal leads with the first place the caller's differs, a
     context's key path included: test_cache_state_is_checked_at_every_call);
     leaf paths are read from the tree itself (a flatten may turn
     None children into context), and a node whose flattens with and
     without keys disagree is REFUSED naming its type.  An unregistered
     object is REFUSED saying how to register it
     (test_precompile_llm.py TestCacheObjects, TestInputTrees).
   - Layout: each tensor is traced with exactly the caller's strides (a
     slice ``ids[:, :1]`` included), which the driver checks on both backends
     (test_strides_are_checked); one whose elements share memory
     (``x.expand(...)``) is traced with the same sharing on backend='eager'
     and REFUSED on backend='inductor' (test_non_dense_inputs_keep_their_layout,
     test_eager_traces_inputs_sharing_memory_as_passed).
   Global state (test_precompile_global_guards.py)
   - Torch function and dispatch modes (a ``TorchFunctionMode``, the
     ``DeviceContext`` that ``with torch.device(...)`` and
     ``torch.set_default_device`` push, a ``TorchDispatchMode``, an infra
     mode such as ``FakeTensorMode``): eager fn runs every call or operator
     through them, the graph (captured without them) would bypass them or
     run other operators through them: REFUSED at every call, whatever the
     backend, naming the innermost mode (test_modes_active_at_a_call_are_refused),
     and around precompile(), whose trace would bake them
     (test_capture_inside_a_mode_is_refused).
   - Grad mode: an artifact that runs autograd is REFUSED under
     ``no_grad()`` and ``inference_mode()`` (test_global_state).  fn reading
     it (``torch.is_grad_enabled()``, ``torch.is_inference_mode_enabled()``,
     on ``torch`` or ``torch._C``, wrapped while fn is traced) is recorded
     with fn's line when the answer is the caller's (grad on, inference off;
     not fn's own ``no_grad()``'s) and CHECKED: another mode is refused.  A
     forward that never asked is honoured in any mode
     (test_grad_mode_read_by_fn_is_checked).  Anomaly detection: REFUSED
     for an artifact that runs autograd, whose compiled backward cannot check.
   - Saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``):
     around a call of an artifact that runs autograd, and around
     ``precompile()``, REFUSED (the graph saves nothing through them); entered
     inside fn, traced into the graph, and Inductor emulates eager's
     precision casts so a bf16 packing rounds as eager does; torch
     2.11/2.12's Inductor drops such a round trip's rounding, so there
     backend='inductor' REFUSES it at capture (test_saved_tensors_hooks).
   - Autocast (per device type: enabled and dtype) and
     ``torch.get_default_dtype()``: CHECKED (test_global_state); the graph,
     which holds capture's casts, runs with autocast off, so fn's own
     autocast regions (disabled, another dtype) stay as in eager
     (test_graph_captured_under_autocast_is_not_cast_again).  The process's
     autocast dtype of a device fn computes in without naming one
     (``torch.autocast("cpu")``, fn enabling autocast itself): CHECKED
     (test_process_autocast_dtype_fn_computes_in_is_checked).  A CPU LSTM
     under CPU autocast (eager runs MKLDNN's fused layer in the autocast
     dtype; the trace, with MKLDNN off, its decomposition): REFUSED at
     capture (test_lstm_under_cpu_autocast_is_refused).
   - RNG: the graph draws from the global generator like eager; capture
     leaves it as it was (invariant 8).  The trace follows the CPU (and
     initialized CUDA) generators draw by draw: fn reseeding or restoring
     them (``manual_seed``, ``set_rng_state``, ``fork_rng`` around draws) or
     drawing from its own ``torch.Generator`` is REFUSED at capture, at the
     next draw (naming its line) or when fn returns
     (test_reseeding_the_rng_inside_fn_is_refused_at_capture).  A draw that
     restarts from an earlier draw's state repeats its numbers and is
     replayed from a copy: ``torch.utils.checkpoint`` (reentrant or not,
     selective too: ``create_selective_checkpoint_contexts``, which the trace
     runs as in eager, saving and recomputing by its policy, not as under
     torch.compile;
     test_precompile_global_guards.py
     test_selective_checkpointing_around_dropout_is_honoured)
     around dropout is honoured, grads and RNG as eager's; a replayed op
     whose numbers depend on tensor values (``rrelu``, symbolic traces'
     ``native_dropout``) is REFUSED
     (test_checkpointed_dropout_replays_the_forward_mask).  Draws fn discards
     advance the RNG as in eager (on torch 2.11-2.12 Inductor may run such a
     draw after later ones, which would swap the numbers: backend='inductor'
     there REFUSES a discarded draw beside other draws), and fills into strided tensors draw eager's
     numbers (test_unused_random_draws_advance_the_rng_like_eager,
     test_random_fills_into_strided_tensors_match_eager); REFUSED at capture:
     ``x.random_(low, high)`` (make_fx cannot record ``random_.from``) and, on
     backend='inductor', ``normal_`` into a non-contiguous tensor of 16+
     elements, which eager's CPU kernel draws differently
     (test_normal_into_a_non_contiguous_tensor).
   - On backend='inductor', the gradient of a nearest upsampling whose
     ``scale_factor`` maps pixels otherwise than its sizes do (1.7, not 2):
     REFUSED at capture, as Inductor's ``upsample_nearest2d_backward``
     ignores the scale and would send the gradient to other pixels
     (test_nearest_upsampling_by_a_scale_factor_is_differentiated_as_eager_or_refused).
   Gradients and writes
   - ``.grad`` read or cleared inside fn: LIFTED (invariant 13).
   - Writes to tensors that are not arguments: REFUSED (invariant 14).
   - Torch settings fn changes: fn leaving grad mode, the default dtype,
     deterministic algorithms, anomaly detection or autocast (enabled,
     per-device dtype, an entered block, the cache switched on) changed for
     its caller is REFUSED at capture (and the setting restored, also where
     fn raises or capture refuses for another reason); backward under
     anomaly detection's NaN check is REFUSED at capture, without it honoured
     (test_fn_leaving_torch_settings_changed_is_refused,
     test_anomaly_detection_and_settings_are_restored_by_a_refused_capture,
     test_anomaly_detection_without_nan_checks_is_honoured).  The trace runs
     with MKLDNN off: fn reading or setting ``torch.backends.mkldnn.enabled``
     is REFUSED (test_fn_using_the_mkldnn_flag_is_refused).  It also runs
     with the autocast cache off, so fn switching the cache off is not seen:
     the caller's responsibility.
   - fn changing an argument tensor's autograd state (a gradient or
     post-accumulate hook it registers on a parameter or input, its
     ``requires_grad_``): REFUSED at capture, naming the tensor and the
     hook's function: eager's call leaves it on the caller's tensor, where a
     hook runs once more at each later call
     (test_gradient_hooks_fn_registers_are_refused,
     test_requires_grad_changed_by_fn_is_refused).
   - fn drawing from Python's ``random`` or numpy's global RNG (the trace's
     draw would be baked, those RNGs never advanced), assigning a tensor's
     ``.data`` (make_fx does not trace the setter;
     ``torch.nn.utils.vector_to_parameters`` assigns it), calling
     ``torch.utils.swap_tensors`` or ``load_state_dict(..., assign=True)``:
     REFUSED at capture, naming fn's line and a form that is honoured (a
     torch RNG draw, ``p.copy_(new)`` under ``no_grad``, a load without
     ``assign``) (test_python_and_numpy_rng_draws_are_refused_naming_the_rng,
     test_data_assignment_is_refused_and_the_advised_copy_matches_eager,
     test_swap_tensors_is_refused_and_the_advised_swap_matches_eager,
     test_load_state_dict_assign_is_refused_and_the_advised_copy_matches_eager).
     A loaded artifact called inside fn: REFUSED at capture, naming fn's
     line (its checks would run on the trace's stand-ins; fn may call the
     function it was made from)
     (test_a_loaded_artifact_called_inside_fn_is_refused_naming_the_line).
     A parameter given a gradient with a ``grad_dtype`` (torch 2.11+) other
     than its dtype: REFUSED at capture, and at a call before anything
     changes (test_grad_dtype_is_refused_at_capture_and_before_a_call_changes_state).
     In the trace, parameters' stand-ins are marked as parameters (torch's
     ``_is_param``), so ``isinstance(p, nn.Parameter)`` branches as in eager
     (test_parameters_are_nn_parameters_in_fn_as_in_eager).
   - fn changing Python state it reaches around its arguments (closure
     cells, the globals its code names, a bound ``self``, a partial's
     arguments): an attribute of such an object or an item of such a dict,
     list or set (a fresh GradScaler creating its scale tensor at its first
     ``scale()``, a call counter, a list of losses, a scheduler stepped):
     REFUSED at capture, as eager changes it at every call and the
     artifact never would (put back where it holds a tensor the trace made)
     (test_python_state_fn_changes_around_its_arguments_is_refused_and_put_back).
   Caller's responsibility (not recorded, stated here so nothing is baked
   silently): fn's other Python side effects (printing, a change deeper
   inside state it reaches around its arguments) happen once, at capture, as under any
   tracer; functions,
   methods and modules that modules hold are code, like fn itself, and so
   are the modules' classes: a class redefined under the same import path (a
   re-run notebook cell, an upgraded library, the class a factory function
   makes at each call, the class each ``torch.fx.GraphModule`` gets) passes
   the class check and the call runs the captured code; and so is what code
   reads outside the arguments: fn's closure cells and globals (a
   closed-over config's value), the model code's module
   globals, class attributes read through ``type(self)`` or a classmethod,
   a held ``functools.partial``'s bound arguments, and torch's other
   process settings (thread count, matmul precision): a Python value there
   is baked (pass it as an argument to have it checked; a module argument
   reached there is refused, invariant 2); a user input's own ``.grad`` (the trace
   sees None) and a user input that is the ``.grad`` of a parameter
   backward accumulates into, or a view of it (the runnable adds to
   ``.grad`` after the graph, so fn reading it after backward sees it as
   before); ``torch.nn.utils.parametrize.cached()`` around a call (the graph
   computes each parametrization anew); one input
   object passed at two places where fn rebinds its tensors (a cache layer
   shared by two layers), where the capture had two; ``nn.TransformerEncoder``'s nested-tensor fast path
   is not taken (``is_compiling()`` is true while tracing, as under
   torch.compile), so its padded positions hold the regular path's values; values fn reads around
   attribute access (``vars(m)["training"]``, ``object.__getattribute__``,
   a property or ``__getattr__`` of a module computing from state other
   than the attributes it reads) or branching on ``type(m) is ...``
   (during the trace ``type(m)`` and the
   type of a config it reads are probe subclasses, which also run the
   class's ``__init_subclass__``), and on ``type(d) is dict`` for a dict
   input (a probe dict subclass, invariant 3); a grad-mode query bound
   before capture (``from torch import is_grad_enabled``, which the trace's
   wrapper on ``torch`` does not reach); a view of a parameter fn makes under
   its own ``torch.enable_grad()`` and returns, called under ``no_grad()``
   (rebuilt in the caller's grad mode, it has no history where eager's has:
   the trace does not see which grad mode fn set around an op); on torch
   2.14, whose trace records ``.detach()`` as the ``aten.alias`` that
   ``x[...]`` also gives, a returned ``x[...]`` of an input that required no
   grad at capture, called with one that does (rebuilt detached, as a
   ``.detach()`` is); ``param.data = ...`` after a call (a ``_parameters`` / ``_buffers`` entry is
   looked up by name at every call, and rebinding either dict is seen:
   test_module_edits_bypassing_hooks_are_seen); ``obj.__class__ = ...``
   after a call on an object fn reads that cannot be referenced weakly
   (``__slots__`` without ``__weakref__``: the module cache checks the
   class of every module, and of every other object it can hold weakly);
   and, once a model was
   called, writes into those private dicts that bypass nn.Module's API
   and its registration hooks (``m._parameters["w"] = other`` tying two
   names or sharing memory, a ``_forward_hooks`` dict replaced by a filled
   one): the entry's tensor is checked, ties and hooks are re-checked on
   the API's edits; and, on
   backend='inductor', indices out of range (``nn.Embedding``, a
   ``cross_entropy`` target, a ``StaticCache`` written past its end, which
   ``generation.serving`` refuses): Inductor's CPU kernels raise
   RuntimeError where eager raises IndexError, after the graph may have
   written the tensors it updates where their indices were in range
   (eager's op checks them all first; capture moves the check's throw out
   of OpenMP regions, where it aborted the process, as torch.compile's
   parallel kernels do:
   test_an_index_out_of_range_raises_and_the_process_goes_on);
   validate indices outside fn; likewise an integer division by zero,
   which raises eager's ``RuntimeError: ZeroDivisionError`` after the
   graph may have written what it updates (Inductor's C++ divided without
   a check and the process died, SIGFPE; capture's codegen checks each
   divisor: test_an_integer_division_by_zero_raises_and_the_process_goes_on);
   an in-place op whose other
   operand partly overlaps the tensor it writes (``x.mul_(x[:, :1])``),
   where eager's kernel reads elements it already wrote and Inductor, as
   torch.compile, reads them all first; BatchNorm's running statistics,
   which ATen's schema does not mark as written, are not among the tensors
   the checks on written tensors cover (a ``running_var`` made under
   ``inference_mode()`` or requiring grad is written by a call where eager
   raises);
   likewise the float edge cases Inductor lowers otherwise than eager
   (``inf // 1.5`` is inf, not nan; float16 ``(-inf) ** 0.5`` and
   ``round(65504, decimals=1)``).
   Autocast's weight-cast cache is off while tracing (make_fx's, as under
   torch.compile), so the graph casts a weight at each use: a weight used
   twice in one autocast region sums its two gradients in float32 where
   eager sums them in the autocast dtype, and a region around several
   calls recomputes casts eager would reuse from before an in-place
   update.  A custom autograd Function's forward reading
   ``ctx.needs_input_grad`` is baked where requires_grad is not checked
   (a forward without backward that reads no ``requires_grad``).
   The fast path keeps this cheap: the global state is a few C calls, the
   module checks are C-level list comparisons (``benchmarks/soundness_overhead.py``),
   and the tensor guard (``runtime.tensor_guard``: the package's C++
   ``LayoutGuard``, which also looks the lifted tensors up by name, or Dynamo's
   ``TensorGuards`` where that is not built; both compare types, requires_grad
   and dispatch keys, so the conj/neg bits, and read every tensor's metadata
   at every call, so ``p.data = ...`` and ``requires_grad_`` on the same
   object fail it: test_precompile_layout_guard.py) is only armed by a call
   the slow path accepted.
12. Data-dependent Python.  Python that needs a traced tensor's value
   (``if x.sum() > 0:``, ``.item()``, ``int()``, ``float()``, ``bool()``,
   ``__index__``, ``.tolist()``, ``.numpy()``, ``np.asarray``, DLPack)
   would bake the example's outcome: refused at capture, in forward and in
   backward (a custom Function's ``ctx.offs.tolist()``, as transformers' MoE
   fallback does: Mixtral and Qwen2-MoE training steps are refused), naming
   fn's file:line and code and suggesting ``torch.where`` or a Python input;
   iterating over a tensor gives traced tensors and is honoured, and so is
   the truth of a fresh ``torch.rand`` draw compared with a bound outside
   [0, 1], which every call decides alike (transformers' LayerDrop with
   ``layerdrop=0``: BART, OPT, Whisper training; the bound is a module value
   checked at every call, the draw stays in the graph, as a draw fn
   discards (invariant 11, RNG):
   test_a_draw_compared_with_a_bound_outside_its_range_is_honoured), and so
   is ``F.one_hot(labels, num_classes)``, whose C++ reads the labels only to
   check them: traced as torch.compile's decomposition computes it, which
   checks them in the graph at every call, raising eager's RuntimeError (on CUDA a device-side
   assert, as under torch.compile: the process's CUDA context is then lost)
   (test_one_hot_checks_its_class_values_at_every_call).  With
   marked dims (a symbolic trace) ``.item()`` (and ``.tolist()``, element by
   element) becomes an unbacked value computed at every call, and a branch on
   it is refused the same way.  Ops
   whose output size depends on values (``nonzero``, ``x[mask]``,
   ``masked_select``, ``unique``; DeBERTa-v2's loss) are refused at capture
   on both backends, suggesting masking instead
   (test_precompile_capture_soundness.py test_data_dependent_python_*;
   test_precompile_global_guards.py test_tensor_values_turned_into_python_are_refused,
   test_moe_training_steps_are_refused, test_value_dependent_sizes_are_refused,
   test_deberta_v2_loss_is_refused, test_symbolic_traces).
13. The incoming gradient.  fn is traced with each parameter's ``.grad`` set
   to its own graph input (the caller's ``.grad``, zeros when None), so
   what fn does with it is in the graph, and each parameter's ``.grad`` is
   written the way eager's would be: backward's plain accumulation is left
   to the runnable (when None, what AccumulateGrad makes: the graph's
   gradient itself where it is contiguous like the parameter and capture saw
   no other output or input share it, the common step's one C check, else a
   copy in the parameter's strides, so ``(a + b)``'s one gradient, a
   ``backward(gradient=g)``'s ``g``, a returned tensor, ``p.sum()``'s expanded
   or a transposed gradient become .grad as in eager:
   test_new_grad_is_accumulate_grads; else add in place, with grad mode off
   like the autograd engine: the common step passes no extra input; onto one
   with elements at one memory location (``p.grad = g.expand(...)``), whose
   in-place add eager refuses after its forward ran, REFUSED before the graph
   runs (test_a_grad_backward_cannot_add_to_is_refused_before_anything_changes); onto a
   sparse ``.grad``, ``new + old``, a dense tensor, as eager's AccumulateGrad
   does: test_precompile_soundness.py test_sparse_grad_accumulates_like_eager); when
   fn clears ``.grad`` before backward (``model.zero_grad()``) or reads it
   (``clip_grad_norm_`` with gradient accumulation, logging ``p.grad``) the
   graph's gradient is assigned (an incoming ``.grad`` the graph takes must
   be dense, of the parameter's shape, dtype and strides: another, a sparse
   one included, is refused before anything runs:
   test_sparse_grad_read_inside_the_graph_is_refused); a sparse gradient
   (``nn.Embedding(sparse=True)``) backward accumulates into such a taken
   ``.grad`` (fn reads it, or runs two backwards) is REFUSED at capture, naming
   the parameter: the graph's ``.grad`` is dense, eager's None becomes a sparse
   one; plain accumulation leaves it sparse as in eager
   (test_precompile_soundness.py
   test_sparse_gradients_keep_eager_layout_or_are_refused); when fn clears it last,
   the runnable sets it to None (test_precompile_capture_soundness.py
   test_gradient_accumulation_matches_eager,
   test_grad_bookkeeping_follows_what_fn_does_with_grad,
   test_grad_that_requires_grad_accumulates_like_eager).  None and zeros
   agree wherever backward adds to ``.grad``; where the graph uses the
   ``.grad`` of a parameter backward does not reach (a layer fn skips, with
   no ``zero_grad()`` before backward), eager tells them apart: its
   ``opt.step()`` skips a None ``.grad`` (AdamW would decay the parameter),
   ``zero_grad(set_to_none=False)`` leaves it None.  Such a parameter keeps
   what its ``.grad`` was at capture (traced as None when it was None), and
   so does a parameter an optimizer inside fn holds that does not require
   grad (None: one with a leftover ``.grad`` is refused at capture, eager's
   step would use it), or whose ``.grad`` fn reads otherwise (``zero_grad``,
   ``clip_grad_norm_``: the trace sees None, a leftover is refused when fn
   reads it); CHECKED at every call (test_precompile_optimizer.py
   test_parameter_backward_skips_*, test_frozen_parameter_keeps_no_grad;
   test_precompile_capture_soundness.py test_a_frozen_parameters_grad_fn_reads).
   A None ``.grad`` fn uses as a tensor before backward reaches it
   (``p.grad.mul_(0.9)``, where eager raises; zeroing it is fine) is
   REFUSED at capture; one that was a tensor at capture must stay one,
   CHECKED at every call (test_a_none_grad_used_as_a_tensor_is_refused).
   A ``.grad`` fn leaves with autograd history (``backward(create_graph=True)``)
   is REFUSED at capture: the runnable's is a plain tensor
   (test_precompile_capture_soundness.py test_grads_with_autograd_history_are_refused).
   Caller's responsibility: fn's own code branching on ``p.grad is None``
   (it is a tensor while tracing).
14. Writes the graph does not see.  fn may only write tensors the trace
   tracks (its arguments' tensors and tensors it creates).  An optimizer's
   ``step()`` / ``zero_grad()`` inside fn (it holds the caller's tensors, not
   the traced copies) and in-place writes through any other reference (the
   caller's parameters or ``.grad`` reached through a closure, a global) are
   refused at capture before they happen, naming the optimizer or tensor and
   fn's source line: call the optimizer outside fn
   (test_optimizer_in_fn_refused_before_it_changes_anything,
   test_write_through_closure_refused_before_writing).
15. Optimizers are arguments, not state.  A ``torch.optim`` SGD, Adam or
   AdamW argument is lifted like a module: its param groups map onto the
   lifted parameters by identity (an optimizer over any other tensor is
   refused), and its state tensors (momentum_buffer; step, exp_avg,
   exp_avg_sq, max_exp_avg_sq) are graph inputs updated in place, so the
   artifact holds no optimizer state and ``opt.step()`` inside fn is part of
   the one graph.  Capture points the optimizer's param_groups and state at
   the traced leaves and clones while fn runs (each group a copy, the
   caller's dicts untouched), then restores them.  What fn's own code may
   use of the optimizer is its ``param_groups``, ``zero_grad()`` and
   ``step()`` (torch's step reads what it needs): every other attribute
   read or write is refused at capture, naming it and fn's line --
   ``opt.state`` (inside fn the trace's, pre-filled as eager's first step
   would fill it: ``if len(opt.state) == 0`` would not take eager's
   first-call branch), ``opt.defaults`` and attributes of the caller's own
   (``opt.loss_scale``), which no call checks.  Of a group, fn reads the
   values of keys it has (checked at every call, below); a lookup of a key
   it lacks (``g.get("loss_scale", 1.0)``: a key added later would go
   unseen), its key set (iteration, ``len``, copies), ``capturable`` /
   ``foreach`` where the trace set them and ``lr`` and the lifted
   hyperparameters (below) are refused; so is any write to a
   group by any code (``g["lr"] *= 0.5``: eager compounds it, the artifact
   never writes a group; use an LR scheduler stepped between calls), to the
   caller's group dicts through a closure, and changes to the
   ``param_groups`` list (test_group_write_inside_fn_is_refused,
   test_optimizer_values_no_call_checks_are_refused,
   test_fn_branching_on_optimizer_state_is_refused).
   Hyperparameters: ``lr`` is a 0-dim float64 graph input read from the
   runtime optimizer at every call (LR schedulers work without re-capture),
   and so is what OneCycleLR / CyclicLR cycle with it: SGD's ``momentum``
   (a tensor to ``mul_``; SGD's Python ``momentum != 0`` tests are answered
   without reading it, and a call with momentum 0, where eager keeps no
   buffer, is refused; baked when it was 0 or nesterov, whose ``alpha=``
   needs a number) and Adam's / AdamW's ``betas[0]`` (traced with the
   single-tensor step, as foreach reads a tensor beta1 as a number);
   every other group entry (``betas[1]``, eps, weight_decay, foreach,
   maximize, ..., keys of the user's own) is baked and a different runtime
   value is refused, naming the group and key
   (test_precompile_structures.py TestOneCycleLR).  State missing at a call (a
   fresh optimizer) is created as eager's first step would (zeros, ``step``
   0), and the graph computes eager's first-step values from it; a parameter
   that gets no gradient gets no state.  Adam/AdamW trace their capturable
   formulation and foreach SGD multiplies then adds, so results equal eager's
   within float noise (single-tensor SGD on backend='eager': bit-exact for
   float32 parameters; bfloat16 and float16 ones differ by an ulp, as the
   graph multiplies by a float64 lr tensor where eager adds with
   ``alpha=-lr``).  The capturable Adam/AdamW step divides by ``lr``, so at
   ``lr`` 0 (a warmup's first step) an element whose gradient has been 0
   would become 0/0; the graph puts back those elements' values from before
   the step, as eager leaves them (test_adam_step_at_lr_zero_is_eagers).
   The step reads the incoming ``.grad`` (invariant 13), so it is a graph
   input unless fn's zero_grad drops it.  Refused at capture:
   other optimizer classes, fused / capturable / differentiable, SGD
   dampening, tensor hyperparameters, a baked one that is a numpy scalar
   (test_numpy_group_values_the_step_reads_are_refused_saying_so), step hooks, ``step`` / ``zero_grad``
   set on the optimizer itself (``opt.step = wrapper``; torch's LR scheduler
   wrapper excepted; also at every call:
   test_step_or_zero_grad_set_on_the_optimizer_is_refused), one optimizer at
   two argument positions, a parameter listed twice in its groups
   (test_a_parameter_twice_in_the_groups_is_refused), Adam / AdamW over
   float16 parameters (the capturable step overflows float16:
   test_adam_over_float16_parameters_is_refused), an optimizer argument fn also reaches through a
   closure or global (as for modules, invariant 2;
   test_optimizer_argument_reached_around_fn_is_refused), per-group state layouts that
   differ, free dims, an LR scheduler stepped inside fn
   (test_scheduler_stepped_inside_fn_is_refused), and fn's own reads of
   ``lr`` or a lifted hyperparameter (a Python float in eager's fn, a graph
   input in the trace: ``loss * lr`` would be float64, ``lr * 2`` a tensor;
   pass it as an argument;
   test_fn_reading_lr_or_a_lifted_hyperparameter_is_refused).  Checked at every call: class, number of groups,
   the parameters (identity against the runtime modules'), baked values
   (the group entries read while fn was traced, by torch's step or fn --
   all where code read the key set -- and those capture decides from, but
   ``params``, ``lr`` and the lifted ones: fn may read its own, a loss
   scale kept there; one deleted since, where eager's step raises KeyError,
   too; one nothing read, a scheduler's ``initial_lr``, may be absent or
   other: test_initial_lr_of_a_scheduler_at_capture_is_not_checked), state keys,
   shapes, dtypes and layout, that no state tensor shares memory with
   another, a parameter, buffer or tensor argument, or a stepped
   parameter's ``.grad`` (when the state tensors are other objects than at
   the last call; test_state_sharing_memory_with_a_parameter_or_grad_is_refused),
   that optimizer arguments are distinct objects sharing no state tensor
   (test_one_optimizer_at_two_positions_or_sharing_state_with_another_is_refused),
   that no call goes where eager's
   step raises (a beta1 of 1; ``opt.state`` a plain dict lacking an entry;
   ``opt.defaults['differentiable']`` set after capture:
   test_calls_where_eagers_step_raises_are_refused), and
   that no step hook (the optimizer's own or torch.optim's global ones,
   which eager's step() runs) was added (test_precompile_optimizer.py,
   test_step_hooks_added_after_capture_are_refused).
16. Data parallel.  A ``torch.nn.parallel.DistributedDataParallel`` argument
   is a module argument (its state lifted as ``module.<name>``) whose
   ``DataParallelSpec`` is recorded and checked at every call
   (``_precompile_runtime.check_data_parallel``).  The trace runs the wrapped
   module's forward, not DDP's, and does what DDP's reducer does
   (``torch/_precompile_ddp.py``): after ``backward()`` each parameter's
   ``.grad`` is the average over the ranks of its accumulated local gradient
   (scaled by 1/world size, then summed), so an optimizer step inside fn
   reads it.  Where DDP broadcasts the buffers from rank 0 before forward
   (``broadcast_buffers``, and the previous forward synchronized), so does
   the graph; a step captured inside ``no_sync()`` with such buffers is
   refused.  The collectives are in the graph as functional collectives
   (``_c10d_functional.all_reduce`` on the default group, one per bucket of
   DDP's sizes in the order backward produces gradients, of one flat tensor
   the bucket's gradients are written into, waited on when backward ends) on
   both backends.  Each ``.grad`` then has the parameter's strides and is
   copied out of its bucket, as DDP's reducer does, or a view of it with
   ``gradient_as_bucket_view=True``, as DDP's is; Inductor removes the copy,
   so on backend='inductor' a bucket's gradients always share its storage
   (values are the same; the bucket's memory is freed with its last ``.grad``).  No rank is baked: one artifact
   serves every rank, and capture runs no collective (rank 0 compiles
   alone).  DDP's forward, reducer and hooks never run for a call, so its
   reducer is never left expecting a backward.  ``no_sync()`` is decided at
   DDP's forward, as in DDP: an artifact captured inside it does not
   all-reduce, and each artifact is refused in the other context (precompile
   one step for each).  A forward inside fn that does not ask for a
   reduction (under ``no_grad()``: a teacher's targets from the same model)
   leaves an earlier forward's pending, as DDP's reducer does
   (TestDataParallel, run ``no_grad_targets``).
   find_unused_parameters=True: parameters backward does
   not reach keep their ``.grad`` and are not reduced, like eager DDP.
   The parameters reduced are those requiring grad at capture, less DDP's
   ``parameters_to_ignore``; DDP fixes its own set when it is constructed, so
   a parameter frozen or unfrozen after wrapping is REFUSED at capture, and
   the set DDP's reducer averages (none of a ``ddp.module`` replaced after
   wrapping) and its ``parameters_to_ignore`` are CHECKED at every call
   (test_the_parameters_ddp_averages_must_match_capture).
   Caller's responsibility: every rank's call must pass the checks -- one rank refused
   (another shape, a module attribute that differs by rank) leaves the
   others waiting in the graph's first all-reduce until the process
   group's timeout.
   The incoming ``.grad`` (invariant 13) is only read: backward's
   accumulation onto it is computed out of place (the sum is all-reduced and
   the result becomes ``.grad``; the old ``.grad`` tensor keeps its values),
   so a ``.grad`` of None passes zeros the runnable makes once and keeps
   (``grad_inputs_read_only``).
   gradient_as_bucket_view and the bucket cap are recorded; values do not
   depend on them.  Any other collective fn runs (``torch.distributed``'s,
   functional collectives, a DTensor's redistribution) is refused when the
   trace reaches it, before it communicates: the other ranks do not join a
   capture.  DTensor arguments of fn and FSDP1 wrappers are refused before
   any trace.  Tested on 2
   gloo ranks against eager DDP, per rank, on both backends
   (test_precompile_distributed.py TestDataParallel).
17. Sharded data parallel.  A model whose submodules
   ``torch.distributed.fsdp.fully_shard`` (FSDP2) sharded is a module argument
   whose sharded parameters are DTensors placed ``Shard(0)`` on a 1-D device
   mesh: each one's local shard is lifted (the graph input) and its
   ``ShardSpec`` recorded and checked at every call (invariant 11).  The trace
   does what fully_shard's hooks would, as SimpleFSDP formulates it
   (``torch/_precompile_fsdp.py``): fully_shard's forward hooks do not run;
   the graph all-gathers each parameter from its shards before fn's forward,
   and the all-gather's backward reduce-scatters the whole gradient averaged
   over the ranks (the reduce op and divide factors fully_shard picks for the
   dtype), so each rank's ``.grad`` is a DTensor placed like the parameter
   holding its part of the average, as eager FSDP2 leaves it (assigned when
   None, else accumulated into its local shard).  A mixed precision policy's
   casts are in the graph where fully_shard makes them: the shards cast to
   ``param_dtype`` before the all-gather, each sharded module's inputs (to
   ``param_dtype``) and outputs (to ``output_dtype``), the gradient cast to
   ``reduce_dtype`` before the reduce-scatter and back to the shard's dtype
   after it; each module's policy is recorded and CHECKED.  An
   optimizer inside fn (invariant 15) steps the local shards, and state it
   creates is DTensors, as eager's.  The collectives are
   ``_c10d_functional.all_gather_into_tensor`` and ``reduce_scatter_tensor``
   in the graph, on both backends, one of each per fully_shard parameter
   group and dtype (its shards flattened into one tensor, as fully_shard's);
   every all-gather is launched at the start of the step and waited for
   where its parameters are first used, each reduce-scatter launched as soon
   as its gradient is computed and waited for where the gradient is used, so
   communication overlaps compute.  The whole parameters are kept for
   backward (memory as ``reshard_after_forward=False``; values do not depend
   on it, and it is not checked).  No rank is baked: one
   artifact serves every rank, and capture runs no collective (stand-in ops,
   retargeted afterwards).  Refused at capture, with a fix that keeps the
   model's meaning: FSDP1, CPU offload policies, gradient sync turned off, a
   custom gradient divide factor, unused-parameter
   reduction, all-reduce hook or all-gather / reduce-scatter
   (``set_custom_reduce_scatter``: the graph runs torch's collectives), no
   resharding after backward (``set_reshard_after_backward(False)``: eager
   leaves the unsharded parameters registered, the artifact the shards), a
   forward in grad mode that no backward in fn goes through, of a module
   whose parameters eager fully_shard then leaves unsharded (the root's own,
   ``reshard_after_forward=False``'s), modules sharded together by one fully_shard
   call, a dim 0 that does not divide evenly over the ranks (shard sizes
   would differ per rank), and meshes other than 1-D (HSDP) except fully_shard
   over tensor parallel, below.  Tested on 2 gloo ranks against eager FSDP2, per rank, on both
   backends, for a step without an optimizer (accumulating over 3 calls), with
   SGD / Adam / AdamW inside fn and AdamW outside it, both
   ``reshard_after_forward`` settings, a no_grad forward, and bfloat16 mixed
   precision (float32 and bfloat16 reduction) (test_precompile_distributed.py
   TestFullyShard).
   A model ``parallelize_module`` split (tensor parallel) is a module
   argument whose DTensor parameters (1-D mesh, ``Shard(d)`` or
   ``Replicate()``) are lifted the same way, with their placements in the
   ``ShardSpec``; unlike fully_shard's, its ParallelStyles' hooks run in the
   trace (``torch/_precompile_tp.py``): inside fn each parameter is a DTensor
   over its traced local shard, so DTensor's sharding propagation runs on the
   trace's tensors and the graph holds the local ops and the functional
   collectives it issues (traced through stand-ins, retargeted afterwards).
   Each hook is recorded by its code and closure values (the style's
   layouts, the mesh) and a call accepts exactly those hooks.  ``.grad`` is
   the DTensor eager leaves: placed like the parameter, or ``Partial(sum)``
   for a Replicate parameter computed with sharded activations (each rank's
   partial sum, recorded at capture; an optimizer inside fn is then
   refused, since eager's step all-reduces it first).  A trace that uses
   this process's rank (DTensor computing offsets or picking a chunk from
   it: row-wise embeddings, random ops, Replicate to Shard, uneven shards)
   is refused, since one artifact serves every rank; asking whether the
   rank is in the mesh is not a use.  For both sharded forms, in the trace
   the module holds the gathered or DTensor parameter, not the leaf the
   gradient reaches; its ``.grad`` reads as eager's, a DTensor over the
   traced shard's gradient, so ``clip_grad_norm_`` inside fn computes and
   scales as eager's (its norm's all-reduce in the graph); setting it to
   None clears the shard's, setting it to a tensor is refused.  fully_shard over tensor parallel (a named 2-D
   mesh, fully_shard on its first dim) composes the two: the graph gathers
   fully_shard's shards into tensor parallel's local shard, and the trace
   wraps that as tensor parallel's DTensor.  A slice of a 2-D mesh has other
   process groups on other ranks, so the ShardSpec records the root mesh's
   ranks, and at a call each rank's own group on a dim stands for the group
   the graph's collectives name (registered under that name where this rank
   does not know it).  Tested on 2 gloo ranks against eager tensor
   parallel, per rank, on both backends, for Colwise / Rowwise steps with
   SGD and AdamW inside fn and outside it, a no_grad forward, and sequence
   parallel blocks (SequenceParallel, PrepareModuleInputOutput)
   (test_precompile_distributed.py TestTensorParallel), and on 4 ranks (a
   2 x 2 mesh) for fully_shard over tensor parallel
   (TestFullyShardOverTensorParallel).
"""

if __name__ == "__main__":
    # In-tree `python -m torch._precompile inspect ...` (installed:
    # `python -m torch_precompile inspect ...`): dispatch before this file runs
    # as a second copy of the module (runpy's __main__), which would re-import it.
    import sys

    from ._precompile_inspect import main

    sys.exit(main(sys.argv[1:]))


import contextlib
import gc
import logging
import sys
import threading
import time
from typing import Any, Callable

import torch


@contextlib.contextmanager
def _gc_paused():
    """No garbage collection inside the block: what it allocates is either kept or
    freed by reference counting, and a collection there would traverse everything
    a process with torch imported holds.  Measured: parsing python_code's 93 KB
    header took 147 ms instead of 24 ms; importing the format and driver modules
    at the first load, 1.1 ms more (one young-generation pass of 0.8 ms)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            _promote_young_objects()
            gc.enable()


def _promote_young_objects() -> None:
    """Move every tracked object to the oldest generation without scanning it.

    What a load made lives as long as its artifact (modules imported, code,
    the runnable); the young collection its allocations would trigger next
    scans them all: ~0.5 ms after a process's first load.  freeze() then
    unfreeze() splices the generations' lists into the oldest, whose next full
    collection sees them as it would have.  Not where the process froze objects
    itself (a fork server): unfreeze() would let go of those too.
    """
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


# The first access to torch.compiler.precompile imports this module and
# _precompile_error (the package's attach imported compat already, at `import
# torch`); precompile() and load() import the rest at their first call.
from . import _precompile_compat as compat
from ._precompile_error import PrecompileError


__all__ = ["precompile", "PrecompileError"]

log = logging.getLogger(__name__)
# TORCH_LOGS=precompile_checks: at each load, what the runnable checks at every call,
# one line each, as Dynamo's TORCH_LOGS=guards lists its guards.
checks_log = logging.getLogger(__name__ + "_checks")

BACKENDS = ("inductor", "eager")
TRACERS = ("make_fx", "dynamo")


# Capture and lowering change process-global state (Note invariant 10): one
# precompile() at a time.  Reentrant: fn calling precompile() must not deadlock.
_PRECOMPILE_LOCK = threading.RLock()


class _Precompile:
    """``torch.compiler.precompile``: a callable with a ``load`` method."""

    def __call__(
        self,
        fn: Callable,
        *example_inputs: Any,
        backend: str = "inductor",
        tracer: str = "make_fx",
        decompositions: dict | None = None,
    ) -> tuple[str, bytes]:
        """Ahead-of-time precompile ``fn`` against ``example_inputs``; see the docs page."""
        if backend not in BACKENDS:
            raise ValueError(f"precompile: unknown backend {backend!r}; expected one of {BACKENDS}")
        if tracer not in TRACERS:
            raise ValueError(f"precompile: unknown tracer {tracer!r}; expected one of {TRACERS}")
        if tracer == "dynamo":
            raise NotImplementedError("precompile: tracer='dynamo' is planned; use tracer='make_fx'")
        if not callable(fn):
            raise PrecompileError(f"precompile: fn must be callable, got {type(fn).__name__}")

        # Imported at first use: load() never needs capture.
        from . import _precompile_artifact as artifact, _precompile_capture as stages

        timer = _StageTimer("precompile")
        with _PRECOMPILE_LOCK, _caller_rng_kept():
            capture, lowered = stages._captured_and_lowered(fn, example_inputs, backend, decompositions, timer)
            with timer("render"):
                python_code = stages._render(capture.convention, lowered)
            with timer("package"):
                kernels = artifact._harvest_kernels(python_code, capture.example_inputs) if backend == "inductor" else {}
                python_code = artifact._record_kernel_hashes(python_code, kernels)
                python_code, bytecode = artifact._record_bytecode(python_code)
                cache = artifact._package(python_code, backend, kernels, bytecode)
        timer.done(
            f"backend={backend} graph_inputs={len(capture.example_inputs)} kernels={len(kernels)} "
            f"python_code={len(python_code)}B cache={len(cache)}B"
        )
        return python_code, cache

    def load(self, python_code: str, cache: bytes) -> Callable:
        """Rebuild the runnable from ``(python_code, cache)``; executes python_code."""
        with _gc_paused():
            return self._load(python_code, cache)

    def _load(self, python_code: str, cache: bytes) -> Callable:
        timer = _StageTimer("load")
        with timer("import"):  # at the first load only
            from . import _precompile_artifact as artifact
            from ._precompile_format import read_artifact
        with timer("verify"):
            pair = read_artifact(python_code, cache, header_from_cache=True)
            artifact._check_gpus_present(pair.convention)
            kernels, compiled = artifact._usable_cache(pair)
            artifact._refuse_kernels_for_an_unknown_isa(pair, kernels)
            constants, convention = pair.constants, pair.convention
        with timer("prime"):
            kernel_files = artifact._prime_kernels(kernels)
        log.warning(
            "torch.compiler.precompile.load executes python_code (backend %r) and loads %d "
            "compiled kernels: only load artifacts you trust",
            convention.backend,
            len(kernel_files),
        )
        with timer("exec"):
            try:
                namespace = artifact._exec_artifact(python_code, constants, kernel_files, convention, compiled)
            except PrecompileError:
                raise
            except Exception as error:
                raise PrecompileError(
                    f"python_code failed to execute ({type(error).__name__}: {error}); it is "
                    "damaged or was edited"
                ) from error
            forward = namespace.get("forward")
            if not callable(forward):
                raise PrecompileError("python_code does not define a callable `forward`")
        timer.done(f"backend={convention.backend} kernels={len(kernel_files)}")
        if checks_log.isEnabledFor(logging.INFO):
            # An older artifact's own driver may not list its checks.
            checks = getattr(forward, "checks", None)
            listing = "\n".join(map(str, checks)) if checks is not None else "(its driver does not list them)"
            checks_log.info("what every call of the loaded artifact checks before its graph runs:\n%s", listing)
        return forward


def _caller_rng_kept():
    """Invariant 8: tracing dropout & co. and lowering draw random numbers; the caller's
    generators are restored, so seeding before precompile() seeds the first call."""
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    return torch.random.fork_rng(devices=cuda)


class _StageTimer:
    """Logs each stage's wall time at INFO on torch._precompile (TORCH_LOGS=precompile)."""

    def __init__(self, what: str):
        self.what = what
        self.stages: list = []
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stages.append((stage, time.perf_counter() - start))

    def done(self, summary: str) -> None:
        if log.isEnabledFor(logging.INFO):
            stages = ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in self.stages)
            total = (time.perf_counter() - self.start) * 1e3
            log.info("%s: %s; total %.1f ms; %s", self.what, stages, total, summary)


precompile = _Precompile()


# ---------------------------------------------------------------------------
# Attach to torch.compiler (entry point of group torch.backends; also on import)
# ---------------------------------------------------------------------------


def _attach() -> None:
    """Expose precompile / PrecompileError on torch.compiler, unless torch has its own
    (2.14+: left untouched, this one is ``torch_precompile.precompile``); must never raise."""
    try:
        import torch.compiler as compiler

        compat.register_log_alias("precompile", __name__)  # torch 2.14 registers no alias of that name
        compat.register_log_alias("precompile_checks", checks_log.name)
        if vars(compiler).get("precompile", precompile) is not precompile:
            return
        compiler.precompile = precompile
        compiler.PrecompileError = PrecompileError
        for name in ("precompile", "PrecompileError"):
            if name not in compiler.__all__:
                compiler.__all__.append(name)
    except Exception:  # never break `import torch` for everyone
        log.debug("attach failed", exc_info=True)


_attach()
