"""Host side of every kernel launch: the cached launcher, tensor preparation, tile geometry.

``launch`` is the one launcher every kernel goes through (tests and probes patch it here).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import threading
import typing

import torch

from ..._runtime import INTERPRETING


class Launcher:
    """kernel[grid](*args, **meta), after the first call through the compiled kernel's C
    launcher itself: Triton's JIT path binds and keys every argument on every call, host time
    that the small shapes feel (benchmarks/host_overhead.py on the H200's host: 27.1 us per launch
    through the JIT, 13.3 us through the compiled kernel's runner, 7.5 us calling its C launcher
    directly).  The C launcher is called as the runner would call it, with the current stream,
    while no launch hook is set (a profiler such as proton sets them); with one set, the
    runner, which calls the hooks, is used.

    args are tensors and ints.  The cache key holds each int itself and each tensor's dtype, not
    its address: every pointer a kernel gets is 16-byte aligned (the Functions pass inputs
    through ``aligned``; buffers are fresh allocations or views at their start, or ``carve``d
    at 16-byte boundaries), which is the pointer specialisation Triton compiled for.  Keying the
    alignment cost ~0.6 us per tensor.  A first call that returns no compiled kernel (a tracer
    such as dynamo ran it) caches nothing, so a later eager call compiles for real.

    Under Triton's interpreter every launch holds one process-wide lock: the interpreter patches
    triton.language's functions for the kernel it runs and restores them after, so two threads
    launching at once break each other's kernels.  Compiled launches take no lock."""

    def __init__(self, interpreting: bool = INTERPRETING, device_index=None):
        self.interpreting = interpreting
        self.device_index = device_index or torch.cuda.current_device
        self.compiled: dict = {}

    def __call__(self, kernel, grid, *args, **meta):
        if self.interpreting:
            with INTERPRETER_LOCK:
                kernel[grid](*args, **meta)
            return
        device = self.device_index()
        key = (kernel, device, arg_key(args),
               tuple(meta.items()))  # call sites pass constexprs in a fixed order
        entry = self.compiled.get(key)
        if entry is None:
            compiled = kernel[grid](*args, **meta)
            if compiled is not None:
                constexpr_names = kernel.arg_names[len(args):]
                self.compiled[key] = (compiled, [meta[name] for name in constexpr_names],
                                      _c_launcher(compiled))
            return
        compiled, constexprs, direct = entry
        grid = tuple(grid) + (1,) * (3 - len(grid))
        if direct is not None and _no_launch_hooks():
            run, function, packed = direct
            run(grid[0], grid[1], grid[2], _current_stream(device), function, packed, None, None,
                None, *args, *constexprs)
        else:
            compiled[grid](*args, *constexprs)

    def bound_entry(self, kernel, grid, args, meta):
        """(C launcher, function handle, packed metadata, constexprs, device, 3-D grid) of the
        compiled kernel that launching these args would replay now, or None (not compiled yet,
        no C launcher, or interpreting)."""
        if self.interpreting:
            return None
        device = self.device_index()
        entry = self.compiled.get((kernel, device, arg_key(args), tuple(meta.items())))
        if entry is None or entry[2] is None:
            return None
        return (*entry[2], entry[1], device, tuple(grid) + (1,) * (3 - len(grid)))


class Site:
    """One launch site bound to one call signature: its kernel, grid and launch meta, for
    arguments whose ints and tensor dtypes the owner's cache key fixes (the owner keys the
    Site on every int it passes and every dtype that can vary).  The first call goes through
    ``launch``; later ones call the compiled kernel's C launcher directly, without building
    the launcher's key from every argument (~3.5 us of host time a launch on this CPU).  The
    general path is taken whenever ``launch`` is patched (tests, stubs, probes), a launch hook
    is set, or the current device is not the one the Site bound on."""

    __slots__ = ("kernel", "grid", "meta", "bound")

    def __init__(self, kernel, grid, meta: dict):
        self.kernel, self.grid, self.meta = kernel, tuple(grid), meta
        self.bound = None

    def __call__(self, *args):
        bound = self.bound
        if (bound is not None and launch is _LAUNCHER and _no_launch_hooks()
                and torch.cuda.current_device() == bound[4]):
            run, function, packed, constexprs, device, grid = bound
            run(grid[0], grid[1], grid[2], _current_stream(device), function, packed, None, None,
                None, *args, *constexprs)
            return
        launcher = launch
        launcher(self.kernel, self.grid, *args, **self.meta)
        if bound is None and launcher is _LAUNCHER:
            self.bound = launcher.bound_entry(self.kernel, self.grid, args, self.meta)


