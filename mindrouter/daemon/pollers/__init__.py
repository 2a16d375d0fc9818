"""What the daemon learns in the background: backends' probes and breakers, GPU readings."""
