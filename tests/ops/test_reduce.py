"""The parameter gradients' reductions (samu.ops.common.reduce) against float64 sums, with
several row splits and ragged column blocks."""
import pytest
import torch

from samu.ops.common import reduce

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("tokens,width,programs", [(1000, 160, 8), (77, 32, 1), (64, 300, 64)])
def test_weight_partials_sum_to_dz_transpose_x(tokens, width, programs):
    gen = torch.Generator().manual_seed(tokens + width)
    x = torch.randn(tokens, width, generator=gen).to(torch.bfloat16)
    dz = torch.randn(2, tokens, generator=gen)
    rows = reduce.weight_partials(x.to(DEVICE), dz.to(DEVICE), programs)
    assert rows.shape[1] == 2 * width
    if programs >= 8 and tokens > reduce.WEIGHT_TOKENS:
        assert rows.shape[0] > 1  # the split over tokens is exercised
    want = (dz.double() @ x.double()).reshape(-1)
    got = rows.double().sum(0).cpu()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("flat", [False, True])
def test_sum_partials_takes_a_front_with_its_own_row_count(flat):
    """Shaped rows, or flat pieces of one workspace with their shapes given as ``rows``."""
    gen = torch.Generator().manual_seed(0)
    front = torch.randn(3, 70, generator=gen)
    part = torch.randn(130, 4, generator=gen)
    tail = torch.randn(130, 50, generator=gen)
    a_param = torch.randn(50, generator=gen)
    if flat:
        from samu.ops.common.launching import workspace
        _, pieces = workspace([t.numel() for t in (front, part, tail)], DEVICE)
        for piece, t in zip(pieces, (front, part, tail)):
            piece[:t.numel()].copy_(t.reshape(-1))
        out = reduce.sum_partials(pieces[1], pieces[2], a_param.to(DEVICE), front=pieces[0],
                                  rows=(3, 70, 130, 4, 50))
    else:
        out = reduce.sum_partials(part.to(DEVICE), tail.to(DEVICE), a_param.to(DEVICE),
                                  front=front.to(DEVICE))
    out = out.cpu().double()
    want = torch.cat([front.double().sum(0), part.double().sum(0),
                      tail.double().sum(0) * torch.sigmoid(a_param.double())])
    assert out.shape == want.shape
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-5)


def test_weight_partials_write_into_a_given_flat_buffer():
    gen = torch.Generator().manual_seed(3)
    tokens, width, programs = 300, 48, 8
    x = torch.randn(2, tokens // 2, width, generator=gen).to(DEVICE)
    dz = torch.randn(2, tokens, generator=gen).to(DEVICE)
    splits = reduce.weight_rows(tokens, width, programs)
    out = torch.full((splits * 2 * width + 5,), float("nan"), device=DEVICE)
    assert reduce.weight_partials(x, dz, programs, out=out) is out
    assert out[-5:].isnan().all()  # nothing past its rows
    want = (dz.double() @ x.reshape(tokens, width).double()).reshape(-1).cpu()
    got = out[:-5].view(splits, 2 * width).double().sum(0).cpu()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4 * want.abs().max().item())


def test_sum_partials_refuses_a_front_with_a_channel_group():
    part, tail = torch.zeros(2, 4), torch.zeros(2, 8)
    with pytest.raises(ValueError, match="front"):
        reduce.sum_partials(part, tail, torch.zeros(8), out=torch.zeros(20), group=(0, 8),
                            front=torch.zeros(2, 6))
