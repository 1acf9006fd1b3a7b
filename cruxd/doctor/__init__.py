"""`cruxctl doctor`: this host's settings against what crux needs (docs/operations.md)."""
