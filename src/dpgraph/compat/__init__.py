"""Compatibility layers for running unmodified Caffe2 scripts on dpgraph."""
