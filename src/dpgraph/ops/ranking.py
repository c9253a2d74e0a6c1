"""Ranking losses and metrics: LambdaRankNdcg, SessionMarginLoss, APMeter."""
