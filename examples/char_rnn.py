"""A character-level LSTM language model, trained data-parallel on CPU devices, that samples
text as it learns (the idea of Caffe2's ``examples/char_rnn.py``, written with the Caffe2 API
on dpgraph: rnn_cell.LSTM, brew, data_parallel_model.Parallelize_CPU).

    python examples/char_rnn.py [--devices 2] [--iters 400] [--train_data FILE] ...

The default text ships with the repository (``examples/data/char_rnn_text.txt``).  Each
device gets its share of the batch streams; the LSTM state is carried from one window of
``--seq_length`` characters to the next, as Caffe2's example does with its prepare_state net.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from dpgraph import brew, core, data_parallel_model, model_helper, optimizer, workspace
from dpgraph.proto import caffe2_pb2
from dpgraph.rnn_cell import LSTM

DEFAULT_TEXT = Path(__file__).parent / "data" / "char_rnn_text.txt"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_data", default=str(DEFAULT_TEXT), help="text file to learn")
    parser.add_argument("--seq_length", type=int, default=25, help="characters per step")
    parser.add_argument("--batch_size", type=int, default=8, help="streams, all devices")
    parser.add_argument("--hidden_size", type=int, default=96)
    parser.add_argument("--devices", type=int, default=2, help="CPU devices")
    parser.add_argument("--iters", type=int, default=400)
    parser.add_argument("--iters_to_report", type=int, default=100)
    parser.add_argument("--learning_rate", type=float, default=0.05, help="Adagrad")
    parser.add_argument("--sample_length", type=int, default=160)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--quiet", action="store_true", help="no progress bar or samples")
    return parser.parse_args(argv)


class CharRNN:
    """The text, the vocabulary and the training and sampling nets."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.text = Path(args.train_data).read_text(encoding="utf-8")
        self.vocab = sorted(set(self.text))
        self.index = {c: i for i, c in enumerate(self.vocab)}
        self.codes = np.array([self.index[c] for c in self.text], dtype=np.int32)
        self.devices = list(range(args.devices))
        if args.batch_size % args.devices:
            raise SystemExit("--batch_size must be a multiple of --devices")
        self.per_device = args.batch_size // args.devices
        stride = len(self.codes) // args.batch_size
        self.positions = np.arange(args.batch_size) * stride

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    # --- model ---------------------------------------------------------------------------
    def forward(self, model: Any, batch: int, forward_only: bool) -> Any:
        """LSTM over one-hot ``input_blob`` (T, batch, V) -> softmax (T*batch, V)."""
        hidden_all, _, _, _ = LSTM(model, "input_blob", "seq_lengths",
                                   ("hidden_init", "cell_init"), self.vocab_size,
                                   self.args.hidden_size, scope="LSTM",
                                   forward_only=forward_only)
        logits = brew.fc(model, hidden_all, "logits", dim_in=self.args.hidden_size,
                         dim_out=self.vocab_size, axis=2)
        softmax = model.net.Softmax(logits, "softmax", axis=2)
        reshaped, _ = model.net.Reshape(softmax, ["softmax_reshaped", "_softmax_old_shape"],
                                        shape=[-1, self.vocab_size])
        return reshaped

    def training_forward(self, model: Any, loss_scale: float) -> list[Any]:
        softmax = self.forward(model, self.per_device, forward_only=False)
        xent = model.net.LabelCrossEntropy([softmax, "target"], "xent")
        loss = model.net.AveragedLoss(xent, "loss")
        return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]

    def build(self) -> None:
        args = self.args
        self.train = model_helper.ModelHelper(name="char_rnn")
        data_parallel_model.Parallelize_CPU(
            self.train, input_builder_fun=lambda model: None,
            forward_pass_builder_fun=self.training_forward,
            optimizer_builder_fun=lambda model: optimizer.build_adagrad(
                model, base_learning_rate=args.learning_rate),
            devices=self.devices)
        self.prepare_state = core.Net("prepare_state")
        for d in self.devices:
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, d)):
                self.prepare_state.Copy(f"cpu_{d}/LSTM/hidden_state_last", f"cpu_{d}/hidden_init")
                self.prepare_state.Copy(f"cpu_{d}/LSTM/cell_state_last", f"cpu_{d}/cell_init")
        self.sampler = model_helper.ModelHelper(name="char_rnn_sampler", init_params=False)
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0)), core.NameScope("cpu_0"):
            self.sampler.net.AddExternalInputs("input_blob", "seq_lengths", "hidden_init",
                                               "cell_init")
            self.forward(self.sampler, 1, forward_only=True)

    # --- data ----------------------------------------------------------------------------
    def one_hot(self, codes: np.ndarray) -> np.ndarray:
        return np.eye(self.vocab_size, dtype=np.float32)[codes]

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """(inputs (T, B), targets (T, B)) of the next window of every stream."""
        t_len = self.args.seq_length
        rows = (self.positions[None, :] + np.arange(t_len + 1)[:, None]) % len(self.codes)
        self.positions = (self.positions + t_len) % len(self.codes)
        window = self.codes[rows]
        return window[:-1], window[1:]

    def feed_batch(self, inputs: np.ndarray, targets: np.ndarray) -> None:
        for i, d in enumerate(self.devices):
            cols = slice(i * self.per_device, (i + 1) * self.per_device)
            option = core.DeviceOption(caffe2_pb2.CPU, d)
            workspace.FeedBlob(f"cpu_{d}/input_blob", self.one_hot(inputs[:, cols]), option)
            workspace.FeedBlob(f"cpu_{d}/target", targets[:, cols].reshape(-1), option)
            workspace.FeedBlob(f"cpu_{d}/seq_lengths",
                               np.full(self.per_device, len(inputs), np.int32), option)

    # --- running -------------------------------------------------------------------------
    def setup(self) -> None:
        workspace.RunNetOnce(self.train.param_init_net)
        zeros = np.zeros((1, self.per_device, self.args.hidden_size), np.float32)
        for d in self.devices:
            option = core.DeviceOption(caffe2_pb2.CPU, d)
            for name in ("hidden_state_last", "cell_state_last"):
                workspace.FeedBlob(f"cpu_{d}/LSTM/{name}", zeros, option)
        workspace.CreateNet(self.prepare_state)
        self.feed_batch(*self.next_batch())
        workspace.RunNet(self.prepare_state.Name())
        workspace.CreateNet(self.train.net)

    def train_step(self) -> float:
        workspace.RunNet(self.prepare_state.Name())
        self.feed_batch(*self.next_batch())
        workspace.RunNet(self.train.net.Proto().name)
        return float(np.mean([workspace.FetchBlob(f"cpu_{d}/loss") for d in self.devices]))

    def sample(self, length: int, rng: np.random.Generator) -> str:
        """Sample text; the training streams' LSTM states are kept aside meanwhile (the
        sampler writes the same ``cpu_0/LSTM/*_last`` blobs)."""
        kept = {name: workspace.FetchBlob(name) for name in
                ("cpu_0/LSTM/hidden_state_last", "cpu_0/LSTM/cell_state_last")}
        try:
            return self._sample(length, rng)
        finally:
            for name, value in kept.items():
                workspace.FeedBlob(name, value, core.DeviceOption(caffe2_pb2.CPU, 0))

    def _sample(self, length: int, rng: np.random.Generator) -> str:
        """Feed one character at a time through the forward-only net, carrying the state."""
        hidden = np.zeros((1, 1, self.args.hidden_size), np.float32)
        cell = np.zeros_like(hidden)
        code = int(rng.integers(self.vocab_size))
        out = [self.vocab[code]]
        for _ in range(length):
            workspace.FeedBlob("cpu_0/input_blob", self.one_hot(np.array([[code]])))
            workspace.FeedBlob("cpu_0/seq_lengths", np.array([1], np.int32))
            workspace.FeedBlob("cpu_0/hidden_init", hidden)
            workspace.FeedBlob("cpu_0/cell_init", cell)
            workspace.RunNetOnce(self.sampler.net)
            p = workspace.FetchBlob("cpu_0/softmax")[0, 0].astype(np.float64)
            code = int(rng.choice(self.vocab_size, p=p / p.sum()))
            out.append(self.vocab[code])
            hidden = workspace.FetchBlob("cpu_0/LSTM/hidden_state_last")
            cell = workspace.FetchBlob("cpu_0/LSTM/cell_state_last")
        return "".join(out)


