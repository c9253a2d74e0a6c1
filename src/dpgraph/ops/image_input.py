"""ImageInput: decode, augment and batch images from a DB of TensorProtos or CaffeDatum.

Inputs: a DB reader (or none: then args ``db``/``db_type`` open one).  Outputs: ``data``
(float32 NHWC, BGR; NCHW and FLOAT/FLOAT16 on the GPU-transform path), ``label`` and any
additional outputs.  Images are decoded by ``decode_threads`` threads (the prefetch thread
and ``decode_threads - 1`` pool threads, each taking the next unclaimed row), one batch ahead
of the consumer unless ``no_prefetch``.  With ``device_option.random_seed`` set the random
crops and mirrors follow that seed; otherwise they follow the op's own random stream.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dpgraph.errors import ArgumentError, DataInputError
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.db import on_device, prefetcher, reader_input, storage
from dpgraph.ops.fill import no_gradient
from dpgraph.proto import caffe2_pb2

if TYPE_CHECKING:
    from dpgraph.data.records import ImageRecord
    from dpgraph.db.reader import DBReader
    from dpgraph.db.services import StorageServices

DT = caffe2_pb2.TensorProto
SINGLE_LABEL, MULTI_LABEL_SPARSE, MULTI_LABEL_DENSE = 0, 1, 2
MULTI_LABEL_WEIGHTED_SPARSE, SINGLE_LABEL_WEIGHTED, EMBEDDING_LABEL = 3, 4, 5


@dataclass(frozen=True)
class _Config:
    batch_size: int
    label_type: int
    num_labels: int
    caffe_datum: bool
    output_sizes: tuple[int, ...]
    threads: int
    max_error_ratio: float
    gpu_transform: bool
    output_float16: bool
    params: Any  # dpgraph.data.image.ImageParams
    services: StorageServices


def _per_channel(ctx: OpContext, name: str, scalar: str, default: float) -> tuple[float, ...]:
    values = ctx.floats_arg(name, [ctx.float_arg(scalar, default)])
    if len(values) not in (1, 3):
        raise ArgumentError(ctx.describe(f"{name} must have 1 or 3 values (BGR), got "
                                         f"{len(values)}."))
    return tuple(values * 3) if len(values) == 1 else tuple(values)


def _output_float16(ctx: OpContext) -> bool:
    value = ctx.arg("output_type", DT.FLOAT)
    if isinstance(value, str):
        name = value.upper()
        if name not in ("FLOAT", "FLOAT16"):
            raise ArgumentError(ctx.describe(f"output_type must be float or float16, got "
                                             f"{value!r}."))
        return name == "FLOAT16"
    return int(value) == DT.FLOAT16


def _check_sizes(ctx: OpContext, scale: int, minsize: int, crop: int,
                 random_scale: list[int]) -> int:
    if len(random_scale) != 2 or random_scale[1] < random_scale[0]:
        raise ArgumentError(ctx.describe(f"random_scale must be [min, max] with max >= min, "
                                         f"got {random_scale}."))
    if random_scale[0] > 0:
        minsize = random_scale[0]
    if (scale > 0) == (minsize > 0):
        raise ArgumentError(ctx.describe("Must provide one and only one of scaling or minsize "
                                         f"(scale={scale}, minsize={minsize})."))
    if crop <= 0 or max(scale, minsize) < crop:
        raise ArgumentError(ctx.describe(f"crop must be > 0 and no larger than scale/minsize; "
                                         f"got crop={crop}, scale={scale}, minsize={minsize}."))
    return minsize


def _config(ctx: OpContext) -> _Config:
    batch_size = ctx.int_arg("batch_size", 0)
    if batch_size <= 0:
        raise ArgumentError(ctx.describe(f"Batch size should be nonnegative (> 0), got "
                                         f"{batch_size}."))
    label_type, num_labels = ctx.int_arg("label_type", 0), ctx.int_arg("num_labels", 0)
    if label_type not in range(6):
        raise ArgumentError(ctx.describe(f"unknown label_type {label_type} (0-5)."))
    if label_type not in (SINGLE_LABEL, SINGLE_LABEL_WEIGHTED) and num_labels <= 0:
        raise ArgumentError(ctx.describe(f"label_type {label_type} needs num_labels > 0."))
    caffe_datum = bool(ctx.int_arg("use_caffe_datum", 0))
    if caffe_datum and (label_type not in (0, 4) or ctx.num_outputs != 2):
        raise ArgumentError(ctx.describe("use_caffe_datum allows only label types 0/4 and "
                                         "exactly 2 outputs."))
    extra = ctx.num_outputs - 2
    sizes = ctx.ints_arg("output_sizes", [1] * extra)
    if len(sizes) != extra:
        raise ArgumentError(ctx.describe(f"output_sizes has {len(sizes)} entries for {extra} "
                                         "additional outputs."))
    scale, crop = ctx.int_arg("scale", -1), ctx.int_arg("crop", -1)
    random_scale = ctx.ints_arg("random_scale", [-1, -1])
    minsize = _check_sizes(ctx, scale, ctx.int_arg("minsize", -1), crop, random_scale)
    mean = _per_channel(ctx, "mean_per_channel", "mean", 0.0)
    std = _per_channel(ctx, "std_per_channel", "std", 1.0)
    if ctx.has_arg("mean_per_channel") and ctx.has_arg("std_per_channel") and \
            len(ctx.floats_arg("mean_per_channel")) != len(ctx.floats_arg("std_per_channel")):
        raise ArgumentError(ctx.describe("mean_per_channel and std_per_channel must have the "
                                         "same length."))
    box = tuple(ctx.int_arg(f"bounding_{k}", -1) for k in ("ymin", "xmin", "height", "width"))
    gpu_transform = bool(ctx.int_arg("use_gpu_transform", 0)) and ctx.device.device_type != 0
    services = storage(ctx)
    params = services.image_params(
        crop=crop, scale=scale, minsize=minsize, warp=bool(ctx.int_arg("warp", 0)),
        channels=3 if ctx.int_arg("color", 1) else 1, is_test=bool(ctx.int_arg("is_test", 0)),
        mirror=bool(ctx.int_arg("mirror", 0)),
        scale_jitter_type=ctx.int_arg("scale_jitter_type", 0),
        random_scale=(random_scale[0], random_scale[1]),
        color_jitter=bool(ctx.int_arg("color_jitter", 0)),
        saturation=ctx.float_arg("img_saturation", 0.4),
        brightness=ctx.float_arg("img_brightness", 0.4),
        contrast=ctx.float_arg("img_contrast", 0.4),
        color_lighting=bool(ctx.int_arg("color_lighting", 0)),
        lighting_std=ctx.float_arg("color_lighting_std", 0.1), mean=mean, std=std,
        bbox=(box[0], box[1], box[2], box[3]) if min(box) >= 0 else None,
        gpu_transform=gpu_transform)
    return _Config(batch_size, label_type, num_labels, caffe_datum, tuple(sizes),
                   ctx.int_arg("decode_threads", 4),
                   ctx.float_arg("max_decode_error_ratio", 1.0), gpu_transform,
                   _output_float16(ctx), params, services)


# --- one batch ---------------------------------------------------------------------------
def _parse(value: bytes, cfg: _Config, where: str) -> ImageRecord:
    if cfg.caffe_datum:
        return cfg.services.parse_caffe_datum(value, where)
    return cfg.services.parse_tensor_protos(value, cfg.label_type, len(cfg.output_sizes),
                                            where)


#: SplitMix64's constants: the stream increment and the two finaliser multipliers.
_GAMMA, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
#: Spreads rows of one batch seed far apart in the generator's state space.
_ROW_STRIDE = 0xD1B54A32D192ED03
_MASK = (1 << 64) - 1


def _mix(state: int) -> int:
    """SplitMix64's finaliser: a 64-bit state to 64 well-mixed bits."""
    state = ((state ^ (state >> 30)) * _MIX1) & _MASK
    state = ((state ^ (state >> 27)) * _MIX2) & _MASK
    return state ^ (state >> 31)


