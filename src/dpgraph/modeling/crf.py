"""A linear-chain CRF loss layer built from existing ops (Caffe2's ``caffe2.python.crf``),
and the Viterbi re-ranking of predictions (``caffe2.python.crf_predict``).

Tags are padded with two extra states, BOS (``num_classes``) and EOS
(``num_classes + 1``); predictions get a BOS row on top, an EOS row at the bottom and two
very low (-1000) columns.  The loss of one sequence (batch size 1, as in Caffe2: the
forward recursion runs in a RecurrentNetwork op over ``T x 1 x D`` inputs) is::

    logsumexp over all paths (forward recursion)  -  score of the labelled path

where a path's score sums its prediction entries and the ``transitions[a][b]`` of each
step ``a -> b``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.blob import ScopedBlobReference
from dpgraph.modeling.brew import brew
from dpgraph.modeling.model_helper import ModelHelper
from dpgraph.modeling.rnn.recurrent import recurrent_net
from dpgraph.proto import caffe2_pb2

LOW_SCORE = -1000.0  # the score of an impossible (padding) tag
_INT32 = caffe2_pb2.TensorProto.INT32


def _padding_row(num_classes: int, hot: int) -> np.ndarray:
    """One ``[1, num_classes + 2]`` row: LOW_SCORE everywhere but 0 at column ``hot``."""
    row = np.full((1, num_classes + 2), LOW_SCORE, np.float32)
    row[0, hot] = 0.0
    return row


class CRFWithLoss:
    """The CRF layer of ``model``: ``transitions`` is a ``(num_classes + 2)`` square
    parameter (a UniformFill(-1, 1) ``crf_transitions`` when no blob is given)."""

    def __init__(self, model: Any, num_classes: int, transitions_blob: Any = None) -> None:
        self.model = model
        self.num_classes = num_classes
        self.num_classes_padded = num_classes + 2
        if not transitions_blob:
            transitions_blob = model.param_init_net.UniformFill(
                [], [ScopedBlobReference("crf_transitions")],
                shape=[self.num_classes_padded, self.num_classes_padded], min=-1.0, max=1.0)
        self.transitions = transitions_blob
        self.model.params.append(self.transitions)

    # --- the loss ---------------------------------------------------------------------------
    def crf_loss(self, predictions: Any, labels: Any, seq_lengths: Any = None) -> Any:
        """The scalar ``crf_loss`` blob: all-paths score minus the labelled path's score."""
        net = self.model.net
        # The transitions may be updated while the net runs (parallel updates): read a copy.
        snapshot = net.Copy(self.transitions, ScopedBlobReference("transitions_snapshot"))
        unary = self._gather_entries_sum(predictions, labels, self.num_classes)
        padded = CRFWithLoss.pad_predictions(predictions, self.model.param_init_net, net,
                                             self.num_classes)
        padded_labels = CRFWithLoss.pad_labels(labels, self.model.param_init_net, net,
                                               self.num_classes)
        binary = self._path_binary_scores(padded_labels, snapshot, seq_lengths)
        path_total = net.Add([binary, unary], ScopedBlobReference("path_total"))
        all_paths = self._all_paths_score(padded, snapshot)
        return net.Sub([all_paths, path_total], ScopedBlobReference("crf_loss"))

    def _all_paths_score(self, padded: Any, snapshot: Any) -> Any:
        """logsumexp over every path through the padded predictions."""
        net = self.model.net
        zero_index = self.model.param_init_net.ConstantFill([], shape=[1], value=0)
        initial = net.Gather([padded, zero_index], ScopedBlobReference("rnn_initial"),
                             dense_gradient=True)
        steps, _ = net.RemovePadding([padded], padding_width=1, end_padding_width=0,
                                     outputs=2)
        steps = net.ExpandDims([steps], ScopedBlobReference("rnn_input_data"), dims=[1])
        # RecurrentNetwork's gradient needs a blob of its own for the transitions.
        transitions = net.Copy(snapshot, ScopedBlobReference("transitions_copy"))
        return self._crf_forward(steps, initial, transitions)

    def _path_binary_scores(self, labels: Any, transitions: Any,
                            seq_lengths: Any = None) -> Any:
        """Sum of ``transitions[labels[t]][labels[t + 1]]`` (a 1-D Gather on the flattened
        matrix at ``row * D + column``)."""
        net = self.model.net
        columns, _ = net.RemovePadding([labels], outputs=2, padding_width=1,
                                       end_padding_width=0)
        rows, _ = net.RemovePadding([labels], outputs=2, padding_width=0, end_padding_width=1)
        width = net.ConstantFill([rows], value=self.num_classes_padded)
        flat_ids = net.Add([net.Mul([rows, width]), columns])
        flat_transitions = net.FlattenToVec([transitions])
        entries = net.Gather([flat_transitions, flat_ids], dense_gradient=True)
        return self.model.ReduceFrontSum(entries)

    def _gather_entries_sum(self, in_data: Any, indices: Any, index_size: int) -> Any:
        """Sum over rows of ``in_data[t][indices[t]]`` (a one-hot dot product)."""
        net = self.model.net
        indices = net.Cast([indices], to="int64")
        size = self.model.param_init_net.ConstantFill([], shape=[1], value=index_size)
        one_hot = net.OneHot([indices, size])
        scores = net.DotProduct([net.FlattenToVec(one_hot), net.FlattenToVec(in_data)])
        return net.ReduceFrontSum([scores])

    def _crf_forward(self, input_blob: Any, initial_state: Any, transitions_copy: Any,
                     seq_lengths: Any = None) -> Any:
        """The forward recursion's last state, reduced by logsumexp to a scalar."""
        net = self.model.net
        last = self.build_crf_net(input_blob, initial_state, transitions_copy)
        last, _ = net.Reshape([last], outputs=2, shape=(self.num_classes_padded,))
        one_segment = self.model.param_init_net.ConstantFill(
            [], value=0, shape=[self.num_classes_padded], dtype=_INT32)
        total = net.SortedSegmentRangeLogSumExp([last, one_segment])
        total, _ = net.Reshape(total, outputs=2, shape=())
        return total

    def build_crf_net(self, input_blob: Any, initial_state: Any, transitions: Any) -> Any:
        """Add the ``crf_net`` RecurrentNetwork op over ``input_blob`` (``T x 1 x D``, batch
        size 1) and return its last state: ``state_t[j] = logsumexp_i(state_{t-1}[i] +
        input_t[j] + transitions[i][j])``."""

        def scoped(name: str) -> str:
            return f"crf_net/{name}"

        step = ModelHelper(name="crf_step", param_model=self.model)
        input_t, cell_t_prev, _ = step.net.AddExternalInputs(  # type: ignore[attr-defined]
            ScopedBlobReference("input_t"), ScopedBlobReference("cell_t_prev"), transitions)
        one_segment = step.param_init_net.ConstantFill(
            [], [scoped("zero_segment_id")], value=0, shape=[self.num_classes_padded],
            dtype=_INT32)
        # Listed as an output so the step net's init blob is visible outside (as in Caffe2).
        step.param_init_net.AddExternalOutput(one_segment)
        cell_t = self._crf_step(step, input_t, cell_t_prev, transitions, one_segment, scoped)
        step.net.AddExternalOutputs(cell_t)
        _, last = recurrent_net(
            net=self.model.net, cell_net=step.net, inputs=[(input_t, input_blob)],
            initial_cell_inputs=[(cell_t_prev, initial_state)],
            links={cell_t_prev: cell_t}, scope="crf_net", outputs_with_grads=(1,))
        return last

    def _crf_step(self, step: Any, input_t: Any, cell_t_prev: Any, transitions: Any,
                  one_segment: Any, scoped: Any) -> Any:
        """One recursion step in ``step``'s net: tile the previous state down the columns
        and the input along the rows, add the transitions, logsumexp each column."""
        d = self.num_classes_padded
        net = step.net
        prev_t = brew.transpose(step, cell_t_prev, [scoped("prev_transpose")], axes=(0, 2, 1))
        prev_tiled = net.Tile(prev_t, [scoped("prev_tiled")], tiles=d, axis=2)
        input_tiled = net.Tile(input_t, [scoped("input_t_tiled")], tiles=d, axis=1)
        summed = net.Add([prev_tiled, input_tiled], [scoped("input_with_prev")])
        with_transitions = net.Add([summed, transitions], [scoped("prev_with_transitions")],
                                   broadcast=1, use_grad_hack=1)
        square, _ = net.Reshape(
            with_transitions,
            [scoped("all_with_transitions_reshaped"), scoped("all_with_transitions_orig")],
            shape=(d, d))
        return net.SortedSegmentRangeLogSumExp([square, one_segment], [scoped("cell_t")])

    # --- decoding ---------------------------------------------------------------------------
    def update_predictions(self, classes: Any) -> Any:
        """``post_crf_classes``: ``classes`` with each row's best score moved to the tag on
        the Viterbi path (a Python op; :func:`crf_update_predictions` does it with ops)."""
        padded = CRFWithLoss.pad_predictions(classes, self.model.param_init_net,
                                             self.model.net, self.num_classes)
        return self.model.net.Python(_viterbi_swap_python_op)(
            [padded, self.transitions], ScopedBlobReference("post_crf_classes"))

    # --- padding ----------------------------------------------------------------------------
    @staticmethod
    def pad_labels(labels: Any, init_net: Any, net: Any, num_classes: int) -> Any:
        """``[BOS] + labels + [EOS]`` as int64."""
        bos = init_net.ConstantFill([], shape=[1], value=num_classes)
        eos = init_net.ConstantFill([], shape=[1], value=num_classes + 1)
        labels = net.Cast([labels], to="int64")
        padded, _ = net.Concat([bos, labels, eos], axis=0, outputs=2)
        return padded

    @staticmethod
    def pad_predictions(predictions: Any, init_net: Any, net: Any, num_classes: int) -> Any:
        """``T x C`` predictions -> ``(T + 2) x (C + 2)``: two LOW_SCORE columns, then a BOS
        row on top and an EOS row at the bottom."""
        bos_row = init_net.GivenTensorFill([], "b_scores", shape=[1, num_classes + 2],
                                           values=_padding_row(num_classes, num_classes))
        eos_row = init_net.GivenTensorFill([], "e_scores", shape=[1, num_classes + 2],
                                           values=_padding_row(num_classes, num_classes + 1))
        zero_index = net.ConstantFill([], shape=[1], value=0)
        length = net.Cast(net.Gather([net.Shape([predictions]), zero_index]), to="int32")
        low_column = net.ExpandDims(
            net.ConstantFill([net.LengthsRangeFill(length)], value=LOW_SCORE), dims=[1])
        widened, _ = net.Concat([predictions, low_column, low_column], outputs=2, axis=1)
        padded, _ = net.Concat([bos_row, widened, eos_row], outputs=2, axis=0)
        return padded


