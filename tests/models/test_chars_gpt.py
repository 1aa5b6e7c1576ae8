"""chars-gpt's model: next-character logits that never read a later character."""

from __future__ import annotations

import math

import pytest
import torch

from esper_core.models.chars_gpt import CharGPT, next_char_loss
from esper_core.run.recipes import chars_gpt_model


def test_logits_at_each_position_depend_only_on_earlier_characters() -> None:
    torch.manual_seed(0)
    model = CharGPT(context=12, width=16, depth=2, heads=4).eval()
    x = torch.randint(0, 128, (2, 12))
    later = x.clone()
    later[:, 7:] = (later[:, 7:] + 1) % 128
    with torch.no_grad():
        a, b = model(x), model(later)
    assert a.shape == (2, 12, 128)
    assert torch.allclose(a[:, :7], b[:, :7]) and not torch.allclose(a[:, 7:], b[:, 7:])


def test_a_fresh_model_scores_about_log_vocab_nats_per_character() -> None:
    torch.manual_seed(0)
    x = torch.randint(0, 128, (4, 12))
    loss = next_char_loss(CharGPT(context=12, width=16, depth=1, heads=4)(x), x)
    assert abs(loss.item() - math.log(128)) < 0.1


def test_widths_scale_in_multiples_of_the_heads_and_bad_sizes_are_refused() -> None:
    assert chars_gpt_model(1.5).token.embedding_dim == 96 and chars_gpt_model(0.3).token.embedding_dim == 20
    with pytest.raises(ValueError, match="width divisible by heads"):
        CharGPT(width=30, heads=4)
