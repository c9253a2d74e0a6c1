"""The per-image pixel steps of ImageInput's pipeline (dpgraph.data.image) against plain
numpy: decoding, crop windows and mirroring, and the mean/std normalisation."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph.data import image
from dpgraph.data.records import ImageRecord


def _rgb(rows: int, cols: int) -> np.ndarray:
    return np.random.default_rng(rows * 100 + cols).integers(0, 256, (rows, cols, 3),
                                                             dtype=np.uint8)


class _Fixed:
    """Draws that answer the same uniform value every time."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value

    def integers(self, low: int, high: int) -> int:
        return min(low + int(self.value * (high - low)), high - 1)


@pytest.mark.parametrize("crop", [1, 5, 7, 16])
@pytest.mark.parametrize("draw", [0.0, 0.3, 0.99])  # offsets and mirror (< 0.5) follow it
@pytest.mark.parametrize("channels", [1, 3])
def test_crop_window_and_mirror_match_numpy(crop: int, draw: float, channels: int) -> None:
    pixels = _rgb(19, 23)[:, :, :channels]
    params = image.ImageParams(crop=crop, scale=19, mirror=True, channels=channels)
    got = image.crop_pixels(pixels, params, _Fixed(draw))  # type: ignore[arg-type]
    x, y = _Fixed(draw).integers(0, 23 - crop + 1), _Fixed(draw).integers(0, 19 - crop + 1)
    window = pixels[y:y + crop, x:x + crop]
    np.testing.assert_array_equal(got, window[:, ::-1] if draw < 0.5 else window)
    assert got.dtype == np.uint8 and got.shape == (crop, crop, channels)


def test_decode_gives_bgr_or_gray_and_converts_raw_pixels() -> None:
    from _records import jpeg_bytes

    rgb = _rgb(9, 11)
    bgr = image.decode(ImageRecord(encoded=jpeg_bytes(rgb, "PNG")), 3)
    np.testing.assert_array_equal(bgr, rgb[:, :, ::-1])
    gray = image.decode(ImageRecord(encoded=jpeg_bytes(rgb, "PNG")), 1)
    assert gray.shape == (9, 11, 1)
    raw = image.decode(ImageRecord(pixels=np.ascontiguousarray(rgb[:, :, ::-1])), 1)
    np.testing.assert_allclose(raw[:, :, 0], rgb @ np.array([0.299, 0.587, 0.114]), atol=1)
    np.testing.assert_allclose(raw, gray, atol=1)  # imdecode and cvtColor round apart
    with pytest.raises(ValueError, match="could not decode"):
        image.decode(ImageRecord(encoded=b"not an image"), 3)


@pytest.mark.parametrize("mean,std", [((0.0,) * 3, (1.0,) * 3), ((128.0,) * 3, (64.0,) * 3),
                                      ((104.0, 117.5, 123.25), (57.0, 58.5, 0.3))])
def test_normalize_is_exact_per_channel(mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    params = image.ImageParams(crop=7, scale=7, mean=mean, std=std)
    pixels = _rgb(7, 7)
    expected = ((pixels.astype(np.float32) - np.array(mean, np.float32))
                * (np.float32(1) / np.array(std, np.float32)))
    batch = np.full((2, 7, 7, 3), np.nan, np.float32)
    image.normalize(pixels, params, batch[1])
    np.testing.assert_array_equal(batch[1], expected)  # bit-exact, written in place
    assert np.isnan(batch[0]).all()
    np.testing.assert_array_equal(image.normalize(pixels.astype(np.float32), params), expected)
    strided = np.empty((7, 14, 3), np.float32)[:, ::2]
    np.testing.assert_array_equal(image.normalize(pixels, params, strided), expected)


def test_normalize_in_row_blocks_matches_one_pass() -> None:
    params = image.ImageParams(crop=300, scale=300, mean=(104.0, 117.0, 123.0),
                               std=(57.0, 58.0, 59.0))
    pixels = np.random.default_rng(2).integers(0, 256, (601, 300, 3), dtype=np.uint8)
    expected = ((pixels.astype(np.float32) - np.array(params.mean, np.float32))
                * (np.float32(1) / np.array(params.std, np.float32)))
    assert expected.nbytes > 3 * image._BLOCK_BYTES  # several blocks, the last one shorter
    np.testing.assert_array_equal(image.normalize(pixels, params), expected)
    np.testing.assert_array_equal(image.normalize(pixels.astype(np.float32), params), expected)


def test_row_draws_follow_the_seed_and_row() -> None:
    from dpgraph.ops.image_input import _RowDraws

    def stream(seed: int, row: int) -> list[float]:
        draws = _RowDraws(seed, row)
        return [draws.random() for _ in range(50)]

    assert stream(3, 0) == stream(3, 0)
    others = [stream(3, 1), stream(4, 0), stream(2**63 - 2, 0), stream(2**63 - 1, 0)]
    assert all(not set(stream(3, 0)) & set(other) for other in others)  # no shared values
    values = np.array([x for row in range(40) for x in stream(7, row)])
    assert ((0.0 <= values) & (values < 1.0)).all()
    assert abs(values.mean() - 0.5) < 0.02 and abs(values.var() - 1 / 12) < 0.01
    draws = _RowDraws(5, 0)
    assert {draws.integers(2, 5) for _ in range(200)} == {2, 3, 4}
    assert sorted(draws.permutation(6)) == list(range(6))
    assert 0.25 <= draws.uniform(0.25, 0.5) < 0.5
    normals = draws.normal(1.0, 2.0, size=4000)
    assert abs(normals.mean() - 1.0) < 0.1 and abs(normals.std() - 2.0) < 0.1


def test_gpu_transform_per_channel_float_is_exact(tmp_path) -> None:
    from _records import image_record, jpeg_bytes, write_lmdb

    from dpgraph import core, workspace
    from dpgraph.proto import caffe2_pb2

    rgb = _rgb(20, 20)
    write_lmdb(tmp_path / "db", [image_record(jpeg_bytes(rgb, "PNG"), 3)])
    workspace.SetVirtualGpus(1)
    workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["reader"],
                                                  db=str(tmp_path / "db"), db_type="lmdb"))
    mean, std = [104.0, 117.0, 123.5], [57.0, 58.5, 59.0]
    workspace.RunOperatorOnce(core.CreateOperator(
        "ImageInput", ["reader"], ["d", "l"], batch_size=2, scale=20, crop=20, is_test=1,
        use_gpu_transform=1, mean_per_channel=mean, std_per_channel=std,
        device_option=core.DeviceOption(caffe2_pb2.CUDA, 0)))
    data = workspace.FetchBlob("d")
    expected = ((rgb[:, :, ::-1].astype(np.float32) - np.array(mean, np.float32))
                * (np.float32(1) / np.array(std, np.float32))).transpose(2, 0, 1)
    assert data.shape == (2, 3, 20, 20) and data.dtype == np.float32
    np.testing.assert_array_equal(data[1], expected)


def test_missing_opencv_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from dpgraph.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "cv2", None)  # what an absent package looks like
    image.opencv.cache_clear()
    try:
        with pytest.raises(MissingDependencyError, match="pip install opencv-python-headless"):
            image.augment(ImageRecord(encoded=b"\xff\xd8"), image.ImageParams(crop=4, scale=4),
                          np.random.default_rng(0))
    finally:
        image.opencv.cache_clear()
