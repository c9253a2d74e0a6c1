"""Histograms and quantiles: Histogram, SelfBinningHistogram, Quantile."""
