"""crux: GPU-intensity-aware communication scheduling for shared GPU clusters."""

__version__ = "0.1.0"
