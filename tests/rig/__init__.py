"""Real-kernel rigs for the integration tests: a Clos fabric of network namespaces."""