def _viterbi_best_path(scores: np.ndarray, transitions: np.ndarray) -> list[int]:
    trellis = scores[0].astype(np.float64)
    back = np.zeros(scores.shape, np.int64)
    for t in range(1, scores.shape[0]):
        candidates = trellis[:, None] + transitions
        back[t] = np.argmax(candidates, axis=0)
        trellis = scores[t] + candidates.max(axis=0)
    path = [int(np.argmax(trellis))]
    for t in range(scores.shape[0] - 1, 0, -1):
        path.append(int(back[t, path[-1]]))
    return path[::-1]


def _viterbi_swap_python_op(inputs: Any, outputs: Any) -> None:
    """Python-op body of :meth:`CRFWithLoss.update_predictions`: swap each padded row's best
    score with the Viterbi tag's, then drop the BOS/EOS rows and columns."""
    scores = np.array(inputs[0].data)
    path = _viterbi_best_path(scores, np.asarray(inputs[1].data))
    rows = np.arange(scores.shape[0])
    old_best = np.argmax(scores, axis=1)
    swapped = np.array(scores, dtype=np.float64)
    swapped[rows, old_best], swapped[rows, path] = scores[rows, path], scores[rows, old_best]
    result = swapped[1:-1, :-2]
    outputs[0].reshape(result.shape)
    outputs[0].data[...] = result


def apply_crf(init_net: Any, net: Any, transitions: Any, predictions: Any,
              num_classes: int) -> Any:
    """Viterbi-decode ``predictions`` with ops (ViterbiPath, SwapBestPath) and return them
    with each row's best score on the decoded tag, BOS/EOS padding removed."""
    padded = CRFWithLoss.pad_predictions(predictions, init_net, net, num_classes)
    best_path = net.ViterbiPath([padded, transitions])
    swapped = net.SwapBestPath([padded, best_path])
    unpadded = net.RemovePadding([swapped], padding_width=1, end_padding_width=1)
    starts = net.GivenTensorIntFill([], shape=[2], values=np.array([0, 0], np.int32))
    ends = net.GivenTensorIntFill([], shape=[2], values=np.array([-1, -3], np.int32))
    return net.Slice([unpadded, starts, ends])


def crf_update_predictions(model: Any, crf_with_loss: CRFWithLoss, classes: Any) -> Any:
    """:func:`apply_crf` with the CRF layer's transitions, in ``model``'s nets."""
    return apply_crf(model.param_init_net, model.net, crf_with_loss.transitions, classes,
                     crf_with_loss.num_classes)
