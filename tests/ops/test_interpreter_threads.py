"""Kernel launches from several threads at once.  Triton's interpreter is not thread safe (it
patches triton.language for the kernel it runs), so samu holds one lock around every
interpreted launch (samu.ops.common.launching); on a GPU the same calls run without it."""
import threading

import torch

from samu import backends
from samu.modules import MODULES

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
THREADS = 4


def _modules():
    torch.manual_seed(0)
    return [MODULES["samu"](16, backend=backends.DEFAULTS["samu"]).to(DEVICE),
            MODULES["rglru"](16, num_heads=2, backend=backends.DEFAULTS["rglru"]).to(DEVICE)]


def _forward_backward(modules, x, h0):
    """y, the final state and every gradient of each module: torch.autograd.grad, so that
    threads sharing the modules do not accumulate into .grad."""
    out = []
    for module in modules:
        xg = x.clone().requires_grad_()
        hg = h0.clone().requires_grad_()
        y, final = module(xg, initial_state=hg, output_final_state=True)
        grads = torch.autograd.grad(y.square().sum() + final.sum(),
                                    [xg, hg, *module.parameters()])
        out += [y.detach(), final.detach(), *grads]
    return out


def test_threads_launching_at_once_get_the_single_thread_results():
    modules = _modules()
    gen = torch.Generator().manual_seed(1)
    inputs = [(torch.randn(1, 16, 16, generator=gen).to(DEVICE),
               torch.randn(1, 16, generator=gen).to(DEVICE)) for _ in range(THREADS)]
    want = [_forward_backward(modules, x, h0) for x, h0 in inputs]
    got, errors = [None] * THREADS, []
    start = threading.Barrier(THREADS)

    def work(i):
        try:
            start.wait()
            got[i] = _forward_backward(modules, *inputs[i])
        except Exception as exc:  # reported below, with its thread
            errors.append((i, repr(exc)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(THREADS):
        for n, (g, w) in enumerate(zip(got[i], want[i])):
            assert torch.equal(g, w), (i, n)
