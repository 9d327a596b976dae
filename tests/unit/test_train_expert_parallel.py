"""expert_parallel_compute over 2 gloo ranks equals the one-device grouped experts, forward and backward,
including an expert that receives no tokens and a rank that sends nothing to the other."""

import torch

from tests.unit.gloo_ranks import run_ranks

E, DIM, HIDDEN = 4, 8, 16
# tokens per expert on each rank: both ranks feed both of rank 0's experts (the received segments must be
# regrouped by expert), rank 1 sends nothing to rank 1's experts, and expert 3 gets no tokens at all
COUNTS = {0: [3, 1, 5, 0], 1: [2, 4, 0, 0]}


def reference_experts():
    from sigma.train.moe import GroupedExperts

    torch.manual_seed(0)
    experts = GroupedExperts(E, DIM, HIDDEN, impl="loop")
    for w in (experts.w1, experts.w2, experts.w3):
        torch.nn.init.normal_(w, 0.0, 0.3)
    return experts


def inputs(rank):
    torch.manual_seed(10 + rank)
    return torch.randn(sum(COUNTS[rank]), DIM)


def local_experts(rank):
    """Rank's half of reference_experts(): experts 2 x rank and 2 x rank + 1."""
    full = reference_experts()
    local = type(full)(E // 2, DIM, HIDDEN, impl="loop")
    with torch.no_grad():
        for name in ("w1", "w2", "w3"):
            getattr(local, name).copy_(getattr(full, name)[rank * 2:(rank + 1) * 2])
    return local


def dispatch(rank):
    from sigma.train.parallel import expert_parallel_compute

    local = local_experts(rank)
    x = inputs(rank).requires_grad_()
    y = expert_parallel_compute(x, torch.tensor(COUNTS[rank]), local, None, 2)
    (y * torch.arange(1, y.numel() + 1, dtype=y.dtype).view_as(y)).sum().backward()
    return y.detach().numpy(), x.grad.numpy(), local.w1.grad.numpy(), local.w2.grad.numpy()


def test_all_to_all_dispatch_matches_local_experts():
    results = {rank: [torch.from_numpy(a) for a in arrays]
               for rank, arrays in run_ranks(dispatch, 2, timeout=120).items()}

    full = reference_experts()
    w1_grad = torch.zeros_like(full.w1)
    w2_grad = torch.zeros_like(full.w2)
    for rank in range(2):
        full.zero_grad()
        x = inputs(rank).requires_grad_()
        y = full(x, torch.tensor(COUNTS[rank]))
        (y * torch.arange(1, y.numel() + 1, dtype=y.dtype).view_as(y)).sum().backward()
        y_ep, x_grad_ep, _, _ = results[rank]
        assert torch.allclose(y_ep, y.detach(), atol=1e-5)
        assert torch.allclose(x_grad_ep, x.grad, atol=1e-5)
        w1_grad += full.w1.grad
        w2_grad += full.w2.grad
    # each rank's expert shard holds the gradient from both ranks' tokens
    for rank in range(2):
        _, _, w1_ep, w2_ep = results[rank]
        assert torch.allclose(w1_ep, w1_grad[rank * 2:(rank + 1) * 2], atol=1e-5)
        assert torch.allclose(w2_ep, w2_grad[rank * 2:(rank + 1) * 2], atol=1e-5)
    assert w1_grad[3].abs().sum() == 0 and w1_grad[0].abs().sum() > 0
