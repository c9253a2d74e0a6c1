"""text_file_reader.TextFileReader and its ops: rows in batches over several passes, typed
columns, the empty batch that stops reading, and bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import ArgumentError, DataInputError
from dpgraph.jobs.schema import Scalar, Struct
from dpgraph.text_file_reader import TextFileReader


@pytest.fixture(autouse=True)
def _fresh() -> None:
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _read_all(path: Path, batch_size: int, num_passes: int) -> list[list[object]]:
    schema = Struct(("name", Scalar(dtype=str)), ("value", Scalar(dtype=np.float32)))
    init = core.Net("init")
    reader = TextFileReader(init, filename=str(path), schema=schema, batch_size=batch_size,
                            num_passes=num_passes)
    workspace.RunNetOnce(init)
    net = core.Net("read")
    should_stop, blobs = reader.read(net)
    names: list[object] = []
    values: list[object] = []
    sizes = []
    while True:
        workspace.RunNetOnce(net)
        batch = workspace.FetchBlob(blobs[0])
        sizes.append(len(batch))
        names.extend(batch.tolist())
        values.extend(workspace.FetchBlob(blobs[1]).tolist())
        if workspace.FetchBlob(should_stop):
            break
    assert workspace.FetchBlob(blobs[1]).dtype == np.float32
    return [names, values, sizes]


def test_batches_passes_and_stop(tmp_path: Path) -> None:
    path = tmp_path / "rows.tsv"
    path.write_text("a\t1.5\nb\t-2\nc\t0.25\n")
    names, values, sizes = _read_all(path, batch_size=2, num_passes=2)
    assert names == [b"a", b"b", b"c"] * 2
    assert values == [1.5, -2.0, 0.25] * 2
    assert sizes == [2, 2, 2, 0]  # the empty batch sets should_stop


def test_bad_rows_and_arguments(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    path.write_text("a\t1\nb\n")
    workspace.RunOperatorOnce(core.CreateOperator(
        "CreateTextFileReader", [], ["r"], filename=str(path),
        field_types=[core.DataType.STRING, core.DataType.FLOAT]))
    with pytest.raises(DataInputError, match="row 2"):
        workspace.RunOperatorOnce(core.CreateOperator(
            "TextFileReaderRead", ["r"], ["x", "y"], batch_size=5))
    with pytest.raises(ArgumentError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "CreateTextFileReader", [], ["r"], filename=str(path),
            field_types=[core.DataType.INT32]))
    with pytest.raises(DataInputError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "CreateTextFileReader", [], ["r"], filename=str(tmp_path / "missing"),
            field_types=[core.DataType.STRING]))
