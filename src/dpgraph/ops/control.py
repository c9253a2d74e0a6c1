"""Control-flow operators: If, While, Do and their gradients."""
