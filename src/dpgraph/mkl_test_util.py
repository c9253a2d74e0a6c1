"""Caffe2's ``mkl_test_util``: device-option strategies with MKL-DNN.  dpgraph has no
MKL-DNN device (``workspace.C.has_mkldnn`` is False), so ``device_options`` are
hypothesis_test_util's; ``gcs_mkl_only`` exists for tests that skip without MKL-DNN."""

from dpgraph.jobs.hypothesis_test_util import cpu_do, gpu_do, mkl_test_strategies

mkl_do, device_options, gcs, gcs_cpu_only, gcs_gpu_only, gcs_mkl_only, gcs_cpu_mkl = (
    mkl_test_strategies())
device_checker_device_options, gradient_checker_device_option = (
    lambda: gcs["dc"], lambda: gcs["gc"])

__all__ = ["cpu_do", "device_checker_device_options", "device_options", "gcs",
           "gcs_cpu_mkl", "gcs_cpu_only", "gcs_gpu_only", "gcs_mkl_only",
           "gradient_checker_device_option", "gpu_do", "mkl_do"]
