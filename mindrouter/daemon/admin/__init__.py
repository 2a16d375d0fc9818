"""The admin API on the Unix socket: changes (api.py) and read-only views of the pool (watch.py, views.py)."""