# Held around every interpreted launch (Launcher); re-entrant, so that nothing deadlocks should a
# launch ever run inside another.
INTERPRETER_LOCK = threading.RLock()


def _c_launcher(compiled):
    """(C launcher, function handle, packed metadata) of a compiled kernel, or None where this
    Triton's compiled kernels do not have them (the runner is then used)."""
    try:
        compiled._init_handles()
        return compiled.run, compiled.function, compiled.packed_metadata
    except AttributeError:
        return None


def _current_stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)


try:
    from triton import knobs as _knobs
except ImportError:  # an older Triton: no knobs, the runner is always used
    _knobs = None


def _unset(hook) -> bool:
    return hook is None or getattr(hook, "calls", True) == []


def _no_launch_hooks() -> bool:
    """Whether no launch hook is set: Triton's hooks are None or an empty HookChain (no
    generator: this runs on every launch)."""
    if _knobs is None:
        return False
    runtime = _knobs.runtime
    return _unset(runtime.launch_enter_hook) and _unset(runtime.launch_exit_hook)


launch = _LAUNCHER = Launcher()


def arg_key(args) -> tuple:
    """What a launch's cache entry is keyed on per argument: an int itself (Triton specialises
    on 1, divisibility by 16 and width), a tensor's dtype (its address is aligned, see launch)."""
    return tuple([a if a.__class__ is int else a.dtype for a in args])


