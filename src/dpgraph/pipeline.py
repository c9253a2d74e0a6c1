"""Caffe2's ``pipeline``: pipe readers into writers through processors."""

from dpgraph.jobs.pipeline import (
    Output,
    ProcessingReader,
    make_processor,
    normalize_processor_output,
    pipe,
    pipe_and_output,
    processor_name,
)

__all__ = ["Output", "ProcessingReader", "make_processor", "normalize_processor_output",
           "pipe", "pipe_and_output", "processor_name"]
