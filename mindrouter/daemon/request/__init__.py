"""A request's lifecycle: the wait for a slot (dispatcher, lease), failover, its settlement and decision record."""
