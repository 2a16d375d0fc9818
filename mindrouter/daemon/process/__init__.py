"""The daemon as a process: one per state directory, the app it builds and serves."""
