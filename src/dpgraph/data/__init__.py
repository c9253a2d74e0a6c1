"""Data input: ImageInput's record parsing and image pipeline, decode pools and prefetching,
and the worker threads behind ``data_workers`` and ``parallel_workers``."""
