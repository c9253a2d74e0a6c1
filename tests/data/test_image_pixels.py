"""The per-image pixel steps of ImageInput's pipeline (dpgraph.data.image) against plain
numpy: window packing, mirroring for every row width, and the mean/std normalisation."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from dpgraph.data import image


def _rgb(rows: int, cols: int) -> np.ndarray:
    return np.random.default_rng(rows * 100 + cols).integers(0, 256, (rows, cols, 3),
                                                             dtype=np.uint8)


@pytest.mark.parametrize("crop", [1, 5, 6, 7, 8, 12, 16])  # row bytes: odd, 2, 4, 8 | 3*crop
@pytest.mark.parametrize("mirror", [False, True])
def test_bgr_crop_matches_numpy_window(crop: int, mirror: bool) -> None:
    rgb = _rgb(19, 23)
    x, y = 23 - crop - 1, 2
    got = image.bgr_crop(Image.fromarray(rgb), x, y, crop, mirror)
    window = rgb[y:y + crop, x:x + crop, ::-1]
    np.testing.assert_array_equal(got, window[:, ::-1] if mirror else window)
    assert got.dtype == np.uint8 and got.flags.c_contiguous


@pytest.mark.parametrize("mirror", [False, True])
def test_bgr_crop_gray(mirror: bool) -> None:
    gray = _rgb(11, 13)[:, :, 0]
    got = image.bgr_crop(Image.fromarray(gray), 3, 1, 9, mirror)
    window = gray[1:10, 3:12]
    np.testing.assert_array_equal(got[:, :, 0], window[:, ::-1] if mirror else window)
    assert got.shape == (9, 9, 1)


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
    pixels = np.random.default_rng(2).integers(0, 256, (301, 300, 3), dtype=np.uint8)
    expected = ((pixels.astype(np.float32) - np.array(params.mean, np.float32))
                * (np.float32(1) / np.array(params.std, np.float32)))
    assert expected.nbytes > 3 * image._BLOCK_BYTES  # several blocks, the last one shorter
    np.testing.assert_array_equal(image.normalize(pixels, params), expected)
    np.testing.assert_array_equal(image.normalize(pixels.astype(np.float32), params), expected)


def test_row_draws_follow_the_seed_and_spill_over() -> None:
    from dpgraph.ops.image_input import _draws_per_image, _row_draws

    params = image.ImageParams(crop=8, scale=8, mirror=True, color_jitter=True,
                               color_lighting=True)
    uniforms = _draws_per_image(params)[0]
    assert _draws_per_image(params) == (8, 3)
    assert _draws_per_image(image.ImageParams(crop=8, scale=8, is_test=True,
                                              color_jitter=True)) == (3, 0)
    first, again, other = (_row_draws(3, 2, params), _row_draws(3, 2, params),
                           _row_draws(4, 2, params))

    def take(draws: object) -> list[float]:
        values = [draws.random() for _ in range(uniforms + 5)]  # past the pre-drawn block
        return values + [draws.integers(2, 5), *draws.permutation(4)] + \
            list(draws.normal(1.0, 2.0, size=5))  # past the 3 pre-drawn normals

    rows = [take(d) for d in first]
    assert rows == [take(d) for d in again]
    assert rows != [take(d) for d in other] and rows[0] != rows[1]
    assert all(0.0 <= v < 1.0 for v in rows[0][:uniforms + 5])
    draws = _row_draws(5, 1, params)[0]
    assert all(2 <= draws.integers(2, 5) < 5 for _ in range(200))
    assert sorted(draws.permutation(6)) == list(range(6))
    assert 0.0 <= draws.uniform(0.25, 0.5) < 0.5


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
