"""One forward+backward of a mixer backend between cudaProfilerStart/Stop, after warm-up, for
Nsight Compute (`ncu --profile-from-start off ... python tools/ncu_target.py samu 1x32768x2048
fused_controller_hierarchical_chunk8`)."""
import sys

import torch

from samu.experiment import legality, protocol

mixer, shape_text, backend = sys.argv[1:4]
shape = tuple(map(int, shape_text.split("x")))
x, params, dy = legality.make_inputs(mixer, shape, "cuda")
module = protocol.build_module(mixer, shape[2], backend, "cuda")
xg = x.detach().requires_grad_()
for _ in range(2):
    protocol.sample(module, xg, dy, "forward_backward")
torch.cuda.synchronize()
torch.cuda.profiler.start()
protocol.sample(module, xg, dy, "forward_backward")
torch.cuda.synchronize()
torch.cuda.profiler.stop()