class _RowDraws:
    """One image's random numbers, with the ``numpy.random.Generator`` methods the pipeline
    calls: a counter-based SplitMix64 stream that starts from (batch seed, row).  The draws
    therefore follow the seed and do not depend on which decode thread takes the row, and a
    row costs no set-up (a Generator per image costs more than its crop)."""

    __slots__ = ("_state",)

    def __init__(self, seed: int, row: int) -> None:
        self._state = (_mix(seed & _MASK) + (row + 1) * _ROW_STRIDE) & _MASK

    def random(self) -> float:
        """Uniform in ``[0, 1)`` with 53 random bits."""
        self._state = (self._state + _GAMMA) & _MASK
        return (_mix(self._state) >> 11) * 2.0 ** -53

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.random()

    def integers(self, low: int, high: int) -> int:
        """Uniform in ``[low, high)``."""
        return min(low + int(self.random() * (high - low)), high - 1)

    def permutation(self, count: int) -> list[int]:
        order = list(range(count))
        for i in range(count - 1, 0, -1):
            j = self.integers(0, i + 1)
            order[i], order[j] = order[j], order[i]
        return order

    def normal(self, loc: float, scale: float, size: int) -> np.ndarray:
        """Box-Muller normals."""
        values = [math.sqrt(-2.0 * math.log(1.0 - self.random()))
                  * math.cos(2.0 * math.pi * self.random()) for _ in range(size)]
        return loc + scale * np.array(values)


