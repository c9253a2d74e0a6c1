"""Persistence operators: Save, Load, Checkpoint."""
