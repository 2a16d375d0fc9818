"""The HTTP edge: the aiohttp app, its middlewares and header hook, auth, and the routes clients call."""