def aligned(t: torch.Tensor) -> torch.Tensor:
    """t contiguous and at a 16-byte aligned address (a copy only when it is not): the kernels
    are compiled for aligned pointers (see launch)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def reset_bytes(resets, shape: tuple, device) -> torch.Tensor:
    """A torch.bool reset mask as the kernels read it: one uint8 per token (or row), contiguous
    and aligned (a copy only when it is not).  Any byte is a valid flag (non-zero resets): the
    kernels only compare it, so no value can move an address; its shape and device are checked
    here (the callers check them with clearer words first), since the kernels index it by the
    shape of x."""
    if (not isinstance(resets, torch.Tensor) or resets.dtype != torch.bool
            or tuple(resets.shape) != tuple(shape) or resets.device != device):
        got = (f"{resets.dtype} {list(resets.shape)} on {resets.device}"
               if isinstance(resets, torch.Tensor) else type(resets).__name__)
        raise ValueError(f"the reset mask must be torch.bool {list(shape)} on {device}, got {got}")
    return aligned(resets.view(torch.uint8))


def fp32_contiguous(p: torch.Tensor) -> torch.Tensor:
    """A parameter as a contiguous, aligned FP32 tensor: itself when it is one (no op)."""
    if p.dtype == torch.float32:
        return aligned(p)
    return p.float().contiguous()


def _padded(numel: int, element_size: int) -> int:
    """numel rounded up to whole 16-byte lines."""
    per_line = max(1, 16 // element_size)
    return -(-numel // per_line) * per_line


@functools.lru_cache(maxsize=1024)
def _layout(shapes: tuple, element_size: int) -> tuple:
    """((shape, strides, offset) of each piece, total elements) of ``carve``: worked out once per
    list of shapes (host time)."""
    pieces, start = [], 0
    for shape in shapes:
        strides, step = [], 1
        for size in reversed(shape):
            strides.append(step)
            step *= size
        pieces.append((shape, tuple(reversed(strides)), start))
        start += _padded(math.prod(shape), element_size)
    return tuple(pieces), start


def _layout_of(shapes, element_size: int) -> tuple:
    shapes = tuple(map(tuple, shapes))
    try:
        return _layout(shapes, element_size)
    except TypeError:  # symbolic sizes (torch.compile's fakes) do not hash: not cached
        return _layout.__wrapped__(shapes, element_size)


def carved_size(shapes, element_size: int = 4) -> int:
    """Elements of a flat buffer that ``carve`` cuts into tensors of these shapes."""
    return _layout_of(shapes, element_size)[1]


def carve(flat: torch.Tensor, shapes) -> list[torch.Tensor]:
    """Contiguous tensors of these shapes cut one after another from a flat (1-D, contiguous)
    buffer, each at a 16-byte aligned address (as launch's pointers must be) when the buffer's
    start is: one as_strided per piece (a slice and a view would be two ops of host time each)."""
    pieces, total = _layout_of(shapes, flat.element_size())
    if total > flat.numel():
        raise ValueError(f"carve: the pieces need {total} elements, the buffer has {flat.numel()}")
    base = flat.storage_offset()
    return [flat.as_strided(shape, strides, base + offset) for shape, strides, offset in pieces]


@functools.lru_cache(maxsize=1024)
def piece_sizes(numels: tuple, element_size: int) -> tuple:
    """Elements of each piece of ``pieces``: each numel rounded up to whole 16-byte lines but the
    last, which ends the buffer."""
    return tuple(_padded(n, element_size) for n in numels[:-1]) + numels[-1:]


def pieces(flat: torch.Tensor, numels) -> tuple:
    """A flat buffer (1-D, contiguous, 16-byte aligned, of sum(piece_sizes) elements) cut into
    1-D pieces of at least these many elements, one after another, each at a 16-byte aligned
    address, in one op (split_with_sizes).  A kernel takes a piece as a pointer; a torch op
    takes ``exact(piece, shape)``."""
    return flat.split_with_sizes(piece_sizes(tuple(numels), flat.element_size()))


def workspace(numels, device, dtype=torch.float32, zero_gaps: bool = False) -> tuple:
    """(flat buffer, its ``pieces``): one allocation for a call's buffers.  On the H200's host six
    torch.empty took 36 us, one cut by split_with_sizes 11.7 us, one cut by carve 22 us
    (benchmarks/host_overhead.py).  zero_gaps: the elements between pieces are zeroed (one op
    per gap; there is none where every numel but the last fills whole lines), so that a buffer
    whose pieces are all written holds no uninitialised memory (a custom op's output)."""
    numels = tuple(numels)
    sizes = piece_sizes(numels, dtype.itemsize)
    flat = torch.empty(sum(sizes), device=device, dtype=dtype)
    if zero_gaps:
        start = 0
        for numel, size in zip(numels, sizes):
            if size > numel:
                flat[start + numel:start + size].zero_()
            start += size
    return flat, flat.split_with_sizes(sizes)


def exact(piece: torch.Tensor, shape) -> torch.Tensor:
    """A piece of ``pieces`` as a tensor of this shape (its front)."""
    return piece[:math.prod(shape)].view(shape)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (4 for the interpreter's CPU tensors)."""
    return _sm_count(device) if device.type == "cuda" else 4


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host code: triton.cdiv is a JIT function whose Python call costs ~15 us."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (>= 1); host-side twin of triton.next_power_of_2 (~13 us)."""
    return 1 << max(0, int(n) - 1).bit_length()


# The longest chunk a configuration may take: each thread holds a chunk of tokens of its
# channels, and 128 is the longest checked against the oracle.
MAX_CHUNK = 128


def _check_power_of_two(owner: str, name: str, value, top: int, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name} must be an int, a power of two from 1 to {top} "
                        f"({why}), got {type(value).__name__} {value!r}")
    if value < 1 or value & (value - 1) or value > top:
        raise ValueError(f"{owner}: {name} must be a power of two from 1 to {top} ({why}), "
                         f"got {value}")


def check_launch(launch) -> None:
    """A kernel's Launch: warps and channels per thread powers of two (a tile's width is
    32 x warps x vector, and Triton's tiles are powers of two), a register cap of 24-255 or
    none.  Refused where it is made, not inside a kernel's compile."""
    owner = type(launch).__name__
    _check_power_of_two(owner, "warps", launch.warps, 32, "warps per program")
    _check_power_of_two(owner, "vector", launch.vector, 16, "channels per thread")
    cap = launch.registers
    if cap is None:
        return
    if isinstance(cap, bool) or not isinstance(cap, int):
        raise TypeError(f"{owner}: registers must be None or an int from 24 to 255 (a cap per "
                        f"thread), got {type(cap).__name__} {cap!r}")
    if not 24 <= cap <= 255:
        raise ValueError(f"{owner}: registers must be None or an int from 24 to 255 (a cap per "
                         f"thread), got {cap}")


@functools.lru_cache(maxsize=None)
def _field_types(cls) -> tuple:
    """(name, declared type) of a dataclass's fields, the annotations resolved."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


def check_fields(settings, at_least: dict | None = None) -> None:
    """A settings dataclass's fields against their declared types, refused where it is made
    (dataclasses.replace gives one any values): a bool field True or False, an int field an int
    of at least ``at_least[name]`` (default 1; None: any int, its owner checks the rest), a float
    field a finite number above 0 (or at least ``at_least[name]``), a field of a class an
    instance of it.  Other fields (unions, object) are their owner's to check."""
    owner = type(settings).__name__
    at_least = at_least or {}
    for name, kind in _field_types(type(settings)):
        value = getattr(settings, name)
        if kind is bool:
            if not isinstance(value, bool):
                raise TypeError(f"{owner}: {name} must be True or False, got {value!r}")
        elif kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__} "
                                f"{value!r}")
            least = at_least.get(name, 1)
            if least is not None and value < least:
                raise ValueError(f"{owner}: {name} must be at least {least}, got {value}")
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{owner}: {name} must be a number, got "
                                f"{type(value).__name__} {value!r}")
            least = at_least.get(name)
            if not math.isfinite(value) or (value <= 0 if least is None else value < least):
                raise ValueError(f"{owner}: {name} must be finite and "
                                 f"{'above 0' if least is None else f'at least {least}'}, "
                                 f"got {value}")
        elif isinstance(kind, type) and kind is not object and not isinstance(value, kind):
            raise TypeError(f"{owner}: {name} must be a {_class_name(kind, value)}, got "
                            f"{_class_name(type(value), kind)} {value!r}")


