"""The hf loop's sampling math (`engines.rollout.sampling`): the inverse-CDF draw and the
batch-wide seeded stream that lets finished rows leave."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.rollout.sampling import draw, draw_rows, processed_logits, repeat_rows, uniforms

# entries 0 and 2 have no mass (as a top-p-masked token has); 1 and 3 share it 1:3
PROBS = torch.tensor([[0.0, 0.25, 0.0, 0.75]])


def test_draw_picks_the_entry_whose_cdf_interval_holds_the_uniform() -> None:
    # target = total · (1 − u): u near 0 lands at the top of the CDF, u near 1 at its bottom
    picks = {u: int(draw(PROBS, torch.tensor([u], dtype=torch.float64))) for u in (0.0, 0.74, 0.76)}
    assert picks == {0.0: 3, 0.74: 3, 0.76: 1}
    # the largest uniform below 1 still lands on the first entry with mass, not on entry 0
    top = torch.tensor([1.0 - 2.0**-53], dtype=torch.float64)
    assert int(draw(PROBS, top)) == 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=2, max_size=40).filter(lambda p: sum(p) > 1e-6),
    st.floats(0.0, 1.0, exclude_max=True),
    st.floats(1e-3, 1e3),
)
def test_draw_never_picks_an_entry_without_mass_and_ignores_the_scale(
    p: list[float], u: float, scale: float
) -> None:
    """Whatever the row and the uniform: the id has positive probability, and a row scaled
    by any factor (speculative decoding's residual is not normalized) gives the same id."""
    probs = torch.tensor([p], dtype=torch.float32)
    uu = torch.tensor([u], dtype=torch.float64)
    i = int(draw(probs, uu))
    assert probs[0, i] > 0
    cdf = probs[0].double().cumsum(0) / probs.double().sum()  # (V,) normalized
    at_a_boundary = bool(((cdf - (1 - u)).abs() < 1e-5).any())  # rounding may tip it
    assert int(draw(probs * scale, uu)) == i or at_a_boundary


def test_draw_samples_the_distribution() -> None:
    """200,000 seeded draws over 50 entries: every frequency within 5 standard errors of
    its probability (a fixed seed: the test is deterministic)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(50, generator=gen) * 2, -1)  # (50,)
    n = 200_000
    ids = draw(p.expand(n, -1), uniforms(n, gen, torch.device("cpu")))
    freq = torch.bincount(ids, minlength=50).double() / n
    se = (p.double() * (1 - p.double()) / n).sqrt()
    assert bool(((freq - p.double()).abs() <= 5 * se + 1e-9).all())


def test_rows_that_left_take_their_uniform_and_live_rows_draw_as_in_the_full_batch() -> None:
    gen_a, gen_b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    probs = torch.softmax(torch.randn(6, 30, generator=torch.Generator().manual_seed(1)), -1)
    full = draw_rows(probs, None, 6, gen_a)  # (6, 1)
    rows = torch.tensor([1, 4, 5])
    part = draw_rows(probs[rows], rows, 6, gen_b)  # rows 0, 2 and 3 left the batch
    assert part[rows].equal(full[rows])
    assert part[[0, 2, 3], 0].tolist() == [0, 0, 0]
    # both streams advanced by the same 6 uniforms
    assert torch.rand(1, generator=gen_a).equal(torch.rand(1, generator=gen_b))


def test_processed_logits_leaves_the_logits_at_temperature_one_and_masks_outside_top_p() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    assert processed_logits(logits, 1.0, 1.0) is logits  # no copy on the common path
    assert processed_logits(logits, 2.0, 1.0).tolist() == [[1.0, 0.5, 0.0, -0.5]]
    nucleus = processed_logits(logits, 1.0, 0.7)  # p ≈ .64, .24, .09, .03: two reach 0.7
    assert torch.isinf(nucleus[0, 2:]).all() and torch.isfinite(nucleus[0, :2]).all()


def test_repeat_rows_repeats_a_prompts_cache_and_tensors_together() -> None:
    """P prompts' prefill → P·n rows, prompt p's copies at rows p·n … p·n + n − 1 (the order
    in which the loop lays out a prompt's samples), in the cache and every tensor alike."""
    from transformers import DynamicCache

    keys = torch.arange(2 * 3, dtype=torch.float32).reshape(2, 1, 3, 1)  # (P, heads, L, dim)
    cache = DynamicCache()
    cache.update(keys, keys + 100, layer_idx=0)
    logits = torch.tensor([[0.0, 1.0], [2.0, 3.0]])  # (P, V)
    (out,) = repeat_rows(3, cache, logits)
    assert out.tolist() == [[0.0, 1.0]] * 3 + [[2.0, 3.0]] * 3
    k = cache.layers[0].keys
    assert k.shape == (6, 1, 3, 1)
    assert torch.equal(k[:3], keys[:1].expand(3, -1, -1, -1))
    assert torch.equal(k[3:], keys[1:].expand(3, -1, -1, -1))
    assert torch.equal(cache.layers[0].values, k + 100)
    same = torch.ones(2, 4)
    assert repeat_rows(1, cache, same)[0] is same  # one sample a prompt: nothing to repeat
    assert cache.layers[0].keys.shape[0] == 6
