"""Detectron's own operators (UpsampleNearest, SelectSmoothL1Loss, RoIPoolF, PSRoIPool, GroupSpatialSoftmax, SampleAs, ZeroEven)."""
