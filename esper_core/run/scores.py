"""How a run's score is said: accuracy for class targets, bits per token for sequences of them.

A language model's target is a sequence of token ids per sample. Accuracy as Tolaria counts it
(the argmax of (B, classes) logits) means nothing there and reads 0.0000, so a run with such
targets reports its loss, a cross-entropy per token, in bits (nats / ln 2): bits per character
for a character model. Every place that prints a run's numbers (epoch log lines, the flow's last
line, ``esper run``'s summary, ``report.md``) says it the same way through ``describe``.
"""

from __future__ import annotations

import math

from esper_core.data import Dataset


def token_targets(data: Dataset) -> bool:
    """Whether each sample's target is a sequence of integer ids (a language model's next tokens)
    rather than one class index or real values."""
    _, y = data.train.head(1)  # (1, *target_shape)
    return not y.dtype.is_floating_point and y.dim() > 1


def bits(nats: float) -> float:
    """A cross-entropy in nats as bits."""
    return nats / math.log(2)


def describe(split: str, *, loss: float, accuracy: float, tokens: bool) -> str:
    """``"val loss 1.2345 (1.781 bits per token)"`` for token targets, else loss and accuracy."""
    if tokens:
        return f"{split} loss {loss:.4f} ({bits(loss):.3f} bits per token)"
    return f"{split} loss {loss:.4f}, {split} accuracy {accuracy:.4f}"
