"""Usage accounting: the quotas each request is held to, and the usage each one leaves (counters and rows)."""
