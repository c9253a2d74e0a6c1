"""Caffe2's ``control``: execution-step control flow (Do, For, While, If, Switch, ...)."""

from dpgraph.jobs.control import (
    BoolNet,
    CombineConditions,
    Do,
    DoParallel,
    DoUntil,
    DoWhile,
    For,
    GetConditionBlobFromNet,
    If,
    IfNot,
    MergeConditionNets,
    Not,
    NotNet,
    Switch,
    SwitchNot,
    Until,
    While,
)

__all__ = ["BoolNet", "CombineConditions", "Do", "DoParallel", "DoUntil", "DoWhile", "For",
           "GetConditionBlobFromNet", "If", "IfNot", "MergeConditionNets", "Not", "NotNet",
           "Switch", "SwitchNot", "Until", "While"]
