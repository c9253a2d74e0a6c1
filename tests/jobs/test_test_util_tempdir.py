"""test_util.TestCase.make_tempdir and workspace.has_fbgemm (Caffe2 2021's load_save_test)."""

from __future__ import annotations

import unittest

from dpgraph import test_util, workspace


def test_make_tempdir_is_removed_after_the_test() -> None:
    made = []

    class Case(test_util.TestCase):
        def test_it(self) -> None:
            folder = self.make_tempdir()
            (folder / "x").write_text("1")
            made.append(folder)

    result = unittest.TextTestRunner(verbosity=0).run(Case("test_it"))
    assert result.wasSuccessful() and made and not made[0].exists()


def test_has_fbgemm() -> None:
    assert workspace.has_fbgemm is True and workspace.C.has_fbgemm is True
