"""Command-line entry points: cruxctl, cruxd and crux-run."""
