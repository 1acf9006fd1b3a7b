"""Configuration and state files: the low layer every part of cruxd may use.

The TOML model (`model`), its section readers (`reader`, `measure_section`,
`probing_section`), loading with the embedded default (`load`), host:port parsing
(`hostport`) and atomic state files (`statefile`). It imports nothing of the agent, the
leader or the process shell (`cruxd/daemon/`), which all build on it.
"""