def _one_image(value: bytes, cfg: _Config, draws: _RowDraws, where: str,
               out: np.ndarray) -> tuple[ImageRecord, bool]:
    """Parse, augment and normalise one image into its batch row ``out``."""
    record = _parse(value, cfg, where)
    params = cfg.params
    if record.bbox is not None:
        params = dataclasses.replace(params, bbox=record.bbox)
    try:
        pixels, failed = cfg.services.augment(record, params, draws)
    except ValueError as error:
        raise DataInputError(f"{where}: {error}") from None
    if cfg.gpu_transform:
        out[...] = pixels
    else:
        cfg.services.normalize(pixels, params, out)
    return record, failed


_Done = list[tuple[int, "ImageRecord", bool]]
#: Records read per reader call while a batch's decode threads already work on the first ones.
_READ_CHUNK = 4


class _RowFeed:
    """A batch's records, decoded as the reading thread reads them (Caffe2's prefetch loop
    also queues each record's decode as soon as it has read it): each :meth:`add` says how
    many pool helpers to start for the new rows.  Helpers never wait for records: one that
    finds no unclaimed row ends, so a read that blocks (a DB over a blobs queue) holds no
    pool thread that another op's batch needs.  The reading thread decodes what is left."""

    def __init__(self, helpers: int) -> None:
        self._records: list[tuple[bytes, bytes]] = []
        self._claimed = 0
        self._failed = False
        self._helpers, self._active = helpers, 0
        self._lock = threading.Lock()

    def add(self, keys: list[bytes], values: list[bytes]) -> int:
        """Append records; answers how many more helpers to start."""
        with self._lock:
            self._records.extend(zip(keys, values))
            unclaimed = len(self._records) - self._claimed
            start = 0 if self._failed else min(self._helpers - self._active, unclaimed)
            self._active += start
            return start

    def fail(self) -> None:
        """No more rows are to be taken (a read or a decode failed)."""
        with self._lock:
            self._failed = True

    def take(self, helper: bool) -> tuple[int, bytes, bytes] | None:
        """The next unclaimed row, else ``None`` (a helper that gets ``None`` has ended)."""
        with self._lock:
            if self._failed or self._claimed == len(self._records):
                self._active -= helper
                return None
            row, self._claimed = self._claimed, self._claimed + 1
            return (row, *self._records[row])


