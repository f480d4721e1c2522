"""Adam's moments as data: P is the preconditioner the step applied (the update reproduced from the
moments, bias correction included, AdamW's decay apart), moments placed by the names the groups
carry (a mis-grouped state refused), none at step 0, and a moments file read back as written."""

import pytest
import torch

from tiny_llm.model.moments import (
    load_into,
    load_moments,
    moments_from_optimizer,
    preconditioner,
    save_moments,
    stability_threshold,
)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 3)).double()


def _groups(model, decay=0.0):
    """Decayed matrices first, then the rest undecayed (as training here and a Trainer group them)."""
    named = list(model.named_parameters())
    return [
        {
            "params": [p for _, p in named if (p.dim() >= 2) == d],
            "param_names": [n for n, p in named if (p.dim() >= 2) == d],
            "weight_decay": decay if d else 0.0,
        }
        for d in (True, False)
    ]


def _train(model, optimizer, steps):
    x = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        optimizer.zero_grad()
        model(x).pow(2).sum().backward()
        optimizer.step()


@pytest.mark.parametrize("decay", [0.0, 0.1])
def test_p_is_the_preconditioner_the_step_applied(decay):
    model = _model()
    lr, betas, eps = 0.01, (0.9, 0.95), 1e-8
    optimizer = torch.optim.AdamW(_groups(model, decay), lr=lr, betas=betas, eps=eps)
    _train(model, optimizer, 4)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _train(model, optimizer, 1)
    moments = moments_from_optimizer(optimizer.state_dict())
    P, t = preconditioner(moments), moments.step
    assert t == 5 and moments.record()["stability_threshold"] == pytest.approx(38 / lr)
    for name, p in model.named_parameters():
        decayed = moments.weight_decay[name]
        assert decayed == (decay if p.dim() >= 2 else 0.0)
        # θ_t − θ_{t−1} = −η λ θ_{t−1} − η P m̂_t (AdamW): the decay apart, P the step's own
        expected = -lr * decayed * before[name] - lr * P[name] * moments.exp_avg[name] / (1 - betas[0] ** t)
        assert torch.allclose(p.detach() - before[name], expected, rtol=1e-10, atol=1e-15), name


def test_moments_are_placed_by_name_and_a_misgrouped_state_is_refused():
    model = _model()
    optimizer = torch.optim.AdamW(_groups(model), lr=0.01)
    _train(model, optimizer, 2)
    state = optimizer.state_dict()
    moments = moments_from_optimizer(state)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    moments.check(shapes, "here")
    index = {n: i for g in state["param_groups"] for n, i in zip(g["param_names"], g["params"], strict=True)}
    for name in shapes:
        assert torch.equal(moments.exp_avg_sq[name], state["state"][index[name]]["exp_avg_sq"])
    # names proven elsewhere, one list per group: a list that does not fit its group is refused
    with pytest.raises(ValueError, match="parameter group 0 holds 2 tensors, 3 are named"):
        moments_from_optimizer(state, [["0.weight", "2.weight", "1.weight"], ["0.bias"]])
    # groups swapped (no-decay names for the decayed tensors): the shapes give it away
    swapped = [state["param_groups"][1]["param_names"], state["param_groups"][0]["param_names"]]
    with pytest.raises(ValueError, match="holds 2 tensors, 4 are named"):
        moments_from_optimizer(state, swapped)
    # the trap: a norm's weight and a bias share a shape, so names in the wrong order pass every
    # shape check and misplace moments silently; hence moments are placed by the groups' names only
    misplaced = moments_from_optimizer(state, [["0.weight", "2.weight"], ["1.weight", "0.bias", "1.bias", "2.bias"]])
    misplaced.check(shapes, "here")
    assert not torch.equal(misplaced.exp_avg_sq["1.weight"], moments.exp_avg_sq["1.weight"])
    with pytest.raises(ValueError, match=r"exp_avg of 0.bias has shape \(3,\), the parameter \(4,\)"):
        moments.check({**shapes, "0.bias": (4,)}, "here")  # another model's shapes
    with pytest.raises(ValueError, match="does not name the model's parameters"):
        moments.check({**shapes, "3.weight": (3, 3)}, "here")
    unnamed = {
        **state,
        "param_groups": [{k: v for k, v in g.items() if k != "param_names"} for g in state["param_groups"]],
    }
    with pytest.raises(ValueError, match="carry no names"):
        moments_from_optimizer(unnamed)


def test_no_preconditioner_at_step_0_and_a_moments_file_round_trips(tmp_path):
    model = _model()
    optimizer = torch.optim.AdamW(_groups(model), lr=0.01)
    fresh = moments_from_optimizer(optimizer.state_dict())
    assert fresh.step == 0 and preconditioner(fresh) is None  # never P = I
    _train(model, optimizer, 3)
    moments = moments_from_optimizer(optimizer.state_dict())
    save_moments(tmp_path / "moments-001.safetensors", moments)
    again = load_moments(tmp_path / "moments-001.safetensors")
    assert again.record() == {**moments.record(), "source": "moments-001.safetensors"}
    for name, v in moments.exp_avg_sq.items():
        assert torch.equal(again.exp_avg_sq[name], v) and torch.equal(again.exp_avg[name], moments.exp_avg[name])
    other = torch.optim.AdamW(_groups(model), lr=0.01)
    load_into(other, again)
    assert all(
        torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
        for a, b in zip(other.state_dict()["state"].values(), optimizer.state_dict()["state"].values(), strict=True)
    )
    assert stability_threshold(0.9, 0.5) == pytest.approx(76)
