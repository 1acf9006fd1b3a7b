"""Path discovery toward peer hosts: source-port sweeps and hop identification."""
