"""An LSTM sequence classifier."""

from __future__ import annotations

from mithril.models import LSTM, Embedding, IOKey, Linear, Model


def lstm_classifier(vocab_size: int = 1000, embed_dim: int = 32, hidden_size: int = 64, num_classes: int = 2,
                    name: str | None = None) -> Model:
    """Token ids [N, T] (int64) -> ``embedding`` -> many-to-one ``lstm`` (last hidden state) -> ``fc``
    logits [N, num_classes].

    >>> lstm_classifier(vocab_size=50, num_classes=3).shape_of("output")
    '[N, 3]'
    """
    model = Model(name)
    model |= Embedding(vocab_size, embed_dim, name="embedding")(input=IOKey("input", shape=["N", "T"], type=int))
    model += LSTM(hidden_size, name="lstm")
    model += Linear(num_classes, name="fc")(output="output")
    return model
