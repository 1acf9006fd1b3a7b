"""cruxd's process shell: configuration, systemd, logging, the event loop."""
