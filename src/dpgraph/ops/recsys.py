"""Recommendation-system data ops: row copies, sample padding, key splits, n-grams, partitions, weighted sampling."""
