"""ImageInput against an independent numpy reference (resizes by OpenCV's INTER_AREA, the call
Caffe2 makes), its randomness, label types, record formats, the GPU-transform path and
brew.image_input."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from _records import image_record, jpeg_bytes, write_lmdb

from dpgraph import brew, core, model_helper, workspace
from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto
MEAN, STD = (104.0, 117.0, 123.0), (57.0, 58.0, 59.0)


def _images(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [(40, 52), (52, 40), (36, 36), (48, 60)]
    return [rng.integers(0, 256, (*shapes[i % 4], 3), dtype=np.uint8) for i in range(count)]


def _reader(path: Path, name: str = "reader") -> None:
    workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], [name], db=str(path),
                                                  db_type="lmdb"))


def _image_input(outputs: list[str], **kwargs: object) -> None:
    workspace.RunOperatorOnce(core.CreateOperator("ImageInput", ["reader"], outputs, **kwargs))


def _reference(rgb: np.ndarray, scale: int, crop: int) -> np.ndarray:
    """INTER_AREA resize of the shorter side to ``scale``, centre crop, BGR, mean/std."""
    bgr = np.ascontiguousarray(rgb[:, :, ::-1])
    rows, cols = rgb.shape[:2]
    if rows > cols:
        size = (scale, int(rows * scale / cols))
    else:
        size = (int(cols * scale / rows), scale)
    if size != (cols, rows):
        bgr = cv2.resize(bgr, size, interpolation=cv2.INTER_AREA)
    pixels = bgr.astype(np.float32)
    y, x = (pixels.shape[0] - crop) // 2, (pixels.shape[1] - crop) // 2
    window = pixels[y:y + crop, x:x + crop]
    return (window - np.array(MEAN, np.float32)) / np.array(STD, np.float32)


def _area_average(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """Shrinking by true area averaging: each output pixel is the mean of the source over its
    footprint, fractional pixels weighted by their covered area."""
    def weights(source: int, target: int) -> np.ndarray:
        step = source / target
        edges = np.arange(source + 1, dtype=np.float64)
        low, high = np.arange(target)[:, None] * step, np.arange(1, target + 1)[:, None] * step
        return np.clip(np.minimum(edges[1:], high) - np.maximum(edges[:-1], low), 0, None)
    rows, cols = weights(pixels.shape[0], height), weights(pixels.shape[1], width)
    total = np.einsum("ij,kl,jlc->ikc", rows, cols, pixels.astype(np.float64))
    return total / (rows.sum(1)[:, None, None] * cols.sum(1)[None, :, None])


@pytest.mark.parametrize("scale", [36, 30, 44])
def test_test_mode_matches_reference(tmp_path: Path, scale: int) -> None:
    images = _images(4)
    write_lmdb(tmp_path / "db", [image_record(jpeg_bytes(im, "PNG"), i) for i, im in
                                 enumerate(images)])
    _reader(tmp_path / "db")
    _image_input(["data", "label"], batch_size=4, scale=scale, crop=28, is_test=1,
                 mean_per_channel=list(MEAN), std_per_channel=list(STD), decode_threads=2)
    data, label = workspace.FetchBlob("data"), workspace.FetchBlob("label")
    assert data.shape == (4, 28, 28, 3) and data.dtype == np.float32
    assert label.shape == (4,) and label.dtype == np.int32
    np.testing.assert_array_equal(label, [0, 1, 2, 3])
    for got, rgb in zip(data, images):
        np.testing.assert_allclose(got, _reference(rgb, scale, 28), atol=1e-5)


def test_shrinking_is_area_averaging_not_pillow_box(tmp_path: Path) -> None:
    """Caffe2 shrinks with cv::resize INTER_AREA: a true area average (Pillow's BOX filter
    only averages the pixels whose centres fall in the footprint, and differs by up to 150
    levels on noise at fractional factors)."""
    rgb = _images(1)[0][:40, :52]  # 40 rows: scale 30 shrinks by 4/3
    write_lmdb(tmp_path / "db", [image_record(jpeg_bytes(rgb, "PNG"), 0)])
    _reader(tmp_path / "db")
    _image_input(["d", "l"], batch_size=1, scale=30, crop=30, is_test=1)
    expected = _area_average(rgb[:, :, ::-1], 30, 39)[:, 4:34]
    np.testing.assert_allclose(workspace.FetchBlob("d")[0], expected, atol=1.0)


def test_no_resize_is_exact_pixels(tmp_path: Path) -> None:
    rgb = _images(1)[0][:36, :36]
    write_lmdb(tmp_path / "db", [image_record(jpeg_bytes(rgb, "PNG"), 7)])
    _reader(tmp_path / "db")
    _image_input(["data", "label"], batch_size=2, scale=36, crop=30, is_test=1, mean=10.0,
                 std=2.0)
    expected = (rgb[3:33, 3:33, ::-1].astype(np.float32) - 10.0) / 2.0
    for got in workspace.FetchBlob("data"):  # one record: the batch wraps around
        np.testing.assert_allclose(got, expected, atol=1e-5)


def _windows(rgb: np.ndarray, crop: int) -> set[bytes]:
    bgr = rgb[:, :, ::-1]
    out = set()
    for y in range(bgr.shape[0] - crop + 1):
        for x in range(bgr.shape[1] - crop + 1):
            window = np.ascontiguousarray(bgr[y:y + crop, x:x + crop])
            out.add(window.tobytes())
            out.add(np.ascontiguousarray(window[:, ::-1]).tobytes())
    return out


def _train_batches(tmp_path: Path, seed: int, runs: int) -> list[np.ndarray]:
    workspace.ResetWorkspace()
    _reader(tmp_path / "db")
    op = core.CreateOperator("ImageInput", ["reader"], ["data", "label"], batch_size=4,
                             scale=24, crop=16, mirror=1, is_test=0,
                             device_option=core.DeviceOption(caffe2_pb2.CPU, 0,
                                                             random_seed=seed))
    net = core.Net("train_input")
    net.Proto().op.extend([op])
    workspace.CreateNet(net)
    batches = []
    for _ in range(runs):
        workspace.RunNet(net)
        batches.append(workspace.FetchBlob("data"))
    return batches


def test_random_crops_in_bounds_seeded_and_varying(tmp_path: Path) -> None:
    images = [im[:24, :24] for im in _images(4)]
    write_lmdb(tmp_path / "db", [image_record(jpeg_bytes(im, "PNG"), i) for i, im in
                                 enumerate(images)])
    first = _train_batches(tmp_path, 5, 3)
    again = _train_batches(tmp_path, 5, 3)
    other = _train_batches(tmp_path, 6, 3)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other))
    assert not np.array_equal(first[0], first[1])  # same records, new crops
    windows = [_windows(im, 16) for im in images]
    for batch in first:
        for row, crop in enumerate(batch):
            assert crop.astype(np.uint8).tobytes() in windows[row]


def test_label_types_and_additional_outputs(tmp_path: Path) -> None:
    rgb = _images(1)[0][:20, :20]
    protos = caffe2_pb2.TensorProtos()
    image = protos.protos.add(data_type=DT.STRING)
    image.string_data.append(jpeg_bytes(rgb, "PNG"))
    protos.protos.add(data_type=DT.INT32, int32_data=[1, 3])
    protos.protos.add(data_type=DT.FLOAT, float_data=[0.5, 0.25])
    protos.protos.add(data_type=DT.INT64, int64_data=[9, 8])
    write_lmdb(tmp_path / "db", [protos.SerializeToString()])
    _reader(tmp_path / "db")
    _image_input(["d", "l", "x"], batch_size=2, scale=20, crop=20, is_test=1, label_type=3,
                 num_labels=5, output_sizes=[2])
    np.testing.assert_allclose(workspace.FetchBlob("l"), [[0, .5, 0, .25, 0]] * 2)
    assert workspace.FetchBlob("x").dtype == np.int64
    np.testing.assert_array_equal(workspace.FetchBlob("x"), [[9, 8], [9, 8]])
    _image_input(["d", "l"], batch_size=1, scale=20, crop=20, is_test=1, label_type=1,
                 num_labels=5)
    np.testing.assert_array_equal(workspace.FetchBlob("l"), [[0, 1, 0, 1, 0]])
    assert workspace.FetchBlob("l").dtype == np.int32


def test_raw_byte_images_bounding_box_and_caffe_datum(tmp_path: Path) -> None:
    bgr = _images(1)[0][:30, :30]
    protos = caffe2_pb2.TensorProtos()
    protos.protos.add(data_type=DT.BYTE, dims=[30, 30, 3], byte_data=bgr.tobytes())
    protos.protos.add(data_type=DT.FLOAT, float_data=[2.5])
    protos.protos.add(data_type=DT.INT32, int32_data=[2, 4, 20, 20])  # ymin, xmin, h, w
    write_lmdb(tmp_path / "db", [protos.SerializeToString()])
    _reader(tmp_path / "db")
    _image_input(["d", "l"], batch_size=1, scale=20, crop=20, is_test=1)
    np.testing.assert_array_equal(workspace.FetchBlob("d")[0], bgr[2:22, 4:24])
    assert workspace.FetchBlob("l").dtype == np.float32
    datum = _caffe_datum(bgr[:, :, :].transpose(2, 0, 1).tobytes(), 3, 30, 30, label=6)
    write_lmdb(tmp_path / "datum", [datum])
    _reader(tmp_path / "datum")
    _image_input(["d", "l"], batch_size=1, scale=30, crop=30, is_test=1, use_caffe_datum=1)
    np.testing.assert_array_equal(workspace.FetchBlob("d")[0], bgr)
    assert workspace.FetchBlob("l").tolist() == [6]


def _caffe_datum(data: bytes, channels: int, height: int, width: int, label: int) -> bytes:
    def varint(value: int) -> bytes:
        out = b""
        while True:
            byte, value = value & 0x7F, value >> 7
            out += bytes([byte | (0x80 if value else 0)])
            if not value:
                return out

    return (b"\x08" + varint(channels) + b"\x10" + varint(height) + b"\x18" + varint(width)
            + b"\x22" + varint(len(data)) + data + b"\x28" + varint(label))


def test_argument_checks_and_bad_records(tmp_path: Path) -> None:
    protos = caffe2_pb2.TensorProtos()
    protos.protos.add(data_type=DT.UINT8, dims=[2, 2], int32_data=[1, 2, 3, 4])
    protos.protos.add(data_type=DT.INT32, int32_data=[0])
    write_lmdb(tmp_path / "db", [protos.SerializeToString()])
    _reader(tmp_path / "db")
    with pytest.raises(RuntimeError, match="one and only one of scaling or minsize"):
        _image_input(["d", "l"], batch_size=1, scale=4, minsize=4, crop=2, is_test=1)
    with pytest.raises(RuntimeError, match="Unknown image data type"):
        _image_input(["d", "l"], batch_size=1, scale=4, crop=2, is_test=1, no_prefetch=1)
    with pytest.raises(RuntimeError, match="Batch size"):
        _image_input(["d", "l"], scale=4, crop=2, is_test=1)


def test_decode_failures_become_zero_images(tmp_path: Path) -> None:
    write_lmdb(tmp_path / "db", [image_record(b"not an image", 1)])
    _reader(tmp_path / "db")
    _image_input(["d", "l"], batch_size=1, scale=224, crop=200, is_test=1, mean=1.0)
    np.testing.assert_array_equal(workspace.FetchBlob("d"), np.full((1, 200, 200, 3), -1.0))
    with pytest.raises(RuntimeError, match="failed to decode"):
        _image_input(["d", "l"], batch_size=1, scale=224, crop=200, is_test=1,
                     max_decode_error_ratio=0.5, no_prefetch=1)


def test_prefetch_delivers_the_synchronous_sequence(tmp_path: Path) -> None:
    images = _images(5)
    write_lmdb(tmp_path / "db", [image_record(jpeg_bytes(im), i) for i, im in
                                 enumerate(images)])
    labels = {}
    for prefetch in (0, 1):
        workspace.ResetWorkspace()
        _reader(tmp_path / "db")
        net = core.Net(f"n{prefetch}")
        net.ImageInput(["reader"], ["d", "l"], batch_size=3, scale=32, crop=32, is_test=1,
                       no_prefetch=1 - prefetch, decode_threads=1)
        workspace.CreateNet(net)
        got = []
        for _ in range(4):
            workspace.RunNet(net)
            got.extend(workspace.FetchBlob("l").tolist())
        labels[prefetch] = got
    assert labels[0] == labels[1] == [int(k) for k in sorted(map(str, range(5)))] * 2 + \
        [int(k) for k in sorted(map(str, range(5)))][:2]


def test_each_op_instance_owns_the_reader_of_its_db_argument(tmp_path: Path) -> None:
    """Caffe2's old-style ImageInput (no reader input) opens its own reader: every new
    instance starts at the first record, and drops its prefetched batch when it goes."""
    write_lmdb(tmp_path / "db", [image_record(jpeg_bytes(im), i) for i, im in
                                 enumerate(_images(6))])
    op = core.CreateOperator("ImageInput", [], ["d", "l"], batch_size=2, scale=32, crop=32,
                             is_test=1, db=str(tmp_path / "db"), db_type="lmdb")
    for _ in range(2):
        workspace.RunOperatorOnce(op)
        assert workspace.FetchBlob("l").tolist() == [0, 1]
    assert workspace.RunOperatorMultiple(op, 3)
    assert workspace.FetchBlob("l").tolist() == [4, 5]


def test_gpu_transform_on_virtual_gpu(tmp_path: Path) -> None:
    rgb = _images(1)[0][:20, :20]
    write_lmdb(tmp_path / "db", [image_record(jpeg_bytes(rgb, "PNG"), 3)])
    workspace.SetVirtualGpus(1)
    _reader(tmp_path / "db")
    workspace.RunOperatorOnce(core.CreateOperator(
        "ImageInput", ["reader"], ["d", "l"], batch_size=2, scale=20, crop=20, is_test=1,
        use_gpu_transform=1, output_type="float16", mean=128.0, std=128.0,
        device_option=core.DeviceOption(caffe2_pb2.CUDA, 0)))
    data = workspace.FetchBlob("d")
    assert data.shape == (2, 3, 20, 20) and data.dtype == np.float16
    expected = (rgb[:, :, ::-1].astype(np.float32).transpose(2, 0, 1) - 128) / 128
    np.testing.assert_allclose(data[0], expected, atol=1e-3)


def test_brew_image_input_adds_nhwc2nchw(tmp_path: Path) -> None:
    rgb = _images(1)[0][:20, :20]
    write_lmdb(tmp_path / "db", [image_record(jpeg_bytes(rgb, "PNG"), 1)])
    model = model_helper.ModelHelper(name="img")
    reader = model.CreateDB("reader", db=str(tmp_path / "db"), db_type="lmdb")
    with pytest.raises(AssertionError, match="is_test"):
        brew.image_input(model, reader, ["data", "label"], batch_size=1, scale=20, crop=20)
    data, label = brew.image_input(model, reader, ["data", "label"], batch_size=2, scale=20,
                                   crop=20, is_test=1)
    assert [op.type for op in model.net.Proto().op] == ["ImageInput", "NHWC2NCHW"]
    assert model.net.Proto().op[0].output[0] == "data_nhwc" and str(data) == "data"
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("data").shape == (2, 3, 20, 20)
    np.testing.assert_array_equal(workspace.FetchBlob("data")[0],
                                  workspace.FetchBlob("data_nhwc")[0].transpose(2, 0, 1))
    with pytest.raises(NotImplementedError):
        brew.video_input(model, reader, ["v"])




def test_resnet50_trainer_style_input_on_virtual_gpus(tmp_path: Path) -> None:
    """resnet50_trainer's input builder: one shared reader of CaffeDatum records,
    brew.image_input with use_gpu_transform on each GPU, StopGradient, Parallelize."""
    from dpgraph import data_parallel_model, optimizer

    records = []
    for j, rgb in enumerate(_images(8)):
        encoded = jpeg_bytes(rgb)
        records.append(_caffe_datum(encoded, 3, rgb.shape[0], rgb.shape[1], j % 2)
                       + b"\x38\x01")  # encoded = true
    write_lmdb(tmp_path / "db", records)
    workspace.SetVirtualGpus(2)
    model = model_helper.ModelHelper(name="resnet_like")
    reader = model.CreateDB("reader", db=str(tmp_path / "db"), db_type="lmdb")

    def add_image_input(m: model_helper.ModelHelper) -> None:
        data, _ = brew.image_input(
            m, reader, ["data", "label"], batch_size=4, output_type="float",
            use_gpu_transform=True, use_caffe_datum=True, mean_per_channel=None,
            std_per_channel=None, mean=128.0, std=128.0, scale=36, crop=32, mirror=1,
            is_test=False)
        m.StopGradient(data, data)

    def forward(m: model_helper.ModelHelper, loss_scale: float) -> list:
        pool = brew.average_pool(m, "data", "pool", kernel=32)
        fc = brew.fc(m, pool, "fc", dim_in=3, dim_out=2)
        _, loss = m.net.SoftmaxWithLoss([fc, "label"], ["softmax", "loss"])
        return [m.net.Scale(loss, "scaled_loss", scale=loss_scale)]

    data_parallel_model.Parallelize(model, add_image_input, forward,
                                    optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.1),
                                    devices=[0, 1])
    data_parallel_model.RunInitNet(model)
    data_parallel_model.RunNet(model, 2)
    data = workspace.FetchBlob("gpu_1/data")
    assert data.shape == (4, 3, 32, 32) and data.dtype == np.float32
    assert workspace.FetchBlob("gpu_0/label").dtype == np.int32
    assert np.abs(data).max() <= 1.0


def test_gray_output_and_per_channel_means(tmp_path: Path) -> None:
    rgb = _images(1)[0][:24, :24]
    write_lmdb(tmp_path / "db", [image_record(jpeg_bytes(rgb, "PNG"), 0)])
    _reader(tmp_path / "db")
    _image_input(["d", "l"], batch_size=1, scale=24, crop=24, is_test=1, color=0, mean=5.0)
    gray = cv2.cvtColor(np.ascontiguousarray(rgb[:, :, ::-1]), cv2.COLOR_BGR2GRAY)
    np.testing.assert_allclose(workspace.FetchBlob("d")[0, :, :, 0],
                               gray.astype(np.float32) - 5.0, atol=1.0)
    _image_input(["d", "l"], batch_size=1, scale=24, crop=20, is_test=1,
                 mean_per_channel=[1.0, 2.0, 3.0], std_per_channel=[2.0, 4.0, 8.0])
    bgr = rgb[2:22, 2:22, ::-1].astype(np.float32)
    expected = (bgr - np.array([1.0, 2.0, 3.0], np.float32)) / np.array([2.0, 4.0, 8.0],
                                                                        np.float32)
    np.testing.assert_allclose(workspace.FetchBlob("d")[0], expected, atol=1e-5)


def test_resize_modes_jitter_and_lighting(tmp_path: Path) -> None:
    rgb = _images(1)[0][:20, :30]  # 20 rows, 30 columns
    write_lmdb(tmp_path / "db", [image_record(jpeg_bytes(rgb, "PNG"), 0)])
    _reader(tmp_path / "db")
    _image_input(["d", "l"], batch_size=1, scale=16, crop=16, is_test=1, warp=1)
    warped = _area_average(rgb[:, :, ::-1], 16, 16)
    np.testing.assert_allclose(workspace.FetchBlob("d")[0], warped, atol=1.0)
    _image_input(["d", "l"], batch_size=1, minsize=24, crop=24, is_test=1)  # upscales
    assert workspace.FetchBlob("d").shape == (1, 24, 24, 3)
    _image_input(["d", "l"], batch_size=1, minsize=20, crop=20, is_test=1)  # no resize
    np.testing.assert_array_equal(workspace.FetchBlob("d")[0], rgb[:, 5:25, ::-1])
    _image_input(["d", "l"], batch_size=1, minsize=16, crop=16, is_test=1)  # never shrinks
    np.testing.assert_array_equal(workspace.FetchBlob("d")[0], rgb[2:18, 7:23, ::-1])
    for kwargs in ({"color_jitter": 1, "color_lighting": 1}, {"scale_jitter_type": 1},
                   {"random_scale": [20, 28]}):
        _image_input(["d", "l"], batch_size=2, scale=-1 if "random_scale" in kwargs else 20,
                     crop=16, is_test=0, **kwargs)
        data = workspace.FetchBlob("d")
        assert data.shape == (2, 16, 16, 3) and np.isfinite(data).all()
    with pytest.raises(RuntimeError, match="crop must be"):
        _image_input(["d", "l"], batch_size=1, scale=10, crop=16, is_test=1)