def _class_name(cls: type, other) -> str:
    """cls's name, with its module where ``other`` (a class or an instance) goes by the same
    name: each kernel family has a Launch of its own."""
    other = other if isinstance(other, type) else type(other)
    same = cls.__name__ == other.__name__ and cls is not other
    return f"{cls.__name__} of {cls.__module__}" if same else cls.__name__


def check_configuration(config, at_least: dict | None = None) -> None:
    """A backend configuration's chunk, then every field by its declared type (check_fields;
    ``at_least``: the int fields that may be lower than 1), its launches among them, refused
    where the configuration is made: dataclasses.replace(config, chunk=3) is one a user may pass
    as backend=."""
    _check_power_of_two(type(config).__name__, "chunk", config.chunk, MAX_CHUNK,
                        "tokens per chunk")
    check_fields(config, at_least)


def vector_width(width: int, wanted: int) -> int:
    """Channels per thread and load: `wanted` where it divides the width, else 1."""
    return wanted if width % wanted == 0 else 1


def tile_width(warps: int, vector: int) -> int:
    """Channels of a tile whose layout keeps the whole chunk of tokens in each thread."""
    return 32 * warps * vector


def register_cap(registers: int | None) -> dict:
    """A launch's cap on registers per thread as Triton's compile option (maxnreg), or none."""
    return {} if registers is None else dict(maxnreg=registers)


def with_state_keywords(meta: dict, any_keyword: bool) -> dict:
    """A kernel's launch meta as it runs: without its register cap when a state keyword is on,
    whose extra loads would spill under it (the cap is tuned for the default path)."""
    if not any_keyword or "maxnreg" not in meta:
        return meta
    return {k: v for k, v in meta.items() if k != "maxnreg"}


def row_stride_units(width: int, meta: dict) -> int:
    """The row_units argument of row_offsets: the width in units of the tile's vector V."""
    return width // meta["V"]


def refuse_double_backward(mixer: str) -> None:
    """The kernels' gradients are not themselves differentiable: with create_graph=True the
    engine runs backward in grad mode, and second-order terms would be dropped without a word."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"{mixer}: the Triton backends do not support double backward "
                           "(create_graph=True, e.g. a gradient penalty); use "
                           "backend='reference_chunked' for that")
