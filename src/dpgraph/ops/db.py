"""DB operators: CreateDB, DBExists, TensorProtosDBInput."""
