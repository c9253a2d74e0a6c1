"""Recurrent cell operators: LSTMUnit, GRUUnit and their gradients."""
