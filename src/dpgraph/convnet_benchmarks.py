"""Caffe2's ``convnet_benchmarks`` module: the convnet benchmark models and their driver."""

from dpgraph.modeling.zoo.convnet_benchmarks import (  # noqa: F401  (Caffe2's module names)
    MLP,
    MODELS,
    VGGA,
    AddParameterUpdate,
    AlexNet,
    Benchmark,
    GetArgumentParser,
    Inception,
    OverFeat,
    _InceptionModule,
    main,
)

__all__ = ["AddParameterUpdate", "AlexNet", "Benchmark", "GetArgumentParser", "Inception", "MLP",
           "OverFeat", "VGGA"]

if __name__ == "__main__":
    main()
