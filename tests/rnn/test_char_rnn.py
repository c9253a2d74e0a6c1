"""examples/char_rnn.py: trains on the shipped text on 2 CPU devices (loss falls well below
the uniform-guess loss) and samples text from the vocabulary."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import numpy as np

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "char_rnn.py"


def _load():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("char_rnn_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_char_rnn_learns_and_samples() -> None:
    example = _load()
    out = io.StringIO()
    losses = example.main(["--iters", "60", "--iters_to_report", "60", "--hidden_size", "32",
                           "--seq_length", "12", "--sample_length", "40"], stream=out)
    vocab = sorted(set(example.DEFAULT_TEXT.read_text(encoding="utf-8")))
    assert losses[0] > 0.9 * np.log(len(vocab))
    assert np.mean(losses[-10:]) < 0.8 * losses[0]
    text = out.getvalue()
    assert "---------- Iteration 60 ----------" in text
    sample = text.split("characters per second)\n", 1)[1][:-1]
    assert len(sample) == 41 and set(sample) <= set(vocab)
