"""Command-line entry points: cruxctl and cruxd."""
