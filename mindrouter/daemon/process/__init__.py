"""The daemon as a process: one per state directory, its shared app keys, safe log lines."""
