"""Caffe2's ``net_printer``: analyze and pretty-print nets, steps, tasks and jobs."""

from dpgraph.jobs.net_printer import (
    Analyzer,
    Printer,
    Text,
    Visitor,
    analyze,
    call,
    commonprefix,
    debug_net,
    factor_prefix,
    format_device_option,
    format_value,
    to_string,
)

__all__ = ["Analyzer", "Printer", "Text", "Visitor", "analyze", "call", "commonprefix",
           "debug_net", "factor_prefix", "format_device_option", "format_value",
           "to_string"]
