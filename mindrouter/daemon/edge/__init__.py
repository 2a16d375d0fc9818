"""The HTTP edge: admission, the middlewares and header hook, auth, the routes clients call, and the services bundle."""
