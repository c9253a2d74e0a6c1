"""``dpgraph demo``: a small CNN trained data-parallel on scikit-learn's 8x8 digits.

The model is built exactly like a Caffe2 script would build it (ModelHelper, brew,
``data_parallel_model.Parallelize_CPU`` with an optimizer builder), trained on several CPU
devices with a progress bar, evaluated on a held-out split, and finally checked: a few
iterations on N devices give the same parameters as on 1 device fed the whole batch.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from dpgraph import brew as _brew
from dpgraph import core, data_parallel_model, model_helper, optimizer, workspace
from dpgraph.errors import ArgumentError
from dpgraph.ir.device import CPU

brew: Any = _brew  # helpers are registered dynamically


@dataclass(frozen=True)
class DemoConfig:
    """Demo settings (the CLI flags)."""

    devices: int = 4
    epochs: int = 6
    batch_size: int = 64
    learning_rate: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    check_iterations: int = 3
    quiet: bool = False


@dataclass
class DemoResult:
    """What the demo measured."""

    losses: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    images_per_sec: float = 0.0
    max_param_diff: float = float("nan")
    params_match: bool = False
    seconds: float = 0.0

    @property
    def accuracy(self) -> float:
        return self.accuracies[-1] if self.accuracies else 0.0

    @property
    def ok(self) -> bool:
        return self.accuracy > 0.9 and self.params_match


def load_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits as float32 NCHW in [0, 1] and int32 labels: 80% train, 20% held out."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    labels = digits.target.astype(np.int32)
    order = np.random.RandomState(seed).permutation(len(labels))
    split = int(0.8 * len(labels))
    train, test = order[:split], order[split:]
    return images[train], labels[train], images[test], labels[test]


# --- the model, as a Caffe2 script would write it -------------------------------------
def add_input(model: Any) -> None:
    """Data arrives by FeedBlob into ``<prefix>_<d>/data`` and ``/label``."""


def add_cnn(model: Any) -> Any:
    conv = brew.conv(model, "data", "conv1", dim_in=1, dim_out=16, kernel=3, pad=1)
    relu = brew.relu(model, conv, "relu1")
    pool = brew.max_pool(model, relu, "pool1", kernel=2, stride=2)
    fc1 = brew.fc(model, pool, "fc1", dim_in=16 * 4 * 4, dim_out=64)
    relu2 = brew.relu(model, fc1, "relu2")
    return brew.fc(model, relu2, "fc2", dim_in=64, dim_out=10)


def add_training_forward(model: Any, loss_scale: float) -> list[Any]:
    logits = add_cnn(model)
    _, loss = model.net.SoftmaxWithLoss([logits, "label"], ["softmax", "loss"])
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def add_test_forward(model: Any, loss_scale: float) -> list[Any]:
    brew.softmax(model, add_cnn(model), "softmax")
    return []


def make_optimizer(config: DemoConfig) -> Any:
    def build(model: Any) -> Any:
        return optimizer.build_sgd(model, config.learning_rate, momentum=config.momentum,
                                   nesterov=False)
    return build


# --- running ---------------------------------------------------------------------------
def feed(model: Any, devices: Sequence[int], images: np.ndarray,
         labels: np.ndarray | None = None) -> None:
    """Split one global batch evenly over the devices."""
    per = len(images) // len(devices)
    for i, device in enumerate(devices):
        rows = slice(i * per, (i + 1) * per)
        with core.DeviceScope(core.DeviceOption(CPU, device)):
            workspace.FeedBlob(f"cpu_{device}/data", images[rows])
            if labels is not None:
                workspace.FeedBlob(f"cpu_{device}/label", labels[rows])


def build_training(devices: Sequence[int], config: DemoConfig, name: str) -> Any:
    model = model_helper.ModelHelper(name=name)
    data_parallel_model.Parallelize_CPU(
        model, add_input, add_training_forward, optimizer_builder_fun=make_optimizer(config),
        devices=list(devices))
    return model


def evaluate(devices: Sequence[int], images: np.ndarray, labels: np.ndarray,
             test_model: Any) -> float:
    per = len(images) // len(devices)
    feed(test_model, devices, images[:per * len(devices)])
    workspace.RunNet(test_model.net)
    predictions = np.concatenate([
        workspace.FetchBlob(f"cpu_{d}/softmax").argmax(axis=1) for d in devices])
    return float((predictions == labels[:len(predictions)]).mean())


class Progress:
    """A plain-text progress bar on a stream (no dependencies)."""

    def __init__(self, stream: TextIO, quiet: bool, width: int = 28) -> None:
        self.stream, self.quiet, self.width = stream, quiet, width
        isatty = getattr(stream, "isatty", None)
        self.live = bool(isatty and isatty())

    def bar(self, done: int, total: int) -> str:
        filled = self.width * done // max(total, 1)
        return "[" + "#" * filled + "." * (self.width - filled) + f"] {done}/{total}"

    def update(self, label: str, done: int, total: int, suffix: str = "") -> None:
        """Redraw the bar in place (only on a terminal, so logs stay readable)."""
        if self.quiet or not self.live:
            return
        self.stream.write(f"\r{label} {self.bar(done, total)} {suffix}   ")
        self.stream.flush()

    def line(self, text: str) -> None:
        if not self.quiet:
            self.stream.write(("\r" + text + " " * 24 if self.live else text) + "\n")
            self.stream.flush()


def train(config: DemoConfig, data: tuple[np.ndarray, ...], progress: Progress,
          result: DemoResult) -> None:
    x_train, y_train, x_test, y_test = data
    devices = list(range(config.devices))
    workspace.SwitchWorkspace("dpgraph_demo", True)
    workspace.ResetWorkspace()
    model = build_training(devices, config, "digits_train")
    model.param_init_net.set_rand_seed(config.seed)
    test_model = model_helper.ModelHelper(name="digits_test", init_params=False)
    data_parallel_model.Parallelize_CPU(test_model, add_input, add_test_forward,
                                        devices=devices)
    feed(model, devices, x_train[:config.batch_size], y_train[:config.batch_size])
    data_parallel_model.RunInitNet(model)
    workspace.CreateNet(test_model.net)
    steps = len(x_train) // config.batch_size
    rs = np.random.RandomState(config.seed)
    seen, busy = 0, 0.0
    for epoch in range(1, config.epochs + 1):
        order = rs.permutation(len(x_train))
        losses = []
        for step in range(steps):
            rows = order[step * config.batch_size:(step + 1) * config.batch_size]
            start = time.perf_counter()
            feed(model, devices, x_train[rows], y_train[rows])
            data_parallel_model.RunNet(model, 1)
            busy += time.perf_counter() - start
            seen += len(rows)
            losses.append(sum(float(workspace.FetchBlob(f"cpu_{d}/loss_scaled"))
                              for d in devices))
            progress.update(f"epoch {epoch}/{config.epochs}", step + 1, steps,
                            f"loss {np.mean(losses):.3f}")
        accuracy = evaluate(devices, x_test, y_test, test_model)
        result.losses.append(float(np.mean(losses)))
        result.accuracies.append(accuracy)
        result.images_per_sec = seen / busy if busy else 0.0
        progress.line(f"epoch {epoch}/{config.epochs} {progress.bar(steps, steps)}  "
                      f"loss {result.losses[-1]:.4f}  "
                      f"held-out accuracy {100 * accuracy:.1f}%  "
                      f"{result.images_per_sec:,.0f} images/s on {len(devices)} CPU devices")


def _run_copy(devices: Sequence[int], config: DemoConfig, images: np.ndarray,
              labels: np.ndarray, init: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    workspace.SwitchWorkspace(f"dpgraph_demo_check_{len(devices)}", True)
    workspace.ResetWorkspace()
    model = build_training(devices, config, f"digits_check_{len(devices)}")
    feed(model, devices, images, labels)
    data_parallel_model.RunInitNet(model)
    for name, value in init.items():
        for d in devices:
            workspace.FeedBlob(f"cpu_{d}/{name}", value)
    for _ in range(config.check_iterations):
        feed(model, devices, images, labels)
        data_parallel_model.RunNet(model, 1)
    prefix = f"cpu_{devices[0]}/"
    return {str(p)[len(prefix):]: workspace.FetchBlob(str(p)) for p in model.GetParams(prefix)}


def check_equivalence(config: DemoConfig, data: tuple[np.ndarray, ...],
                      result: DemoResult) -> None:
    """N devices with 1/N of a batch each == 1 device with the whole batch."""
    x_train, y_train = data[0], data[1]
    images, labels = x_train[:config.batch_size], y_train[:config.batch_size]
    rs = np.random.RandomState(config.seed + 1)
    shapes = {"conv1_w": (16, 1, 3, 3), "conv1_b": (16,), "fc1_w": (64, 256),
              "fc1_b": (64,), "fc2_w": (10, 64), "fc2_b": (10,)}
    init = {n: (0.1 * rs.randn(*s)).astype(np.float32) for n, s in shapes.items()}
    many = _run_copy(list(range(config.devices)), config, images, labels, init)
    one = _run_copy([0], config, images, labels, init)
    result.max_param_diff = max(float(np.abs(many[n] - one[n]).max()) for n in one)
    result.params_match = all(np.allclose(many[n], one[n], rtol=1e-4, atol=1e-5) for n in one)


def run_demo(config: DemoConfig = DemoConfig(), stream: TextIO | None = None) -> DemoResult:
    """Train, evaluate and check; returns the measurements."""
    stream = sys.stderr if stream is None else stream
    progress = Progress(stream, config.quiet)
    if config.batch_size % config.devices:
        raise ArgumentError(f"batch size {config.batch_size} must be a multiple of the "
                            f"{config.devices} devices; change --batch-size or --devices")
    started = time.perf_counter()
    result = DemoResult()
    previous = workspace.CurrentWorkspace()
    data = load_data(config.seed)
    progress.line(f"dpgraph demo: {len(data[0])} training / {len(data[2])} held-out digits, "
                  f"batch {config.batch_size} over {config.devices} CPU devices")
    try:
        train(config, data, progress, result)
        check_equivalence(config, data, result)
    finally:
        workspace.SwitchWorkspace(previous, True)
    result.seconds = time.perf_counter() - started
    mark = "OK" if result.params_match else "MISMATCH"
    progress.line(f"check: {config.devices} devices vs 1 device (full batch), "
                  f"{config.check_iterations} iterations: max |diff| = "
                  f"{result.max_param_diff:.2e}  [{mark}]")
    progress.line(f"done in {result.seconds:.1f} s")
    return result
