"""A request's lifecycle: admission, quotas, the wait for a slot (dispatcher, lease), its record and usage."""