def progress_bar(done: int, total: int, width: int = 30) -> str:
    filled = width * done // max(total, 1)
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def main(argv: Sequence[str] | None = None, stream: TextIO = sys.stdout) -> list[float]:
    """Train and sample; returns the loss of every iteration (per character, nats)."""
    args = parse_args(argv)
    np.random.seed(args.seed)
    workspace.ResetWorkspace()
    rnn = CharRNN(args)
    rnn.build()
    rnn.setup()
    rng = np.random.default_rng(args.seed)
    losses: list[float] = []
    live = not args.quiet and bool(getattr(stream, "isatty", lambda: False)())
    start = time.time()
    for iteration in range(1, args.iters + 1):
        losses.append(rnn.train_step())
        if live:
            stream.write(f"\r{progress_bar(iteration, args.iters)} loss {losses[-1]:.3f}  ")
            stream.flush()
        if iteration % args.iters_to_report == 0 or iteration == args.iters:
            recent = float(np.mean(losses[-args.iters_to_report:]))
            chars = iteration * args.batch_size * args.seq_length / (time.time() - start)
            if not args.quiet:
                stream.write(("\r" if live else "") +
                             f"---------- Iteration {iteration} ---------- loss {recent:.3f} "
                             f"({chars:.0f} characters per second)\n")
                stream.write(rnn.sample(args.sample_length, rng) + "\n")
                stream.flush()
    return losses


if __name__ == "__main__":
    main()
