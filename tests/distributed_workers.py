"""The processes of tests/test_distributed.py and the cases they share with the parent.

Each worker is one rank of a gloo group on 127.0.0.1, started by torch.multiprocessing (spawn).
The Triton cases run on CUDA tensors where there is a GPU (every rank on the one GPU, gloo
staging the collectives through the host); without one the worker sets TRITON_INTERPRET=1 before
importing samu (the kernels under Triton's interpreter, on CPU tensors). It runs on one thread; it writes what it computed with torch.save, and the parent
compares.  An exception in a worker propagates to the parent through torch.multiprocessing.
Nothing here imports samu at module level: the parent imports this file too.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch

WIDTH = 16
RGLRU_HEADS = 2

# The Triton kernels run on CUDA where there is one, else under Triton's interpreter on the CPU.
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (name, dtype, backend, device): the float64 reference (exact), and the Triton backend that auto
# picks.
PRECISIONS = {
    "reference_float64": (torch.float64, "reference_chunked", "cpu"),
    "triton_float32": (torch.float32, "auto", KERNEL_DEVICE),
}
TOLERANCE = {"reference_float64": 1e-10, "triton_float32": 1e-4}

# Three ranks holding 10, 9 and 11 tokens (offsets 0, 10, 19; L = 30).
THREE_SLICES = (10, 9, 11)
THREE_LAYOUTS = {
    "plain_h0": dict(batch=2, cu_seqlens=None, initial=True),
    # without h0 the sequence resets at rank 0's first token (its SliceRun with resets)
    "plain": dict(batch=2, cu_seqlens=None, initial=False),
    # sequence 1 spans all three ranks; sequence 2 is one token
    "packed_spanning_h0": dict(batch=1, cu_seqlens=(0, 5, 21, 22, 30), initial=True),
    # a sequence starts exactly at rank 1's first token and crosses into rank 2, where a
    # one-token sequence and a last one start (new sequences reset: no initial state)
    "packed_boundary": dict(batch=1, cu_seqlens=(0, 5, 10, 21, 22, 30), initial=False),
    # Reset masks (global token positions per row): row 0 resets at its first token (h0
    # ignored), at rank 1's first token (its entering state ignored), inside rank 1 and at the
    # last token; row 1 carries through rank 1 and resets at rank 2's first token.
    "plain_h0_resets": dict(batch=2, cu_seqlens=None, initial=True,
                            resets=((0, 10, 14, 29), (5, 19, 25))),
    # sequence 1 resets at its start (h0 ignored) and inside rank 1, which it crosses, and at
    # rank 2's first token
    "packed_spanning_h0_resets": dict(batch=1, cu_seqlens=(0, 5, 21, 22, 30), initial=True,
                                      resets=((5, 12, 19, 29),)),
}
THREE_CASES = [(m, p, l) for m in ("samu", "rglru") for p in PRECISIONS for l in THREE_LAYOUTS
               if not (p == "triton_float32" and l == "packed_boundary")]
# The same loss, backpropagated twice (retain_graph=True, then without): the gradients are
# twice one backward's.  Packed over three ranks, the slices take both paths: a kernel SliceRun
# (rank 1, through which one sequence runs) and the slice's graph (ranks 0 and 2, where
# sequences start).  RG-LRU's kernels unpacked, where every rank runs a SliceRun: its graph
# path cannot run twice (the kernels write dG over G), without context parallelism either.
SECOND_BACKWARD_CASES = [(m, p, "packed_spanning_h0", "retain_graph") for m in ("samu", "rglru")
                         for p in PRECISIONS if (m, p) != ("rglru", "triton_float32")]
SECOND_BACKWARD_CASES.append(("rglru", "triton_float32", "plain_h0", "retain_graph"))

# Two ranks of uneven slices (7 and 17 tokens, L = 24), lengths gathered by build_cp_context.
TWO_SLICES = (7, 17)
TWO_LAYOUTS = {
    "plain": dict(batch=2, cu_seqlens=None, initial=False),
    "packed_crossing": dict(batch=1, cu_seqlens=(0, 3, 20, 24), initial=False),
}
TWO_CASES = [(m, "reference_float64", l) for m in ("samu", "rglru") for l in TWO_LAYOUTS]

ERROR_CASES = ("cu_seqlens_short", "slice_lengths_mismatch", "ranks_disagree_on_cu_seqlens",
               "wrong_width_on_one_rank", "cu_seqlens_passed_to_the_call", "grad_mode_differs",
               "resets_of_the_whole_sequence_on_one_rank")

# LayerNorm: the model's RMSNorm computes in FP32 whatever the dtype, LayerNorm in float64.
TRAINING = dict(vocab_size=13, width=16, layers=2, mlp_expansion=2, rglru_heads=2,
                norm="layernorm", backend="reference_chunked")
TRAINING_BATCH, TRAINING_LENGTH, TRAINING_STEPS, TRAINING_LR = 4, 12, 3, 0.3


def case_name(case) -> str:
    return "-".join(case)


def case_seed(case) -> int:
    return sum(ord(c) * (i + 1) for i, c in enumerate(case_name(case))) % 100003


def parameter_names(mixer: str):
    import samu
    return samu.mixers.get(mixer).parameter_names


def make_module(mixer: str, backend: str, params=None):
    import samu
    module = (samu.SAMU(WIDTH, backend=backend) if mixer == "samu"
              else samu.RGLRU(WIDTH, num_heads=RGLRU_HEADS, backend=backend))
    if params is not None:
        with torch.no_grad():
            for name, p in zip(parameter_names(mixer), params):
                getattr(module, name).copy_(p)
    return module


def case_inputs(case, slices, layouts):
    """Every tensor of a case, the same in every process: x, parameters, dy, the initial state,
    the final states' cotangent, and a cotangent for each rank's state at its slice end."""
    mixer, precision, layout_name = case[:3]
    layout = layouts[layout_name]
    dtype = PRECISIONS[precision][0]
    gen = torch.Generator().manual_seed(case_seed(case))
    module = make_module(mixer, "reference_chunked")
    module.reset_parameters(generator=gen)
    params = [(p.detach() + 0.1 * torch.randn(p.shape, generator=gen)).to(dtype)
              for p in module._parameters_in_order()]
    length = sum(slices)
    batch = layout["batch"]
    cu = layout["cu_seqlens"]
    count = batch if cu is None else len(cu) - 1
    x = torch.randn(batch, length, WIDTH, generator=gen).to(dtype)
    dy = torch.randn(batch, length, WIDTH, generator=gen).to(dtype)
    h0 = torch.randn(count, WIDTH, generator=gen).to(dtype) if layout["initial"] else None
    d_final = torch.randn(count, WIDTH, generator=gen).to(dtype)
    d_slice_end = torch.randn(len(slices), batch, WIDTH, generator=gen).to(dtype)
    device = PRECISIONS[precision][2]
    params = [p.to(device) for p in params]
    x, dy, d_final, d_slice_end = (t.to(device) for t in (x, dy, d_final, d_slice_end))
    h0 = None if h0 is None else h0.to(device)
    resets = None
    if "resets" in layout:
        resets = torch.zeros(batch, length, dtype=torch.bool)
        for row, positions in enumerate(layout["resets"]):
            resets[row, list(positions)] = True
        resets = resets.to(device)
    return dict(x=x, params=params, dy=dy, h0=h0, d_final=d_final, d_slice_end=d_slice_end,
                cu_seqlens=cu, resets=resets)


def slice_end_rows(rank: int, slices, cu) -> tuple[list, bool]:
    """(sequence ids of the rows rank returns, whether its last row continues)."""
    from samu.distributed import slice_layout
    layout = slice_layout(rank, slices, cu)
    if cu is None:
        return None, layout.continues
    return list(range(layout.first_sequence, layout.last_sequence + 1)), layout.continues


def full_sequence(case, slices, layouts) -> dict:
    """One process, the whole sequence: the loss <dy, y> + <d_final, final states> + the
    slice-end cotangents on h at each continuing slice's last token (h = y, minus skip x for
    SAMU)."""
    import samu
    t = case_inputs(case, slices, layouts)
    mixer, precision = case[:2]
    backend = PRECISIONS[precision][1]
    x = t["x"].clone().requires_grad_()
    params = [p.clone().requires_grad_() for p in t["params"]]
    h0 = None if t["h0"] is None else t["h0"].clone().requires_grad_()
    cu = (None if t["cu_seqlens"] is None
          else torch.tensor(t["cu_seqlens"], dtype=torch.int32, device=x.device))
    fn = samu.functional.FUNCTIONS[mixer]
    y, final = fn(x, *params, backend=backend, initial_state=h0, cu_seqlens=cu,
                  output_final_state=True, resets=t["resets"])
    loss = (y * t["dy"]).sum() + (final * t["d_final"]).sum()
    state_at = {}
    hidden = y if mixer == "rglru" else y - params[-1] * x  # h, differentiable
    end = 0
    for rank, n in enumerate(slices):
        end += n
        _, continues = slice_end_rows(rank, slices, t["cu_seqlens"])
        if continues:
            rows = slice(None) if cu is None else slice(0, 1)
            loss = loss + (hidden[rows, end - 1] * t["d_slice_end"][rank][rows]).sum()
            state_at[rank] = hidden[rows, end - 1].detach()
    inputs = [x, *params] + ([h0] if h0 is not None else [])
    grads = torch.autograd.grad(loss, inputs)
    return dict(y=y.detach(), final=final.detach(), dx=grads[0],
                params=list(grads[1:1 + len(params)]),
                dh0=grads[-1] if h0 is not None else None, state_at=state_at)


def cp_case(case, slices, layouts, rank: int, world: int, use_module: bool,
            length_argument: str, backwards: int = 1) -> dict:
    """This rank's share of the same loss under context parallelism (its gradients from
    ``backwards`` backward passes through one graph, divided by their number)."""
    import samu
    from samu.distributed import build_cp_context
    t = case_inputs(case, slices, layouts)
    mixer, precision = case[:2]
    backend = PRECISIONS[precision][1]
    start = sum(slices[:rank])
    end = start + slices[rank]
    lengths = (dict(slice_lengths=slices) if length_argument == "slice_lengths"
               else dict(local_length=slices[rank]))
    ctx = build_cp_context(cu_seqlens=t["cu_seqlens"], **lengths)
    x = t["x"][:, start:end].clone().requires_grad_()
    params = [p.clone().requires_grad_() for p in t["params"]]
    h0 = None if t["h0"] is None else t["h0"].clone().requires_grad_()
    resets = None if t["resets"] is None else t["resets"][:, start:end]  # this rank's slice
    if use_module:
        module = make_module(mixer, backend, params=[p.detach() for p in params]).to(x.device)
        y, states = module(x, initial_state=h0, output_final_state=True, cp_context=ctx,
                           resets=resets)
        name = module.last_backend
        leaves = [getattr(module, n) for n in parameter_names(mixer)]
    else:
        fn = getattr(samu, mixer)
        y, states, name = fn(x, *params, backend=backend, initial_state=h0,
                             output_final_state=True, return_backend=True, cp_context=ctx,
                             resets=resets)
        leaves = params
    ids, continues = slice_end_rows(rank, slices, t["cu_seqlens"])
    d_states = t["d_final"].clone() if ids is None else t["d_final"][ids].clone()
    if continues:
        rows = d_states.shape[0] if ids is None else 1
        d_states[-rows:] = t["d_slice_end"][rank][:rows]
    loss = (y * t["dy"][:, start:end]).sum() + (states * d_states).sum()
    for n in range(backwards):
        loss.backward(retain_graph=n < backwards - 1)
    grads = [p.grad / backwards for p in leaves]
    for g in grads:
        torch.distributed.all_reduce(g)  # each rank holds its slice's share
    dh0 = None
    if h0 is not None:
        dh0 = h0.grad / backwards
        torch.distributed.all_reduce(dh0)
    with torch.no_grad():  # the no-graph path gives the same forward
        fn = getattr(samu, mixer)
        y_no_grad = fn(x.detach(), *[p.detach() for p in params], backend=backend,
                       initial_state=None if h0 is None else h0.detach(), cp_context=ctx,
                       resets=resets)
    return dict(y=y.detach(), y_no_grad=y_no_grad, states=states.detach(),
                dx=x.grad / backwards,
                params=grads, dh0=dh0, sequence_ids=ids, continues=continues, backend=name,
                local_cu_seqlens=(None if ctx.local_cu_seqlens is None
                                  else ctx.local_cu_seqlens.tolist()))


def _init(rank: int, world: int, port: int, timeout: float = 90):
    if KERNEL_DEVICE == "cpu":  # before samu is imported anywhere in this process
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world,
                                         timeout=timedelta(seconds=timeout))
    import samu  # noqa: F401  (imported after TRITON_INTERPRET, as the kernels need)


def _finish(out_dir: str, rank: int, results: dict):
    from samu.experiment.spawned_ranks import finish_rank  # samu after TRITON_INTERPRET
    finish_rank(results, out_dir, rank)


def _bad_parameter_on_the_middle_rank(rank: int):
    """The middle rank, whose slice carries the sequence through (the kernels' summary phases on
    a Triton backend), passes a ctrl_weight of half the width."""
    import samu
    from samu.distributed import build_cp_context
    module = make_module("samu", "auto").to(KERNEL_DEVICE)
    params = [p.detach() for p in module._parameters_in_order()]
    if rank == 1:
        params[0] = params[0][:, :WIDTH // 2].contiguous()
    x = torch.randn(1, THREE_SLICES[rank], WIDTH, device=KERNEL_DEVICE)
    samu.samu(x, *params, cp_context=build_cp_context(slice_lengths=THREE_SLICES))


def three_ranks(rank: int, world: int, port: int, out_dir: str):
    _init(rank, world, port)
    results = {}
    for case in THREE_CASES:
        # The kernels' cases go through the modules, the reference's through the functions.
        results[case_name(case)] = cp_case(case, THREE_SLICES, THREE_LAYOUTS, rank, world,
                                           use_module=case[1] == "triton_float32",
                                           length_argument="slice_lengths")
    for case in SECOND_BACKWARD_CASES:
        results[case_name(case)] = cp_case(case, THREE_SLICES, THREE_LAYOUTS, rank, world,
                                           use_module=case[1] == "triton_float32",
                                           length_argument="slice_lengths", backwards=2)
    try:
        _bad_parameter_on_the_middle_rank(rank)
    except Exception as exc:  # what the parent checks: every rank raised the middle rank's error
        results["bad_parameter"] = (type(exc).__name__, str(exc))
    else:
        results["bad_parameter"] = None
    _finish(out_dir, rank, results)


def _error_case(name: str, rank: int):
    import samu
    from samu.distributed import build_cp_context
    gen = torch.Generator().manual_seed(7)
    module = make_module("samu", "reference_chunked")
    x = torch.randn(1, TWO_SLICES[rank], WIDTH, generator=gen, dtype=torch.float64)
    module.double()
    if name == "cu_seqlens_short":  # they cover 20 tokens, the slices hold 24
        build_cp_context(cu_seqlens=[0, 5, 20], local_length=TWO_SLICES[rank])
    elif name == "slice_lengths_mismatch":
        module(x, cp_context=build_cp_context(slice_lengths=(12, 12)))
    elif name == "ranks_disagree_on_cu_seqlens":
        cu = [0, 3, 24] if rank == 0 else [0, 4, 24]
        module(x, cp_context=build_cp_context(cu_seqlens=cu, slice_lengths=TWO_SLICES))
    elif name == "wrong_width_on_one_rank":
        if rank == 1:
            x = torch.randn(1, TWO_SLICES[rank], WIDTH + 1, dtype=torch.float64)
        module(x, cp_context=build_cp_context())
    elif name == "cu_seqlens_passed_to_the_call":
        cu = torch.tensor([0, TWO_SLICES[rank]], dtype=torch.int32)
        module(x, cu_seqlens=cu, cp_context=build_cp_context())
    elif name == "resets_of_the_whole_sequence_on_one_rank":  # not its slice's
        length = sum(TWO_SLICES) if rank == 1 else TWO_SLICES[rank]
        module(x, cp_context=build_cp_context(), resets=torch.zeros(1, length, dtype=torch.bool))
    elif name == "grad_mode_differs":
        x.requires_grad_()
        with torch.set_grad_enabled(rank == 0):
            samu.samu(x, *[p.detach() for p in module._parameters_in_order()],
                      backend="reference_chunked", cp_context=build_cp_context())


def train(mixer: str, wrap: str | None, rank: int = 0, world: int = 1,
          device: str = "cpu") -> list[float]:
    """Losses of TRAINING_STEPS SGD steps on this rank's share of the batch: wrap None (one
    process, the whole batch), "ddp" or "fsdp2" (data parallel over the group), on ``device``
    (this rank's GPU under NCCL)."""
    import torch.nn.functional as F
    from samu import model as samu_model
    config = samu_model.ModelConfig(mixer=mixer, **TRAINING)
    net = samu_model.build(config, seed=0).double().to(device)
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, TRAINING["vocab_size"], (TRAINING_BATCH, TRAINING_LENGTH + 1),
                           generator=gen).to(device)
    share = TRAINING_BATCH // world
    tokens = tokens[rank * share:(rank + 1) * share]
    # fully_shard refuses 0-dim parameters (SAMU's log_temp and skip): they stay whole on
    # every rank, outside the sharding, and their gradients are averaged here, in parameter
    # order on every rank (a set's order follows ids, which differ between processes).
    replicated = [p for p in net.parameters() if p.dim() == 0] if wrap == "fsdp2" else []
    if wrap == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(net)
    elif wrap == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(torch.device(device).type, (world,))
        for block in net.blocks:
            fully_shard(block, mesh=mesh, ignored_params=set(replicated))
        fully_shard(net, mesh=mesh, ignored_params=set(replicated))
    optimizer = torch.optim.SGD(net.parameters(), lr=TRAINING_LR)
    losses = []
    for _ in range(TRAINING_STEPS):
        logits = net(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        for p in replicated:
            torch.distributed.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        if wrap is not None:  # the whole batch's loss: the mean of the equal shares'
            torch.distributed.all_reduce(mean)
            mean /= world
        losses.append(mean.item())
    return losses


def two_ranks(rank: int, world: int, port: int, out_dir: str):
    _init(rank, world, port)
    results = {}
    for case in TWO_CASES:
        results[case_name(case)] = cp_case(case, TWO_SLICES, TWO_LAYOUTS, rank, world,
                                           use_module=False, length_argument="local_length")
    errors = {}
    for name in ERROR_CASES:
        try:
            _error_case(name, rank)
        except Exception as exc:  # what the parent checks: every rank raised, and what
            errors[name] = (type(exc).__name__, str(exc))
        else:
            errors[name] = None
    results["errors"] = errors
    for mixer in ("samu", "rglru"):
        for wrap in ("ddp", "fsdp2"):
            try:
                results[f"{wrap}-{mixer}"] = train(mixer, wrap, rank, world)
            except Exception as exc:  # reported by the parent as the error it is
                results[f"{wrap}-{mixer}"] = f"{type(exc).__name__}: {exc}"
    _finish(out_dir, rank, results)


def two_gpus(rank: int, world: int, port: int, out_dir: str):
    """Data parallel training over NCCL, one GPU per rank (a machine with two GPUs)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    device = f"cuda:{rank}"
    torch.cuda.set_device(device)
    torch.distributed.init_process_group("nccl", rank=rank, world_size=world,
                                         timeout=timedelta(seconds=90))
    results = {}
    for mixer in ("samu", "rglru"):
        for wrap in ("ddp", "fsdp2"):
            try:
                results[f"{wrap}-{mixer}"] = train(mixer, wrap, rank, world, device)
            except Exception as exc:  # reported by the parent as the error it is
                results[f"{wrap}-{mixer}"] = f"{type(exc).__name__}: {exc}"
    _finish(out_dir, rank, results)


# --- ranks whose calls disagree or fail on one rank ------------------------------------------

# Every collective of this group times out after this long: a rank left waiting fails the
# test (with the parent's deadline) instead of hanging the suite.
MISMATCH_TIMEOUT_SECONDS = 30
MISMATCH_SLICES = (5, 5)
# Offsets whose linear checksum sum((i + 1) c_i) is the same (88): only a digest tells them apart.
COLLIDING_CU_SEQLENS = ((0, 1, 4, 6, 10), (0, 3, 4, 5, 10))


def _mismatch_inputs(mixer: str = "samu", heads: int = RGLRU_HEADS):
    """This test's whole sequence (1, 10, WIDTH) in float64 and the mixer's parameters."""
    import samu
    gen = torch.Generator().manual_seed(11)
    module = (samu.SAMU(WIDTH) if mixer == "samu" else samu.RGLRU(WIDTH, num_heads=heads))
    module.reset_parameters(generator=gen)
    params = [p.detach().double() for p in module._parameters_in_order()]
    x = torch.randn(1, sum(MISMATCH_SLICES), WIDTH, generator=gen, dtype=torch.float64)
    return x, params


def _slice_of(x, rank: int):
    start = sum(MISMATCH_SLICES[:rank])
    return x[:, start:start + MISMATCH_SLICES[rank]]


def _mismatched_call(name: str, rank: int, group):
    """One case: a call that must raise on every rank (the parent checks the words)."""
    import samu
    from samu.distributed import build_cp_context
    x, params = _mismatch_inputs()
    mine = _slice_of(x, rank)
    reference = dict(backend="reference_chunked")

    def context(**kwargs):
        return build_cp_context(group, **kwargs)
    if name == "cu_seqlens_collide_at_build":
        ctx = context(cu_seqlens=COLLIDING_CU_SEQLENS[rank], slice_lengths=MISMATCH_SLICES)
        samu.samu(mine, *params, cp_context=ctx, **reference)
    elif name == "cu_seqlens_collide_in_the_call":  # both contexts built on both ranks
        contexts = [context(cu_seqlens=cu, slice_lengths=MISMATCH_SLICES)
                    for cu in COLLIDING_CU_SEQLENS]
        samu.samu(mine, *params, cp_context=contexts[rank], **reference)
    elif name == "slice_lengths_differ_in_the_call":  # rank 0 holds 5 tokens in both
        contexts = [context(slice_lengths=(5, 5)), context(slice_lengths=(5, 6))]
        held = mine if rank == 0 else torch.cat([mine, mine[:, :1]], 1)
        samu.samu(held, *params, cp_context=contexts[rank], **reference)
    elif name == "mixers_differ":
        if rank == 0:
            samu.samu(mine, *params, cp_context=context(), **reference)
        else:
            samu.rglru(mine, *_mismatch_inputs("rglru")[1], cp_context=context(), **reference)
    elif name == "heads_differ":
        samu.rglru(mine, *_mismatch_inputs("rglru", heads=2 * (rank + 1))[1],
                   cp_context=context(), **reference)
    elif name == "output_final_state_not_a_bool_on_one_rank":
        samu.samu(mine, *params, cp_context=context(), output_final_state=1 if rank else True,
                  **reference)
    elif name == "return_backend_not_a_bool_on_one_rank":
        samu.samu(mine, *params, cp_context=context(), return_backend="yes" if rank else False,
                  **reference)
    elif name == "parameter_missing_on_one_rank":
        samu.functional.mix("samu", mine, *params[:len(params) - rank], cp_context=context(),
                            **reference)
    elif name == "parameter_none_on_one_rank":
        given = [None if rank == 1 and i == 0 else p for i, p in enumerate(params)]
        samu.samu(mine, *given, cp_context=context(), **reference)
    elif name == "nested_cu_seqlens_on_one_rank":  # local_length: the build gathers
        context(cu_seqlens=[[0, 10]] if rank else [0, 10], local_length=MISMATCH_SLICES[rank])
    elif name == "fractional_slice_lengths":
        context(slice_lengths=[2.7, 2.7])
    elif name == "fractional_cu_seqlens":
        context(cu_seqlens=[0, 2.5, 4], slice_lengths=(2, 2))
    elif name == "nested_cu_seqlens":
        context(cu_seqlens=[[0, 4]], slice_lengths=(2, 2))
    elif name in ("create_graph_on_one_rank", "create_graph_on_the_kernels"):
        kernels = name.endswith("kernels")
        device = KERNEL_DEVICE if kernels else "cpu"
        dtype = torch.float32 if kernels else torch.float64
        xs = mine.to(device, dtype).requires_grad_()
        y = samu.samu(xs, *[p.to(device, dtype) for p in params], cp_context=context(),
                      backend="auto" if kernels else "reference_chunked")
        torch.autograd.grad(y.square().sum(), xs, create_graph=rank == 0 or kernels)
    elif name == "second_backward_through_overwritten_gates":
        # Rank 0's slice, where a sequence starts, runs its graph (the families' autograd Function), which
        # cannot run backward twice; rank 1's SliceRun can.
        ctx = context(cu_seqlens=(0, 3, 10), slice_lengths=MISMATCH_SLICES)
        rglru_params = [p.to(KERNEL_DEVICE, torch.float32) for p in _mismatch_inputs("rglru")[1]]
        xs = mine.to(KERNEL_DEVICE, torch.float32).requires_grad_()
        loss = samu.rglru(xs, *rglru_params, cp_context=ctx).sum()
        loss.backward(retain_graph=True)
        loss.backward()
    elif name == "only_h0_needs_grad":
        _only_h0_needs_grad(x, params, rank, group)
    elif name == "params_as_a_dict_by_name":
        from samu.distributed import context_parallel
        names = parameter_names("samu")
        shuffled = {n: p for n, p in reversed(list(zip(names, params)))}
        got = context_parallel("samu", mine, shuffled, cp_context=context(), **reference)
        _assert_close(got, _slice_of(samu.samu(x, *params, **reference), rank), name)
    elif name == "params_as_a_dict_of_other_names_on_one_rank":
        from samu.distributed import context_parallel
        keys = parameter_names("samu") if rank == 0 else [f"p{i}" for i in range(len(params))]
        context_parallel("samu", mine, dict(zip(keys, params)), cp_context=context(),
                         **reference)
    elif name == "params_not_a_sequence_on_one_rank":
        context().mix("samu", mine, None if rank else params, **reference)
    elif name == "resets_for_a_backend_without_a_mask_on_the_last_rank":
        # The last rank's slice ends its sequence: it ran after the summaries' exchange, and
        # its refusal left rank 0 waiting in the backward's.
        from samu import backends
        unmasked = backends.Backend("reference_without_a_mask", "samu", "reference",
                                    backends.REGISTRY["samu"]["reference_chunked"].run)
        backends.register(unmasked)
        try:
            xs = mine.clone().requires_grad_()
            resets = torch.zeros(1, MISMATCH_SLICES[rank], dtype=torch.bool) if rank else None
            y = samu.samu(xs, *params, cp_context=context(), backend=unmasked.name,
                          resets=resets)
            y.sum().backward()
        finally:
            del backends.REGISTERED["samu"][unmasked.name]
    elif name == "second_backward_without_retain_graph":
        xs = mine.clone().requires_grad_()
        loss = samu.samu(xs, *params, cp_context=context(), **reference).sum()
        loss.backward()
        loss.backward()
    else:
        raise KeyError(name)


def _assert_close(got, want, what: str, tolerance: float = 1e-12):
    error = float((got - want).norm() / max(float(want.norm()), 1e-300))
    if error > tolerance:
        raise AssertionError(f"{what}: relative error {error:.3e} against one process")


def _only_h0_needs_grad(x, params, rank: int, group):
    """A frozen mixer with a learned initial state, unpacked and packed (rank 1's slice is run
    straight through by a sequence there, so it reads no row of h0): the ranks' h0 gradients
    sum to one process's, and a rank that reads none gets zeros."""
    import samu
    from samu.distributed import build_cp_context
    for cu_seqlens, rows in ((None, 1), ((0, 2, 10), 2)):
        h0 = torch.randn(rows, WIDTH, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(5))
        whole = h0.clone().requires_grad_()
        samu.samu(x, *params, initial_state=whole, cu_seqlens=None if cu_seqlens is None
                  else torch.tensor(cu_seqlens), backend="reference_chunked"
                  ).square().sum().backward()
        mine = h0.clone().requires_grad_()
        ctx = build_cp_context(group, slice_lengths=MISMATCH_SLICES, cu_seqlens=cu_seqlens)
        samu.samu(_slice_of(x, rank), *params, initial_state=mine, cp_context=ctx,
                  backend="reference_chunked").square().sum().backward()
        if rank == 1 and float(mine.grad.abs().max()) != 0.0:
            raise AssertionError("rank 1 reads no row of h0, yet its gradient is not zero")
        total = mine.grad.clone()
        torch.distributed.all_reduce(total, group=group)
        _assert_close(total, whole.grad, f"h0's gradient, cu_seqlens {cu_seqlens}")


MISMATCH_CASES = ("cu_seqlens_collide_at_build", "cu_seqlens_collide_in_the_call",
                  "slice_lengths_differ_in_the_call", "mixers_differ", "heads_differ",
                  "output_final_state_not_a_bool_on_one_rank",
                  "return_backend_not_a_bool_on_one_rank", "parameter_missing_on_one_rank",
                  "parameter_none_on_one_rank", "nested_cu_seqlens_on_one_rank",
                  "fractional_slice_lengths", "fractional_cu_seqlens", "nested_cu_seqlens",
                  "create_graph_on_one_rank", "create_graph_on_the_kernels",
                  "second_backward_without_retain_graph",
                  "second_backward_through_overwritten_gates", "only_h0_needs_grad",
                  "params_as_a_dict_by_name", "params_as_a_dict_of_other_names_on_one_rank",
                  "params_not_a_sequence_on_one_rank",
                  "resets_for_a_backend_without_a_mask_on_the_last_rank")


def _good_call_error(rank: int, group) -> float:
    """A good call after a failed one: the relative error of this rank's y and dx against one
    process over the whole sequence (float64), which a collective paired with the failed
    call's would spoil."""
    import samu
    from samu.distributed import build_cp_context
    x, params = _mismatch_inputs()
    whole = x.clone().requires_grad_()
    want = samu.samu(whole, *params, backend="reference_chunked")
    want.square().sum().backward()
    mine = _slice_of(x, rank).clone().requires_grad_()
    got = samu.samu(mine, *params, backend="reference_chunked",
                    cp_context=build_cp_context(group, slice_lengths=MISMATCH_SLICES))
    got.square().sum().backward()
    pairs = ((got, _slice_of(want, rank)), (mine.grad, _slice_of(whole.grad, rank)))
    return max(float((a - b).detach().norm() / b.norm()) for a, b in pairs)


def mismatched_ranks(rank: int, world: int, port: int, out_dir: str):
    """Each case of MISMATCH_CASES, then a good call, in a group whose collectives time out
    after MISMATCH_TIMEOUT_SECONDS."""
    _init(rank, world, port)
    group = torch.distributed.new_group(
        list(range(world)), timeout=timedelta(seconds=MISMATCH_TIMEOUT_SECONDS))
    results = {}
    for name in MISMATCH_CASES:
        try:
            _mismatched_call(name, rank, group)
        except Exception as exc:  # what the parent checks: every rank raised, and what
            outcome = (type(exc).__name__, str(exc))
        else:
            outcome = None
        try:
            after = _good_call_error(rank, group)
        except Exception as exc:  # reported by the parent
            after = f"{type(exc).__name__}: {exc}"
        results[name] = dict(outcome=outcome, after=after)
    _finish(out_dir, rank, results)
