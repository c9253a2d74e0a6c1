"""Caffe2's ``models`` package: the model zoo builders (resnet, shufflenet)."""