def _rows(feed: _RowFeed, cfg: _Config, seed: int, where: str, data: np.ndarray,
          helper: bool) -> _Done:
    """Decode unclaimed rows of the batch until none is left (threads that run slower, on a
    busy machine, simply take fewer rows).  A failure stops the other threads after their
    current image."""
    done: _Done = []
    try:
        while (item := feed.take(helper)) is not None:
            row, key, value = item
            done.append((row, *_one_image(value, cfg, _RowDraws(seed, row),
                                          f"{where}, key {key!r} (record {row} of the batch)",
                                          data[row])))
        return done
    except BaseException:
        feed.fail()
        raise


def _decode_batch(reader: DBReader, cfg: _Config, seed: int, where: str,
                  data: np.ndarray) -> _Done:
    """Read the batch's records and decode every row on ``decode_threads`` threads: up to
    ``decode_threads - 1`` pool helpers from the first records on, and the calling
    (prefetch) thread once it has read the batch.  Returns once no thread is writing into
    ``data``."""
    threads = max(1, min(cfg.threads, cfg.batch_size))
    feed = _RowFeed(helpers=threads - 1)
    pool = cfg.services.decode_pool(threads) if threads > 1 else None
    futures: list[concurrent.futures.Future[_Done]] = []
    try:
        try:
            for start in range(0, cfg.batch_size, _READ_CHUNK):
                helpers = feed.add(*reader.read_batch(min(_READ_CHUNK, cfg.batch_size - start)))
                futures += [pool.submit(_rows, feed, cfg, seed, where, data, True)
                            for _ in range(helpers)] if pool is not None else []
        except BaseException:
            feed.fail()
            raise
        done = _rows(feed, cfg, seed, where, data, helper=False)
    finally:
        for future in futures:
            future.cancel()  # still queued behind other ops' work: nothing is left for it
        concurrent.futures.wait(futures)
    for future in futures:
        if not future.cancelled():
            done.extend(future.result())
    return sorted(done, key=lambda item: item[0])


def _labels(records: list[ImageRecord], cfg: _Config, where: str) -> np.ndarray:
    dtype = records[0].label.dtype
    count = len(records)
    if cfg.label_type in (SINGLE_LABEL, SINGLE_LABEL_WEIGHTED):
        out = np.empty(count, dtype=dtype)
        for row, record in enumerate(records):
            if record.label.size < 1:
                raise DataInputError(f"{where}: record {row} has no label value.")
            out[row] = record.label[0]
        return out
    weighted = cfg.label_type == MULTI_LABEL_WEIGHTED_SPARSE
    out = np.zeros((count, cfg.num_labels), dtype=np.float32 if weighted else dtype)
    for row, record in enumerate(records):
        if cfg.label_type in (MULTI_LABEL_DENSE, EMBEDDING_LABEL):
            if record.label.size != cfg.num_labels:
                raise DataInputError(f"{where}: record {row} has {record.label.size} label "
                                     f"values, num_labels is {cfg.num_labels}.")
            out[row] = record.label
            continue
        indices = record.label.astype(np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= cfg.num_labels):
            raise DataInputError(f"{where}: record {row} has label indices outside "
                                 f"[0, {cfg.num_labels}).")
        if weighted:
            weights = record.weights if record.weights is not None else np.ones(indices.size)
            out[row, indices] = weights[:indices.size]
        else:
            out[row, indices] = 1
    return out


def _extras(records: list[ImageRecord], cfg: _Config, where: str) -> list[np.ndarray]:
    outputs = []
    for i, width in enumerate(cfg.output_sizes):
        out = np.zeros((len(records), width), dtype=records[0].extras[i].dtype)
        for row, record in enumerate(records):
            values = record.extras[i]
            if values.size != width:
                raise DataInputError(f"{where}: record {row}, additional output {i} has "
                                     f"{values.size} values, output_sizes says {width}.")
            out[row] = values
        outputs.append(out)
    return outputs


