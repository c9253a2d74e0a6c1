"""The RecurrentNetwork operator and its gradient."""
