"""The final Caffe2 optimizer operators: GFtrl, WngradUpdate, AdadeltaUpdate, StormUpdate, DecayAdagrad and their sparse forms."""