def _produce(reader: DBReader, cfg: _Config, batch_seed: int) -> list[np.ndarray]:
    where = f"ImageInput reading {reader.db.where()}"
    crop, channels = cfg.params.crop, cfg.params.channels
    data = cfg.services.batch_buffer((cfg.batch_size, crop, crop, channels),
                                     np.uint8 if cfg.gpu_transform else np.float32)
    done = _decode_batch(reader, cfg, batch_seed, where, data)
    records = [record for _, record, _ in done]
    errors = sum(failed for _, _, failed in done)
    if errors / cfg.batch_size > cfg.max_error_ratio:
        raise DataInputError(f"{where}: {errors} of {cfg.batch_size} images failed to decode, "
                             f"more than max_decode_error_ratio {cfg.max_error_ratio}.")
    if cfg.gpu_transform:
        data = _gpu_transform(data, cfg)
    return [data, _labels(records, cfg, where), *_extras(records, cfg, where)]


def _gpu_transform(data: np.ndarray, cfg: _Config) -> np.ndarray:
    """The GPU path's normalisation of uint8 NHWC crops: NCHW, FLOAT or FLOAT16."""
    batch, crop, _, channels = data.shape
    values = cfg.services.normalize(data.reshape(batch * crop, crop, channels), cfg.params)
    out = values.reshape(data.shape).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(out, dtype=np.float16 if cfg.output_float16 else np.float32)


# --- the op ------------------------------------------------------------------------------
def _reader(ctx: OpContext) -> DBReader:
    """The input reader, or the op instance's own reader of its ``db`` argument (opened at
    the first run, closed with the instance, as Caffe2's op owns it)."""
    if ctx.num_inputs:
        return reader_input(ctx)
    state = ctx.state()
    if "reader" not in state:
        source = ctx.str_arg("db", "")
        if not source:
            raise ArgumentError(ctx.describe("give a DB reader input (CreateDB) or the db "
                                             "argument."))
        state["reader"] = storage(ctx).reader(ctx.str_arg("db_type", "leveldb"), source)
    return state["reader"]


def _batch_seed(ctx: OpContext) -> int:
    return int(ctx.rng.integers(0, 2**63 - 1))


def _image_input_shape(op: Any, in_shapes: Any, in_types: Any) -> list[Any]:
    """Caffe2's schema claim: data ``[batch, crop, crop, C]`` FLOAT and label
    ``[1, batch]`` INT32 (the op really writes label ``(batch,)``)."""
    from dpgraph.ir.arguments import arguments_dict

    args = arguments_dict(op.arg)
    batch, crop = int(args.get("batch_size", 0)), int(args.get("crop", -1))
    channels = 3 if int(args.get("color", 1)) else 1
    return [((batch, crop, crop, channels), DT.FLOAT), ((1, batch), DT.INT32)] + \
        [None] * (len(op.output) - 2)


@register_op("ImageInput", inputs=(0, 1), outputs=(2, None), side_effects=True,
             shape=_image_input_shape)
def image_input(ctx: OpContext) -> Outputs:
    """Batches of decoded, cropped, normalised images with their labels (see module doc)."""
    state = ctx.state()
    if "config" not in state:  # parsing ~30 arguments costs ~0.1 ms, once per instance
        state["config"] = _config(ctx)
    cfg = state["config"]
    reader = _reader(ctx)
    if ctx.int_arg("no_prefetch", 0):
        outputs = _produce(reader, cfg, _batch_seed(ctx))
    else:
        outputs = prefetcher(ctx, reader).next(
            lambda seed: _produce(reader, cfg, seed), lambda: _batch_seed(ctx))
    return tuple(on_device(ctx, out) for out in outputs)


for _op_type in ("ImageInput",):
    register_gradient(_op_type)(no_gradient)
